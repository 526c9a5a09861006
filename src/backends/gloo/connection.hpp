// Connecting a group: the arrival mark, the full mesh of Gloo pairs through per-pair address
// keys in the store, the connection gate, the pair proofs and a closing barrier, all within
// the creation's deadline.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "commgrid/store.hpp"
#include "loop_poke.hpp"

namespace commgrid::gloo_backend {

/// What every communicator of one rank shares: the store it meets others through and the TCP
/// device (one event loop thread per rank).
struct Shared {
  std::shared_ptr<Store> store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::unique_ptr<LoopPoker> poker;  // the device's (declared after it: gone first)
  std::string token;                 // the job's secret, proven to every peer of every new group
};

/// Connects a group's pairs, proves them and ends with a barrier, all by `deadline` (the
/// creation's: the world's covers its size check too); `timeout` is what errors name.
/// Throws TimeoutError naming the ranks (group and global) that did not arrive or connect,
/// AuthenticationError for a stranger on a pair, AbortedError when a member failed.
std::shared_ptr<::gloo::Context> connect_group(Shared& shared, const std::string& prefix, int rank,
                                               const std::vector<int>& global_ranks,
                                               const std::string& op, const std::string& group,
                                               std::chrono::milliseconds timeout,
                                               std::chrono::steady_clock::time_point deadline);

}  // namespace commgrid::gloo_backend
