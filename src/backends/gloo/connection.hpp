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

#include "commgrid/gloo.hpp"
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
  GlooAlgorithm algorithm = GlooAlgorithm::automatic;  // GlooOptions::algorithm
};

/// Sets the timeout of the waits Gloo makes without one (its bcube allreduce's) on a
/// group's context; a view over kept connections has none (its waits end by abort).
void set_wait_timeout(::gloo::Context& ctx, std::chrono::milliseconds timeout);

class PairGateScope;
class PeerProofs;
class RendezvousStore;

/// One group's connection, in the steps connect_group takes one after another and a batch
/// of groups takes each for every group before the next (GlooCommunicator's create_groups):
/// publish() marks this member's arrival and publishes its pairs' addresses (the pairs'
/// listeners gated); connect() waits for the peers' addresses and connects every pair (the
/// pairs in peer order, as Gloo makes them); post_proofs() and wait_proofs() exchange the
/// pair proofs (pair_proofs.hpp); barrier() ends a single creation. Every step by
/// `deadline`; `timeout` is what errors name. Throws TimeoutError naming the ranks (group and
/// global) that did not arrive or connect, AuthenticationError for a stranger on a pair,
/// AbortedError when a member failed.
class GroupConnection {
 public:
  GroupConnection(Shared& shared, std::string prefix, int rank, std::vector<int> global_ranks,
                  std::string op, std::string group, std::chrono::milliseconds timeout,
                  std::chrono::steady_clock::time_point deadline);
  ~GroupConnection();
  GroupConnection(const GroupConnection&) = delete;
  GroupConnection& operator=(const GroupConnection&) = delete;

  void publish();
  /// connect()'s two parts: the wait for the peers' addresses (a store wait), and the
  /// pairs' connections (store reads of what has arrived, and Gloo's connects).
  void await_addresses();
  void connect_pairs();
  void connect();
  void post_proofs();
  void wait_proofs();
  void barrier();
  /// Every step above, for this group alone (connect_group).
  void run_alone();
  [[nodiscard]] const std::shared_ptr<::gloo::Context>& context() const { return ctx_; }
  [[nodiscard]] const std::vector<int>& global_ranks() const { return global_ranks_; }
  [[nodiscard]] const std::string& prefix() const { return prefix_; }

 private:
  template <class F>
  void gated(F&& f);
  Shared& shared_;
  std::string prefix_, op_, group_;
  std::vector<int> global_ranks_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
  std::unique_ptr<RendezvousStore> store_;  // reads global_ranks_
  std::shared_ptr<::gloo::Context> ctx_;
  std::unique_ptr<PairGateScope> gate_;  // from publish() to the end of connect()
  std::unique_ptr<PeerProofs> proofs_;
  bool arrived_ = false;  // every peer's address for this rank was in the store
};

/// A barrier over `ctx` by `deadline` (creation's last step).
void end_with_barrier(const std::shared_ptr<::gloo::Context>& ctx, const std::string& op,
                      const std::string& group, std::chrono::milliseconds timeout,
                      std::chrono::steady_clock::time_point deadline);

/// A GroupConnection's every step for one group: connects its pairs, proves them and ends
/// with a barrier, all by `deadline` (the creation's: the world's covers its size check too).
std::shared_ptr<::gloo::Context> connect_group(Shared& shared, const std::string& prefix, int rank,
                                               const std::vector<int>& global_ranks,
                                               const std::string& op, const std::string& group,
                                               std::chrono::milliseconds timeout,
                                               std::chrono::steady_clock::time_point deadline);

}  // namespace commgrid::gloo_backend
