#include "connection.hpp"

#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <span>

#include "deadline.hpp"
#include "gloo_errors.hpp"
#include "pair_gate.hpp"
#include "pair_proofs.hpp"
#include "store_adapter.hpp"
#include "time_text.hpp"

namespace commgrid::gloo_backend {

using Ms = std::chrono::milliseconds;

std::shared_ptr<::gloo::Context> connect_group(Shared& shared, const std::string& prefix,
                                               int rank, const std::vector<int>& global_ranks,
                                               const std::string& op, const std::string& group,
                                               Ms timeout,
                                               std::chrono::steady_clock::time_point deadline) {
  const int size = static_cast<int>(global_ranks.size());
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  RendezvousStore store(*shared.store, prefix, op, group, global_ranks, timeout, deadline);
  guard(op, group, [&] { shared.store->set(arrival_key(prefix, rank), std::vector<char>{'1'}); });
  try {
    PairGateScope gate(shared.token, prefix, rank, deadline);
    try {
      guard(op, group, [&] { ctx->connectFullMesh(store, shared.device); });
    } catch (const Error&) {
      // A pair whose listener the gate closed to strangers fails: name them.
      const std::vector<std::string> refused = gate.refused();
      if (!refused.empty())
        throw AuthenticationError("gloo " + op + " on " + group + ": " + refused.front() +
                                  (refused.size() > 1 ? " (and " + std::to_string(refused.size() - 1) + " more)" : ""));
      // Peers still unconnected at the deadline (the gate ended this rank's wait for them).
      const std::vector<int> late = gate.late_peers();
      if (late.empty()) throw;
      std::vector<int> late_global;
      for (int p : late) late_global.push_back(global_ranks[static_cast<size_t>(p)]);
      throw TimeoutError("gloo " + op + " on " + group + ": timed out after " + seconds_text(timeout) +
                         " waiting for " + (late.size() == 1 ? "rank " : "ranks ") + join_ints(late) +
                         " (global " + join_ints(late_global) + ") of " + std::to_string(size) +
                         " to connect");
    }
  } catch (const AbortedError& e) {
    // Every member has arrived when Gloo connects, so a refused or reset connection means
    // the peer failed, or a stranger connected to its listener first (the peer then reports
    // that stranger as an unauthenticated peer).
    throw AbortedError(std::string(e.what()) +
                       "; or an unauthenticated peer took the connection (see that rank's "
                       "error)");
  }
  prove_peers(*ctx, shared.token, prefix, rank, op, group, deadline);
  std::string addresses;
  for (int peer = 0; peer < size; ++peer)
    if (peer != rank) addresses += std::to_string(peer) + " " + ctx->getPair(peer)->address().str() + "\n";
  guard(op, group, [&] {
    shared.store->set(address_key(prefix, rank), std::span<const char>(addresses.data(), addresses.size()));
  });
  // A member returns from connectFullMesh once its own side is connected, possibly while a
  // peer is still finishing its handshake; a member that then ended at once (destroying the
  // group) would make that peer fail. A barrier makes creation complete on all members.
  if (size > 1) {
    ::gloo::BarrierOptions opts(ctx);
    opts.setTimeout(std::max(Ms(1), std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now())));
    guard(op, group, [&] { with_deadline(ctx, op, group, timeout, deadline, [&] { ::gloo::barrier(opts); }); });
  }
  return ctx;
}

}  // namespace commgrid::gloo_backend
