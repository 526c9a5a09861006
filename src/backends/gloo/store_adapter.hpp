// The store adapter: Gloo's rendezvous keys kept under a group's prefix in commgrid's Store,
// with the arrival marks that let a timed-out creation name the ranks that did not come.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "commgrid/store.hpp"

namespace commgrid::gloo_backend {

/// The key a member sets when it arrives at a group's creation, before Gloo starts: a
/// timed-out wait names every rank whose mark is missing.
std::string arrival_key(const std::string& prefix, int rank);

/// The key (relative to a group's prefix) under which member `from` publishes the address of
/// its pair for member `to`: one key per ordered pair, so that each member reads only the
/// n-1 entries meant for it (O(n) bytes for a group of n, not every peer's whole list). Gloo
/// names a peer that closed its connection by that address only, so a survivor also looks
/// it up here to name the rank that failed.
std::string pair_key(int from, int to);

/// The address (Gloo's text form, "[127.0.0.1]:41234") in a pair key's value as
/// RendezvousStore::set stored it; "" when it is not a TCP address.
std::string pair_address_text(const std::vector<char>& value);

/// A group's rendezvous through commgrid's Store: the pair keys under the group's prefix, one
/// deadline for the whole rendezvous, and, when a wait times out, TimeoutError naming every rank
/// that has not arrived (its arrival key is missing) rather than a bare key list. Address values
/// carry a gate mark, so that two ends linked with and without the connection gate refuse each
/// other by name.
class RendezvousStore final : public ::gloo::rendezvous::Store {
 public:
  RendezvousStore(commgrid::Store& store, std::string prefix, std::string op, std::string group,
                  const std::vector<int>& global_ranks, std::chrono::milliseconds timeout,
                  std::chrono::steady_clock::time_point deadline);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  /// get() of a key already waited for: one store operation.
  std::vector<char> take(const std::string& key);
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  [[nodiscard]] std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  commgrid::Store& store_;
  std::string prefix_, op_, group_;
  const std::vector<int>& global_ranks_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace commgrid::gloo_backend
