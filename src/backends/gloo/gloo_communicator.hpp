// The Gloo communicator: every Communicator call on Gloo's TCP transport (collectives through
// Gloo's algorithms under one deadline each, point to point through unbound buffers, rooted
// collectives and reduce_scatter as point to point or alltoall reduced here in rank order),
// and groups made by member-only rendezvous through the store (split exchanges colors
// first). Private to the gloo backend; users see it as a Communicator.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "commgrid/communicator.hpp"
#include "connection.hpp"
#include "deadline.hpp"
#include "engine_int.hpp"
#include "gloo_errors.hpp"
#include "p2p_work.hpp"

namespace commgrid::gloo_backend {

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::string name, std::shared_ptr<Shared> shared,
                   std::shared_ptr<::gloo::Context> ctx, std::vector<int> global_ranks,
                   std::string prefix, Ms timeout)
      : Communicator(std::move(name), timeout), shared_(std::move(shared)), ctx_(std::move(ctx)),
        global_ranks_(std::move(global_ranks)), prefix_(std::move(prefix)) {
    set_members({global_ranks_.begin(), global_ranks_.end()});
  }
  std::string_view backend() const noexcept override { return "gloo"; }

  /// Maps the peer address in a Gloo error ("Connection closed by peer
  /// [127.0.0.1]:29891") back to the peer's rank in this group and its global rank, from
  /// the addresses the members recorded at creation; "" when no member's address matches.
  std::string peer_named_in(const std::string& text) const;

  /// guard() for calls on this group's connections: a peer that closed its connection
  /// (it died or exited) is named by its rank, not only by its address.
  template <typename F>
  void call(std::string_view op, F&& fn, const std::string& hint = "") {
    try {
      guard(op, name(), std::forward<F>(fn), hint);
    } catch (const AbortedError& e) {
      const std::string who = peer_named_in(e.what());
      if (who.empty()) throw;
      throw AbortedError(std::string(e.what()) + "; the peer that closed the connection is " + who);
    }
  }

  /// call() for one Gloo collective, the group's collective number `tag`. Gloo applies the
  /// timeout to each of its internal waits; a deadline for the whole operation (timeout()
  /// from now) keeps a collective whose peers progress slowly, step after step, within the
  /// timeout too. When it fails, the ranks that did not arrive are named (census()).
  template <typename F>
  void call_collective(std::string_view op, std::uint32_t tag, F&& fn) {
    try {
      call(op, [&] { with_deadline(ctx_, op, name(), timeout(), std::forward<F>(fn)); });
    } catch (const TimeoutError& e) {
      throw TimeoutError(std::string(e.what()) + census(op, tag, true));
    } catch (const AbortedError&) {
      (void)census(op, tag, false);
      throw;
    }
  }

  /// After collective `tag` failed on this rank: records that this rank reached it (a store
  /// key, written only on failure, so a collective that succeeds costs nothing) and, when
  /// `wait` (this rank's own deadline passed), waits a short grace (a quarter of the timeout,
  /// at most 1 s) for the other ranks' records: a peer that reached the collective also
  /// fails within moments (its deadline, or this rank's closed connections). Returns
  /// "; ranks 2, 5 (global 6, 13) of 8 did not reach this allreduce (collective 17 of tp#0),
  /// or were still inside it 0.25 s after this rank's deadline", or that every rank reached
  /// it (a peer too slow or stuck inside it); "" when not waiting or the store cannot say.
  std::string census(std::string_view op, std::uint32_t tag, bool wait);

  /// This group's Gloo context (for the deadline of a pending Work).
  const std::shared_ptr<::gloo::Context>& context() const noexcept { return ctx_; }

  /// For tests that play a slow peer with Gloo's own algorithms: this group's Gloo context
  /// and the tag of its next collective (taken, as a collective would take it).
  std::pair<std::shared_ptr<::gloo::Context>, std::uint32_t> take_collective_for_testing() {
    return {ctx_, next_tag()};
  }
  Rank rank() const noexcept override { return ctx_->rank; }
  Rank size() const noexcept override { return ctx_->size; }

  /// "peer rank 1 (global 5), tag 7", for messages.
  std::string peer_text(int peer, int tag) const;

 protected:
  void timeout_changed(Ms timeout) override { set_wait_timeout(*ctx_, timeout); }
  std::unique_ptr<Communicator> do_split(std::optional<std::int64_t> color, std::int64_t key,
                                         std::string name) override;
  /// Every group at once: each step of its connection (connection.hpp) for every group
  /// before the next step (addresses published before any is awaited, the proofs of every
  /// group in flight together), then one barrier over this communicator.
  std::vector<std::unique_ptr<Communicator>> do_create_groups(
      std::span<const GroupSpec> groups, const std::function<void(std::size_t)>& created) override;
  std::unique_ptr<Communicator> do_create_group(std::span<const Rank> members,
                                                std::string name) override;
  std::unique_ptr<Communicator> do_create_group_collective(std::span<const Rank> members,
                                                           std::string name) override;
  std::unique_ptr<Work> do_barrier() override;
  std::unique_ptr<Work> do_broadcast(void* buf, std::size_t count, DataType type,
                                     Rank root) override;
  std::unique_ptr<Work> do_allreduce(const void* send, void* recv, std::size_t count, DataType type,
                                     ReduceOp op) override;
  std::unique_ptr<Work> do_allgather(const void* send, void* recv, std::size_t count,
                                     DataType type) override {
    allgather_bytes("allgather", send, recv, bytes(count, type));
    return std::make_unique<Work>();
  }
  std::unique_ptr<Work> do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                          DataType type, ReduceOp op) override;
  std::unique_ptr<Work> do_alltoall(const void* send, void* recv, std::size_t count,
                                    DataType type) override {
    alltoall_bytes("alltoall", send, recv, bytes(count, type));
    return std::make_unique<Work>();
  }
  std::unique_ptr<Work> do_alltoallv(const void* send, std::span<const std::size_t> send_counts,
                                     void* recv, std::span<const std::size_t> recv_counts,
                                     DataType type) override;
  std::unique_ptr<Work> do_allgatherv(const void* send, std::size_t count, void* recv,
                                      std::span<const std::size_t> recv_counts,
                                      DataType type) override;
  std::unique_ptr<Work> do_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                  ReduceOp op, Rank root) override;
  std::unique_ptr<Work> do_gather(const void* send, void* recv, std::size_t count, DataType type,
                                  Rank root) override {
    gather_bytes("gather", send, recv, bytes(count, type), detail::engine_int(root));
    return std::make_unique<Work>();
  }
  std::unique_ptr<Work> do_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                   Rank root) override;
  std::unique_ptr<Work> do_batch_isend_irecv(std::span<const P2POp> batch,
                                             std::string_view op) override;

 private:
  static size_t bytes(size_t count, DataType type) { return count * element_size(type); }

  // Gloo's collectives use slot prefixes 0x01-0x08 in the top byte, their tag in bits 24-55
  // (the tags here are below 2^24: bits 24-47) and a step in bits 0-7; point-to-point uses
  // its own prefix so that a user's tag can never match a collective's message. Bits 8-23
  // and 48-55 of every slot stay zero: a group that is a view over kept connections puts
  // its namespace there (mesh_view.hpp, kNamespaceBits). A user's tag (31 bits) therefore
  // lies in bits 24-46 (its upper 23 bits) and 0-7 (its lower 8).
  static std::uint64_t p2p_slot(int tag) {
    const auto t = static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag));
    return (std::uint64_t{0x40} << 56) | ((t >> 8) << 24) | (t & 0xffu);
  }

  // Collectives run in the same order on every rank of a group, so a counter gives every
  // rank the same tag for the same operation and keeps successive ones apart.
  std::uint32_t next_tag() { return tag_++ & 0xffffffu; }
  static size_t total(std::span<const std::size_t> counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  }

  // Point-to-point slots: a user's tag under prefix 0x40, commgrid's own rooted
  // collectives under 0x41 with the collective counter, so neither can match the other or
  // Gloo's collectives (prefixes 0x01-0x08).
  static std::uint64_t rooted_slot(std::uint32_t tag) {
    return (std::uint64_t{0x41} << 56) | (static_cast<std::uint64_t>(tag & 0xffffffu) << 24);
  }
  PendingP2P post_one(P2POp::Kind kind, void* buf, size_t nbytes, int peer, int tag,
                      std::uint64_t slot, std::string_view op);

  // Waits for internally posted operations (rooted collectives) at once.
  void finish(std::vector<PendingP2P> ops, std::string_view op) {
    GlooP2PWork work(*this, std::string(op), std::move(ops), Clock::now() + timeout(), timeout());
    work.wait();
  }

  // Root receives `block` bytes from every rank into recv (rank order); the others send.
  void gather_bytes(std::string_view op, const void* send, void* recv, size_t block, int root);

  // allreduce of buf in place on every rank (size() > 1).
  void reduce_everywhere(void* buf, size_t count, DataType type, ReduceOp op);

  // Creates the group by `deadline`: split and create_group_collective exchange first, and
  // the whole call is one operation with one deadline.
  std::unique_ptr<Communicator> make_group(const std::vector<int>& members, std::string name,
                                           const std::string& prefix, const std::string& op,
                                           Clock::time_point deadline);
  // The connection of a group of `members` (ranks of this communicator, ascending, this
  // rank among them), not yet started.
  std::unique_ptr<GroupConnection> group_connection(const std::vector<int>& members,
                                                    const std::string& name,
                                                    const std::string& prefix,
                                                    const std::string& op,
                                                    Clock::time_point deadline);
  // Groups of a view over kept connections (mesh_view.hpp): views themselves, named by a
  // namespace their first member picks and publishes under the group's prefix; no
  // connection is made. The caller ends with a barrier, as for connected groups.
  std::vector<std::unique_ptr<Communicator>> view_groups(
      std::span<const GroupSpec> groups, const std::vector<std::string>& prefixes,
      const std::string& op, Clock::time_point deadline,
      const std::function<void(std::size_t)>& created);
  // create_group's key prefix for the next group called `name`: only members create a
  // group, so a per-name count (not a per-communicator sequence) is what every member agrees
  // on; it lets a group be destroyed and created again.
  std::string next_group_prefix(const std::string& name);

  // One Gloo allreduce of count elements of T in place (a native type or float32).
  template <typename T>
  void allreduce_typed(void* buf, size_t count, ReduceOp op);
  void allgather_bytes(std::string_view op, const void* send, void* recv, size_t block);
  void alltoall_bytes(std::string_view op, const void* send, void* recv, size_t block);
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<::gloo::Context> ctx_;
  std::vector<int> global_ranks_;  // world rank of each rank of this group
  std::string prefix_;             // this group's key prefix in the store
  std::uint64_t split_seq_ = 0;
  std::uint64_t collective_seq_ = 0;
  std::map<std::string, int> created_by_name_;
  std::uint32_t tag_ = 1;
  SelfMailbox self_;
};

}  // namespace commgrid::gloo_backend
