// Job claims and rank places (job_claim.hpp).
#include "job_claim.hpp"

#include <unistd.h>

#include <mutex>
#include <string_view>

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
    throw JobConflictError("store " + where + " is in use by job '" + shown(c.id) +
                           "' (this is job '" + o.job_id + "'): give each job its own store");
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

void join_as_rank(Store& store, const StoreOptions& o) {
  if (o.rank < 0) return;
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
