#include "store_adapter.hpp"

#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string_view>

#include "gloo_errors.hpp"
#include "pair_gate.hpp"
#include "time_text.hpp"

namespace commgrid::gloo_backend {
namespace {

using Ms = std::chrono::milliseconds;

// Gloo publishes each pair's address as the raw bytes of a sockaddr_storage and a sequence
// number, copied without clearing the storage's unused tail, so the store would receive
// uninitialised memory. A value made only of such records (IPv4 or IPv6) gets the unused
// bytes zeroed; anything else is passed on untouched. The layout is Gloo's tcp::Address.
std::vector<char> without_padding(std::vector<char> data) {
  constexpr size_t kRecord = sizeof(sockaddr_storage) + sizeof(std::int64_t);
  if (data.empty() || data.size() % kRecord != 0) return data;
  for (size_t at = 0; at < data.size(); at += kRecord) {
    sa_family_t family = 0;
    std::memcpy(&family, data.data() + at + offsetof(sockaddr_storage, ss_family), sizeof(family));
    if (family != AF_INET && family != AF_INET6) return data;
  }
  for (size_t at = 0; at < data.size(); at += kRecord) {
    sa_family_t family = 0;
    std::memcpy(&family, data.data() + at + offsetof(sockaddr_storage, ss_family), sizeof(family));
    // sockaddr_in's sin_zero is padding too.
    const size_t used = family == AF_INET ? offsetof(sockaddr_in, sin_zero) : sizeof(sockaddr_in6);
    std::fill(data.begin() + static_cast<std::ptrdiff_t>(at + used),
              data.begin() + static_cast<std::ptrdiff_t>(at + sizeof(sockaddr_storage)), 0);
  }
  return data;
}

constexpr std::string_view kPairKey = "pair/";

// A pair key's publisher: "pair/<from>/<to>" -> "<from>"; "" for any other key.
std::string address_key_owner(const std::string& key) {
  if (!key.starts_with(kPairKey)) return "";
  const size_t slash = key.find('/', kPairKey.size());
  return slash == std::string::npos ? "" : key.substr(kPairKey.size(), slash - kPairKey.size());
}

bool is_address_key(const std::string& key) { return !address_key_owner(key).empty(); }

char gate_mark() { return pair_gate_available() ? 'g' : 'n'; }

}  // namespace

std::string arrival_key(const std::string& prefix, int rank) {
  return prefix + "/arrived/" + std::to_string(rank);
}

std::string pair_key(int from, int to) {
  return std::string(kPairKey) + std::to_string(from) + "/" + std::to_string(to);
}

std::string pair_address_text(const std::vector<char>& value) {
  constexpr size_t kRecord = sizeof(sockaddr_storage) + sizeof(std::int64_t);
  if (value.size() != kRecord + 1) return "";  // the record and the gate mark
  try {
    return ::gloo::transport::tcp::Address(std::vector<char>(value.begin(), value.end() - 1)).str();
  } catch (const std::exception&) { return ""; }
}

RendezvousStore::RendezvousStore(commgrid::Store& store, std::string prefix, std::string op,
                                 std::string group, const std::vector<int>& global_ranks,
                                 Ms timeout, std::chrono::steady_clock::time_point deadline)
    : store_(store), prefix_(std::move(prefix)), op_(std::move(op)), group_(std::move(group)),
      global_ranks_(global_ranks), timeout_(timeout), deadline_(deadline) {}

void RendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  PairGatePause pause;  // the store's own connections are not Gloo pairs
  std::vector<char> value = without_padding(data);
  if (is_address_key(key)) value.push_back(gate_mark());
  store_.set(full(key), value);
}

std::vector<char> RendezvousStore::get(const std::string& key) {
  wait({key}, timeout_);
  return take(key);
}

std::vector<char> RendezvousStore::take(const std::string& key) {
  PairGatePause pause;
  std::vector<char> value = store_.get(full(key));
  if (!is_address_key(key)) return value;
  // Both ends of a pair must agree on the gate: a gated rank's first bytes are its proof.
  const char theirs = value.empty() ? '?' : value.back();
  if (theirs != gate_mark()) {
    auto says = [](char mark) {
      return mark == 'g'   ? std::string("gates")
             : mark == 'n' ? std::string("does not gate")
                           : std::string("gives no gate state for");
    };
    throw IncompatibleError(
        "gloo", "gloo " + op_ + " on " + group_ + ": rank " + address_key_owner(key) + " " +
                    says(theirs) + " its Gloo connections, this rank " + says(gate_mark()) +
                    " them: link every rank's program with commgrid the same way "
                    "(see docs/security.md)");
  }
  value.pop_back();
  return value;
}

void RendezvousStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void RendezvousStore::wait(const std::vector<std::string>& keys, const Ms& timeout) {
  if (keys.empty()) return;  // a member alone in its group: no request at all
  PairGatePause pause;
  std::vector<std::string> full_keys;
  full_keys.reserve(keys.size());
  for (const auto& k : keys) full_keys.push_back(full(k));
  // Gloo waits for its peers' keys one after another; one deadline for the whole
  // rendezvous keeps the total within the timeout, whatever the number of peers.
  const Ms left =
      std::max(Ms(1), std::chrono::duration_cast<Ms>(deadline_ - std::chrono::steady_clock::now()));
  try {
    if (store_.wait_for(full_keys, std::min(timeout, left)).empty()) return;
  } catch (const AbortedError& e) {
    throw AbortedError("gloo " + op_ + " on " + group_ + ": " + e.what());
  }
  // Name every absent rank, not just the key Gloo happened to wait for first.
  std::vector<int> missing, missing_global;
  for (int r = 0; r < static_cast<int>(global_ranks_.size()); ++r) {
    if (!store_.has(arrival_key(prefix_, r))) {
      missing.push_back(r);
      missing_global.push_back(global_ranks_[static_cast<size_t>(r)]);
    }
  }
  std::string who = missing.empty()
                        ? "keys " + full_keys.front()
                        : std::string(missing.size() == 1 ? "rank " : "ranks ") +
                              join_ints(missing) + " (global " + join_ints(missing_global) + ")";
  throw TimeoutError("gloo " + op_ + " on " + group_ + ": timed out after " +
                     seconds_text(timeout) + " waiting for " + who + " of " +
                     std::to_string(global_ranks_.size()) + " to arrive (store " + store_.uri() +
                     ", keys " + prefix_ + "/*)");
}

}  // namespace commgrid::gloo_backend
