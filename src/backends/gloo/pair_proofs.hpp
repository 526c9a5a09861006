// Pair proofs: both ends of every pair of a new group prove the job's token over it before
// the group is used, so a stranger that won a connection is named, not trusted.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace commgrid::gloo_backend {

/// Whoever connects first to a listening Gloo pair becomes the peer. Before a new group is
/// used, both ends of every pair therefore prove the job's token over it: HMAC-SHA256 of the
/// group's key prefix (unique per job, group and creation) and the two ranks. A stranger that
/// won a connection cannot produce it and is reported as an unauthenticated peer; the wait is
/// bounded by the creation's deadline, not per peer. A slot prefix of its own (0x7f) keeps
/// these messages apart from every collective and point-to-point message.
///
/// In two steps, so that several groups' proofs travel at once: the constructor sends this
/// end's proof on every pair and posts the receives; wait() checks the peers'. Throws
/// AuthenticationError "unauthenticated peer at ADDR (expected rank R)".
class PeerProofs {
 public:
  PeerProofs(::gloo::Context& ctx, std::string token, std::string prefix, std::string op,
             std::string group);
  /// Over the pairs with `peers` only, on slot prefix 0x7f with `generation` in bits 32-55
  /// (kept connections: a pair made anew proves itself on a slot its predecessor never used).
  PeerProofs(::gloo::Context& ctx, std::string token, std::string prefix, std::string op,
             std::string group, const std::vector<int>& peers, std::uint32_t generation);
  void wait(std::chrono::steady_clock::time_point deadline);

 private:
  [[nodiscard]] std::string proof(int from, int to) const;
  ::gloo::Context& ctx_;
  std::string token_, prefix_, op_, group_;
  std::vector<std::string> out_, in_;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> sends_, recvs_;
  std::vector<int> recv_peer_;
};

}  // namespace commgrid::gloo_backend
