#include "connection.hpp"

#include <gloo/barrier.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <utility>

#include "deadline.hpp"
#include "gloo_errors.hpp"
#include "pair_gate.hpp"
#include "pair_proofs.hpp"
#include "store_adapter.hpp"
#include "time_text.hpp"

namespace commgrid::gloo_backend {

using Ms = std::chrono::milliseconds;

namespace {

// A Gloo context whose full mesh is connected through per-pair keys. Gloo's own
// connectFullMesh publishes each member's whole address list under one key and has every
// member read every peer's list to use one entry of it: (n-1)^2 records per member. Here
// member r publishes its pair for peer p under pair_key(r, p) and reads only
// pair_key(p, r): n-1 sets, one wait and n-1 gets of one record each. The pairs are made in
// peer order, as Gloo makes them (the connection gate relies on that order).
class MeshContext final : public ::gloo::Context {
 public:
  MeshContext(int rank, int size) : ::gloo::Context(rank, size) {}

  /// Makes the pairs and publishes their addresses.
  void publish(RendezvousStore& store, std::shared_ptr<::gloo::transport::Device>& dev) {
    closing_pairs_on_failure([&] {
      transport_ = dev->createContext(rank, size);
      transport_->setTimeout(getTimeout());
      for (int peer = 0; peer < size; ++peer)
        if (peer != rank) transport_->createPair(peer);
      for (int peer = 0; peer < size; ++peer) {
        if (peer == rank) continue;
        store.set(pair_key(rank, peer), transport_->getPair(peer)->address().bytes());
      }
    });
    device_ = dev;
  }

  /// Waits for the peers' addresses for this rank (TimeoutError naming the members that did
  /// not arrive).
  void wait(RendezvousStore& store) {
    closing_pairs_on_failure([&] {
      std::vector<std::string> theirs;
      for (int peer = 0; peer < size; ++peer)
        if (peer != rank) theirs.push_back(pair_key(peer, rank));
      store.wait(theirs);
    });
  }

  /// Connects every pair to the address its peer published for this rank.
  void connect(RendezvousStore& store) {
    closing_pairs_on_failure([&] {
      for (int peer = 0; peer < size; ++peer)
        if (peer != rank) transport_->getPair(peer)->connect(store.take(pair_key(peer, rank)));
    });
    transportContext_ = std::move(transport_);
  }

  void set_wait_timeout(std::chrono::milliseconds timeout) {
    setTimeout(timeout);
    if (transportContext_) transportContext_->setTimeout(timeout);
  }

 private:
  // A failure closes every pair (and so its listener) before the exception leaves: the
  // caller's connection gate is still up then. A listener that outlived the gate would let
  // Gloo's event loop accept a stranger queued on it and parse the stranger's bytes (a
  // crafted header aborts the process), as Gloo's own connectFullMesh never allowed: its
  // pairs die with its frame.
  template <class F>
  void closing_pairs_on_failure(F&& f) {
    try {
      f();
    } catch (...) {
      transport_.reset();
      throw;
    }
  }

  std::shared_ptr<::gloo::transport::Context> transport_;
};

}  // namespace

void set_wait_timeout(::gloo::Context& ctx, std::chrono::milliseconds timeout) {
  if (auto* mesh = dynamic_cast<MeshContext*>(&ctx)) mesh->set_wait_timeout(timeout);
}

GroupConnection::GroupConnection(Shared& shared, std::string prefix, int rank,
                                 std::vector<int> global_ranks, std::string op, std::string group,
                                 Ms timeout, std::chrono::steady_clock::time_point deadline)
    : shared_(shared), prefix_(std::move(prefix)), op_(std::move(op)), group_(std::move(group)),
      global_ranks_(std::move(global_ranks)), rank_(rank), timeout_(timeout), deadline_(deadline),
      store_(std::make_unique<RendezvousStore>(*shared_.store, prefix_, op_, group_, global_ranks_,
                                               timeout, deadline)) {
  auto ctx = std::make_shared<MeshContext>(rank, static_cast<int>(global_ranks_.size()));
  ctx->setTimeout(timeout);
  ctx_ = std::move(ctx);
}

GroupConnection::~GroupConnection() = default;

template <class F>
void GroupConnection::gated(F&& f) {
  try {
    try {
      guard(op_, group_, std::forward<F>(f));
    } catch (const Error&) {
      // A pair whose listener the gate closed to strangers fails: name them.
      const std::vector<std::string> refused =
          gate_ ? gate_->refused() : std::vector<std::string>{};
      if (!refused.empty())
        throw AuthenticationError(
            "gloo " + op_ + " on " + group_ + ": " + refused.front() +
            (refused.size() > 1 ? " (and " + std::to_string(refused.size() - 1) + " more)" : ""));
      // Peers still unconnected at the deadline (the gate ended this rank's wait for them).
      // A member that never published its addresses is named by the rendezvous' own error.
      const std::vector<int> late = gate_ ? gate_->late_peers() : std::vector<int>{};
      if (late.empty() || !arrived_) throw;
      std::vector<int> late_global;
      late_global.reserve(late.size());
      for (int p : late) late_global.push_back(global_ranks_[static_cast<size_t>(p)]);
      throw TimeoutError("gloo " + op_ + " on " + group_ + ": timed out after " +
                         seconds_text(timeout_) + " waiting for " +
                         (late.size() == 1 ? "rank " : "ranks ") + join_ints(late) + " (global " +
                         join_ints(late_global) + ") of " + std::to_string(global_ranks_.size()) +
                         " to connect");
    }
  } catch (const AbortedError& e) {
    // Every member has arrived when Gloo connects, so a refused or reset connection means
    // the peer failed, or a stranger connected to its listener first (the peer then reports
    // that stranger as an unauthenticated peer).
    if (!arrived_) throw;
    throw AbortedError(std::string(e.what()) +
                       "; or an unauthenticated peer took the connection (see that rank's "
                       "error)");
  }
}

void GroupConnection::publish() {
  guard(op_, group_,
        [&] { shared_.store->set(arrival_key(prefix_, rank_), std::vector<char>{'1'}); });
  gate_ = std::make_unique<PairGateScope>(shared_.token, prefix_, rank_, deadline_);
  auto& mesh = static_cast<MeshContext&>(*ctx_);
  gated([&] { mesh.publish(*store_, shared_.device); });
  gate_->leave();  // its listeners stay gated; connect() enters it again
}

void GroupConnection::await_addresses() {
  auto& mesh = static_cast<MeshContext&>(*ctx_);
  const PairGateScope::Entered entered(*gate_);
  gated([&] { mesh.wait(*store_); });
  arrived_ = true;  // every peer's address for this rank is in the store
}

void GroupConnection::connect_pairs() {
  auto& mesh = static_cast<MeshContext&>(*ctx_);
  {
    const PairGateScope::Entered entered(*gate_);
    gated([&] { mesh.connect(*store_); });
  }
  gate_.reset();
}

void GroupConnection::connect() {
  await_addresses();
  connect_pairs();
}

void GroupConnection::run_alone() {
  publish();
  connect();
  post_proofs();
  wait_proofs();
  barrier();
}

void GroupConnection::post_proofs() {
  proofs_ = std::make_unique<PeerProofs>(*ctx_, shared_.token, prefix_, op_, group_);
}

void GroupConnection::wait_proofs() { proofs_->wait(deadline_); }

void GroupConnection::barrier() {
  // A member returns from connecting once its own side of each pair is connected, possibly
  // while a peer is still finishing its handshake; a member that then ended at once
  // (destroying the group) would make that peer fail. A barrier makes creation complete on
  // all members.
  end_with_barrier(ctx_, op_, group_, timeout_, deadline_);
}

void end_with_barrier(const std::shared_ptr<::gloo::Context>& ctx, const std::string& op,
                      const std::string& group, Ms timeout,
                      std::chrono::steady_clock::time_point deadline) {
  if (ctx->size <= 1) return;
  ::gloo::BarrierOptions opts(ctx);
  opts.setTimeout(
      std::max(Ms(1), std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now())));
  guard(op, group,
        [&] { with_deadline(ctx, op, group, timeout, deadline, [&] { ::gloo::barrier(opts); }); });
}

std::shared_ptr<::gloo::Context> connect_group(Shared& shared, const std::string& prefix, int rank,
                                               const std::vector<int>& global_ranks,
                                               const std::string& op, const std::string& group,
                                               Ms timeout,
                                               std::chrono::steady_clock::time_point deadline) {
  GroupConnection c(shared, prefix, rank, global_ranks, op, group, timeout, deadline);
  c.run_alone();
  return c.context();
}

}  // namespace commgrid::gloo_backend
