#include "pair_proofs.hpp"

#include <gloo/transport/pair.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "commgrid/store.hpp"
#include "gloo_errors.hpp"

namespace commgrid::gloo_backend {

using Ms = std::chrono::milliseconds;

namespace {
constexpr size_t kProof = 64;  // hex of HMAC-SHA256; an empty token proves as zeros
constexpr std::uint64_t kSlot = std::uint64_t{0x7f} << 56;
}  // namespace

std::string PeerProofs::proof(int from, int to) const {
  std::string p = token_proof(token_, "commgrid pair\n" + prefix_ + "\n" + std::to_string(from) +
                                          "\n" + std::to_string(to));
  p.resize(kProof, '0');
  return p;
}

namespace {
std::vector<int> everyone_but(int rank, int size) {
  std::vector<int> peers;
  for (int peer = 0; peer < size; ++peer)
    if (peer != rank) peers.push_back(peer);
  return peers;
}
}  // namespace

PeerProofs::PeerProofs(::gloo::Context& ctx, std::string token, std::string prefix, std::string op,
                       std::string group)
    : PeerProofs(ctx, std::move(token), std::move(prefix), std::move(op), std::move(group),
                 everyone_but(ctx.rank, ctx.size), 0) {}

PeerProofs::PeerProofs(::gloo::Context& ctx, std::string token, std::string prefix, std::string op,
                       std::string group, const std::vector<int>& peers, std::uint32_t generation)
    : ctx_(ctx), token_(std::move(token)), prefix_(std::move(prefix)), op_(std::move(op)),
      group_(std::move(group)) {
  if (peers.empty()) return;
  const std::uint64_t slot = kSlot | (std::uint64_t{generation & 0xffffffu} << 32);
  out_.resize(static_cast<size_t>(ctx_.size));
  in_.resize(static_cast<size_t>(ctx_.size));
  guard(op_, group_, [&] {
    for (int peer : peers) {
      out_[static_cast<size_t>(peer)] = proof(ctx_.rank, peer);
      in_[static_cast<size_t>(peer)].assign(kProof, '\0');
      sends_.push_back(ctx_.createUnboundBuffer(out_[static_cast<size_t>(peer)].data(), kProof));
      sends_.back()->send(peer, slot);
      recvs_.push_back(ctx_.createUnboundBuffer(in_[static_cast<size_t>(peer)].data(), kProof));
      recvs_.back()->recv(peer, slot);
      recv_peer_.push_back(peer);
    }
  });
}

void PeerProofs::wait(std::chrono::steady_clock::time_point deadline) {
  auto left = [&] {
    return std::max(Ms(1), std::chrono::ceil<Ms>(deadline - std::chrono::steady_clock::now()));
  };
  auto peer_address = [&](int peer) {
    try {
      return ctx_.getPair(peer)->address().str();
    } catch (const std::exception&) { return std::string("rank ") + std::to_string(peer); }
  };
  for (size_t i = 0; i < recvs_.size(); ++i) {
    const int peer = recv_peer_[i];
    bool ok = false;
    try {
      ok = recvs_[i]->waitRecv(left());
    } catch (const std::exception& e) {
      throw AuthenticationError("gloo " + op_ + " on " + group_ + ": unauthenticated peer at " +
                                peer_address(peer) + " (expected rank " + std::to_string(peer) +
                                "): " + strip_gloo_location(e.what()));
    }
    if (!ok || in_[static_cast<size_t>(peer)] != proof(peer, ctx_.rank))
      throw AuthenticationError("gloo " + op_ + " on " + group_ + ": unauthenticated peer at " +
                                peer_address(peer) + " (expected rank " + std::to_string(peer) +
                                "): it did not prove the job's token");
  }
  for (auto& b : sends_) guard(op_, group_, [&] { b->waitSend(left()); });
}

}  // namespace commgrid::gloo_backend
