// Job claims and rank places (job_claim.hpp).
#include "job_claim.hpp"

#include <unistd.h>

#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include "secrets.hpp"
#include "text.hpp"

namespace commgrid::bootstrap {
namespace {

std::string claim_proof(const StoreOptions& o) {
  return token_proof(o.token, "commgrid store claim " + o.job_id);
}

// What this process writes in a rank's place: unique to the process (a fork is another).
std::string process_mark() {
  static std::mutex mutex;
  static pid_t owner = -1;
  static std::string mark;
  std::lock_guard lock(mutex);
  if (owner != ::getpid()) {
    owner = ::getpid();
    mark = "pid " + std::to_string(owner) + " " + random_hex(16);
  }
  return mark;
}

}  // namespace

Claim parse_claim(const std::string& text) {
  Claim c;
  const size_t nl = text.find('\n');
  c.id = text.substr(0, nl);
  std::string second = nl == std::string::npos ? "" : text.substr(nl + 1);
  if (!second.empty() && second.back() == '\n') second.pop_back();
  constexpr std::string_view kSecret = "secret ";
  if (second.starts_with(kSecret)) c.secret = second.substr(kSecret.size());
  else c.proof = second;
  return c;
}

std::string new_claim(const StoreOptions& o) {
  if (o.token.empty()) return o.job_id + "\nsecret " + random_hex(32) + "\n";
  return o.job_id + "\n" + claim_proof(o) + "\n";
}

std::string accept_claim(const std::string& where, const std::string& found,
                         const StoreOptions& o) {
  const Claim c = parse_claim(found);
  if (c.id != o.job_id)
    throw JobConflictError("store " + where + " is in use by job " + quote_untrusted(c.id) +
                           " (this is job '" + o.job_id + "'): give each job its own store");
  if (o.token.empty() && !c.secret.empty()) return c.secret;
  if (!o.token.empty() && c.secret.empty() && c.proof.size() == 64 &&
      same_secret(c.proof, claim_proof(o)))
    return "";
  throw JobConflictError("store " + where + " is in use by another job with the id '" + o.job_id +
                         "' and a different token" +
                         (o.token.empty() ? " (that job has a token, this one none)"
                                          : (c.secret.empty() ? "" : " (that job has none)")) +
                         ": give each job its own store");
}

namespace {

// The run record: "nonce N\nepoch E\n" (N may be empty: the launcher gave none).
constexpr const char* kRunKey = "commgrid-job/run";

std::string run_record(const StoreOptions& o) {
  return "nonce " + o.nonce + "\nepoch " + std::to_string(o.epoch) + "\n";
}

// The nonce and epoch of a run record; nullopt when it is not one.
std::optional<std::pair<std::string, std::string>> parse_run(const std::string& text) {
  constexpr std::string_view kNonce = "nonce ", kEpoch = "\nepoch ";
  const size_t e = text.find(kEpoch);
  if (!text.starts_with(kNonce) || e == std::string::npos || !text.ends_with("\n"))
    return std::nullopt;
  return std::pair{text.substr(kNonce.size(), e - kNonce.size()),
                   text.substr(e + kEpoch.size(), text.size() - e - kEpoch.size() - 1)};
}

// Records this rank's run in the store, or checks it against the run recorded first:
// JobConflictError for a rank of another run (another nonce) or another start (epoch).
void join_run(Store& store, const StoreOptions& o) {
  const std::string mine = run_record(o);
  if (store.set_if_absent(kRunKey, std::span<const char>(mine.data(), mine.size()))) return;
  const std::vector<char> got = store.get(kRunKey);
  const std::string text(got.begin(), got.end());
  if (text == mine) return;
  const auto theirs = parse_run(text);
  const std::string head = "store " + store.uri() + " is in use by another run of job '" +
                           o.job_id + "' (rank " + std::to_string(o.rank) + " refused: ";
  if (!theirs)
    throw JobConflictError(head + "the store's run record " + quote_untrusted(text) +
                           " is not commgrid's)");
  const auto run_text = [](const std::string& nonce) {
    return nonce.empty() ? std::string("none") : quote_untrusted(nonce);
  };
  if (theirs->first != o.nonce)
    throw JobConflictError(
        head + "its run is " + run_text(theirs->first) + ", this rank's " + run_text(o.nonce) +
        "): a second job with the same id on the same store, started while a rank of the first "
        "had not joined yet; give each job its own COMMGRID_JOB_ID or store" +
        (o.token.empty() ? ", and a COMMGRID_TOKEN" : ""));
  throw JobConflictError(head + "the store holds start " + quote_untrusted(theirs->second) +
                         " of the job, this rank is of start " + std::to_string(o.epoch) +
                         " (TORCHELASTIC_RESTART_COUNT)): a restarted job needs a fresh store "
                         "(a new folder, Redis prefix or port)");
}

}  // namespace

void join_as_rank(Store& store, const StoreOptions& o) {
  if (o.rank < 0) return;
  join_run(store, o);  // first: a rank of another run is refused even where its place is free
  const std::string key = "commgrid-job/rank/" + std::to_string(o.rank);
  const std::string mine = process_mark();
  try {
    store.set(key, std::span<const char>(mine.data(), mine.size()));
    return;
  } catch (const BackendError&) {
    if (!store.has(key)) throw;  // not a taken place: the store failed
  }
  const std::vector<char> got = store.get(key);
  if (std::string(got.begin(), got.end()) == mine) return;  // this process, again
  throw JobConflictError(
      "store " + store.uri() + " is in use by another job with the same id '" + o.job_id +
      "': its rank " + std::to_string(o.rank) +
      " has joined the store already (two jobs started with one id on one store, or one "
      "rank started twice): give each job its own COMMGRID_JOB_ID or store" +
      (o.token.empty() ? ", and a COMMGRID_TOKEN" : ""));
}

}  // namespace commgrid::bootstrap
