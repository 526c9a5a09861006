#include "pair_proofs.hpp"

#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "commgrid/store.hpp"
#include "gloo_errors.hpp"

namespace commgrid::gloo_backend {

using Ms = std::chrono::milliseconds;

void prove_peers(::gloo::Context& ctx, const std::string& token, const std::string& prefix,
                 int rank, const std::string& op, const std::string& group,
                 std::chrono::steady_clock::time_point deadline) {
  const int size = ctx.size;
  if (size == 1) return;
  constexpr size_t kProof = 64;  // hex of HMAC-SHA256; an empty token proves as zeros
  auto proof = [&](int from, int to) {
    std::string p = token_proof(token, "commgrid pair\n" + prefix + "\n" + std::to_string(from) +
                                           "\n" + std::to_string(to));
    p.resize(kProof, '0');
    return p;
  };
  const std::uint64_t slot = std::uint64_t{0x7f} << 56;
  std::vector<std::string> out(static_cast<size_t>(size)), in(static_cast<size_t>(size));
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> sends, recvs;
  std::vector<int> recv_peer;
  guard(op, group, [&] {
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      out[static_cast<size_t>(peer)] = proof(rank, peer);
      in[static_cast<size_t>(peer)].assign(kProof, '\0');
      sends.push_back(ctx.createUnboundBuffer(out[static_cast<size_t>(peer)].data(), kProof));
      sends.back()->send(peer, slot);
      recvs.push_back(ctx.createUnboundBuffer(in[static_cast<size_t>(peer)].data(), kProof));
      recvs.back()->recv(peer, slot);
      recv_peer.push_back(peer);
    }
  });
  auto left = [&] {
    return std::max(Ms(1),
                    std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now()));
  };
  auto peer_address = [&](int peer) {
    try {
      return ctx.getPair(peer)->address().str();
    } catch (const std::exception&) { return std::string("rank ") + std::to_string(peer); }
  };
  for (size_t i = 0; i < recvs.size(); ++i) {
    const int peer = recv_peer[i];
    bool ok = false;
    try {
      ok = recvs[i]->waitRecv(left());
    } catch (const std::exception& e) {
      throw AuthenticationError("gloo " + op + " on " + group + ": unauthenticated peer at " +
                                peer_address(peer) + " (expected rank " + std::to_string(peer) +
                                "): " + strip_gloo_location(e.what()));
    }
    if (!ok || in[static_cast<size_t>(peer)] != proof(peer, rank))
      throw AuthenticationError("gloo " + op + " on " + group + ": unauthenticated peer at " +
                                peer_address(peer) + " (expected rank " + std::to_string(peer) +
                                "): it did not prove the job's token");
  }
  for (auto& b : sends) guard(op, group, [&] { b->waitSend(left()); });
}

}  // namespace commgrid::gloo_backend
