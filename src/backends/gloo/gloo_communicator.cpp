// The Gloo backend: every Communicator method on Gloo's TCP transport, groups made by
// member-only rendezvous through a Store.
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>

#include "commgrid/gloo.hpp"
#include "deadline.hpp"
#include "gloo_errors.hpp"
#include "gloo_testing.hpp"
#include "pair_gate.hpp"
#include "reduce_util.hpp"
#include "time_text.hpp"

namespace commgrid {
namespace gloo_backend {
namespace {

using Ms = std::chrono::milliseconds;

// What every communicator of one rank shares: the store it meets others through and the TCP
// device (one event loop thread per rank).
struct Shared {
  std::shared_ptr<Store> store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::string token;  // the job's secret, proven to every peer of every new group
};

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

// Gloo's rendezvous sets and waits on its own per-rank keys (which differ between Gloo
// versions). This adapter puts them under the group's prefix and, when a wait times out,
// reports every rank that has not arrived (its "arrived/<rank>" key, set by connect_group
// before Gloo starts, is missing) rather than Gloo's bare key list.
std::string arrival_key(const std::string& prefix, int rank) {
  return prefix + "/arrived/" + std::to_string(rank);
}

// After connecting, each member records the address it listens on for each peer
// ("<peer> <address>" lines). Gloo names a peer that closed its connection by that address
// only, so a survivor looks it up here to name the rank that failed.
std::string address_key(const std::string& prefix, int rank) {
  return prefix + "/addresses/" + std::to_string(rank);
}

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

class RendezvousStore final : public ::gloo::rendezvous::Store {
 public:
  RendezvousStore(commgrid::Store& store, std::string prefix, std::string op, std::string group,
                  const std::vector<int>& global_ranks, Ms timeout,
                  std::chrono::steady_clock::time_point deadline)
      : store_(store), prefix_(std::move(prefix)), op_(std::move(op)), group_(std::move(group)),
        global_ranks_(global_ranks), timeout_(timeout), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    PairGatePause pause;  // the store's own connections are not Gloo pairs
    std::vector<char> value = without_padding(data);
    if (is_address_key(key)) value.push_back(gate_mark());
    store_.set(full(key), value);
  }
  std::vector<char> get(const std::string& key) override {
    PairGatePause pause;
    wait({key}, timeout_);
    std::vector<char> value = store_.get(full(key));
    if (!is_address_key(key)) return value;
    // Both ends of a pair must agree on the gate: a gated rank's first bytes are its proof.
    const char theirs = value.empty() ? '?' : value.back();
    if (theirs != gate_mark()) {
      auto says = [](char mark) {
        return mark == 'g' ? std::string("gates") : mark == 'n' ? std::string("does not gate") : std::string("gives no gate state for");
      };
      throw IncompatibleError("gloo", "gloo " + op_ + " on " + group_ + ": rank " + key + " " + says(theirs) +
                                          " its Gloo connections, this rank " + says(gate_mark()) +
                                          " them: link every rank's program with commgrid the same way "
                                          "(see docs/security.md)");
    }
    value.pop_back();
    return value;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Ms& timeout) override {
    PairGatePause pause;
    std::vector<std::string> full_keys;
    for (const auto& k : keys) full_keys.push_back(full(k));
    // Gloo waits for its peers' keys one after another; one deadline for the whole
    // rendezvous keeps the total within the timeout, whatever the number of peers.
    const Ms left = std::max(Ms(1), std::chrono::duration_cast<Ms>(
                                        deadline_ - std::chrono::steady_clock::now()));
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
                                join_ints(missing) + " (global " + join_ints(missing_global) +
                                ")";
    throw TimeoutError("gloo " + op_ + " on " + group_ + ": timed out after " +
                       seconds_text(timeout) + " waiting for " + who + " of " +
                       std::to_string(global_ranks_.size()) + " to arrive (store " +
                       store_.uri() + ", keys " + prefix_ + "/*)");
  }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  // Gloo publishes a rank's pair addresses under its bare rank number.
  static bool is_address_key(const std::string& key) {
    return !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
  }
  static char gate_mark() { return pair_gate_available() ? 'g' : 'n'; }
  commgrid::Store& store_;
  std::string prefix_, op_, group_;
  const std::vector<int>& global_ranks_;
  Ms timeout_;
  std::chrono::steady_clock::time_point deadline_;
};

// Whoever connects first to a listening Gloo pair becomes the peer. Before a new group is
// used, both ends of every pair therefore prove the job's token over it: HMAC-SHA256 of the
// group's key prefix (unique per job, group and creation) and the two ranks. A stranger that
// won a connection cannot produce it and is reported as an unauthenticated peer; the wait is
// bounded by the creation's deadline, not per peer. A slot prefix of its own (0x7f) keeps
// these messages apart from every collective and point-to-point message.
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
    return std::max(Ms(1), std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now()));
  };
  auto peer_address = [&](int peer) {
    try {
      return ctx.getPair(peer)->address().str();
    } catch (const std::exception&) {
      return std::string("rank ") + std::to_string(peer);
    }
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

// Connects a group's pairs, proves them and ends with a barrier, all by `deadline` (the
// creation's: the world's covers its size check too); `timeout` is what errors name.
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

// ---- reductions ---------------------------------------------------------------------

template <typename T>
void reduce_into(T* out, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] + b[i]);
      break;
    case ReduceOp::prod:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] * b[i]);
      break;
    case ReduceOp::max:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      break;
    case ReduceOp::min:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      break;
    case ReduceOp::avg:  // runs as sum; the caller divides (detail::engine_op)
      COMMGRID_ENFORCE(false, "avg reaches the elementwise reduction");
  }
}

// Integer sums and products wrap like the hardware (two's complement) rather than being
// undefined behaviour: compute them on the unsigned type.
template <typename T>
void reduce_block(T* out, const T* a, const T* b, size_t n, ReduceOp op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    if (op == ReduceOp::sum || op == ReduceOp::prod) {
      for (size_t i = 0; i < n; ++i) {
        U x = static_cast<U>(a[i]), y = static_cast<U>(b[i]);
        out[i] = static_cast<T>(op == ReduceOp::sum ? static_cast<U>(x + y)
                                                    : static_cast<U>(x * y));
      }
      return;
    }
  }
  reduce_into(out, a, b, n, op);
}

template <typename T>
::gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  return [op](void* c, const void* a, const void* b, size_t n) {
    reduce_block(static_cast<T*>(c), static_cast<const T*>(a), static_cast<const T*>(b), n, op);
  };
}

// ---- point to point -----------------------------------------------------------------

using Clock = std::chrono::steady_clock;

// Gloo has no connection from a rank to itself, so messages a rank sends to itself are
// matched here: per slot, in posting order, like any other pair's messages.
struct SelfMessage {
  void* buf = nullptr;
  size_t bytes = 0;
  bool done = false;
};

class SelfMailbox {
 public:
  /// Posts a send (or receive) to this rank; when a receive (send) with the same slot is
  /// already waiting, copies the data and completes both.
  std::shared_ptr<SelfMessage> post(bool is_send, std::uint64_t slot, void* buf, size_t bytes,
                                    const std::string& where) {
    auto msg = std::make_shared<SelfMessage>(SelfMessage{buf, bytes, false});
    auto& waiting = is_send ? recvs_[slot] : sends_[slot];
    if (waiting.empty()) {
      (is_send ? sends_[slot] : recvs_[slot]).push_back(msg);
      return msg;
    }
    std::shared_ptr<SelfMessage> other = waiting.front();
    waiting.pop_front();
    SelfMessage& send = is_send ? *msg : *other;
    SelfMessage& recv = is_send ? *other : *msg;
    if (send.bytes != recv.bytes)
      throw InvalidValueError("count", where + ": a message to this rank itself carries " +
                                           std::to_string(send.bytes) +
                                           " bytes, its receive expects " +
                                           std::to_string(recv.bytes));
    if (send.bytes > 0) std::memcpy(recv.buf, send.buf, send.bytes);
    send.done = recv.done = true;
    return msg;
  }

 private:
  std::map<std::uint64_t, std::deque<std::shared_ptr<SelfMessage>>> sends_, recvs_;
};

// One posted point-to-point operation: on a Gloo pair (ub), to this rank itself (self), or
// empty (nothing travels: both sides know the count is 0).
struct PendingP2P {
  P2POp::Kind kind = P2POp::Kind::send;
  int peer = 0;
  int tag = 0;
  std::unique_ptr<::gloo::transport::UnboundBuffer> ub;
  std::shared_ptr<SelfMessage> self;
  bool done = false;
};

class GlooCommunicator;

// The Work of isend, irecv and batch_isend_irecv (and of the rooted collectives): waits for
// every operation against one deadline, `timeout` from when they were posted.
class GlooP2PWork final : public Work {
 public:
  GlooP2PWork(GlooCommunicator& comm, std::string op, std::vector<PendingP2P> ops,
              Clock::time_point deadline, Ms timeout)
      : comm_(comm), op_(std::move(op)), ops_(std::move(ops)), deadline_(deadline),
        timeout_(timeout) {}
  ~GlooP2PWork() override {
    if (waited_) return;
    try {
      wait();
    } catch (...) {
      // A destructor cannot report; wait() is where errors are seen.
    }
  }
  void wait() override;
  bool done() const override;

 private:
  GlooCommunicator& comm_;
  std::string op_;
  mutable std::vector<PendingP2P> ops_;
  Clock::time_point deadline_;
  Ms timeout_;
  bool waited_ = false;
};

// ---- the communicator ---------------------------------------------------------------

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::string name, std::shared_ptr<Shared> shared,
                   std::shared_ptr<::gloo::Context> ctx, std::vector<int> global_ranks,
                   std::string prefix, Ms timeout)
      : Communicator(std::move(name), timeout), shared_(std::move(shared)),
        ctx_(std::move(ctx)), global_ranks_(std::move(global_ranks)),
        prefix_(std::move(prefix)) {
    set_members({global_ranks_.begin(), global_ranks_.end()});
  }

  std::string_view backend() const noexcept override { return "gloo"; }

  /// Maps the peer address in a Gloo error ("Connection closed by peer
  /// [127.0.0.1]:29891") back to the peer's rank in this group and its global rank, from
  /// the addresses the members recorded at creation; "" when no member's address matches.
  std::string peer_named_in(const std::string& text) const {
    const std::string me = std::to_string(rank()) + " ";
    for (int i = 0; i < size(); ++i) {
      if (i == rank()) continue;
      try {
        const std::string key = address_key(prefix_, i);
        if (!shared_->store->has(key)) continue;
        const std::vector<char> raw = shared_->store->get(key);
        std::istringstream lines(std::string(raw.begin(), raw.end()));
        for (std::string line; std::getline(lines, line);) {
          if (line.rfind(me, 0) != 0) continue;
          const std::string address = line.substr(me.size());
          if (!address.empty() && text.find(address) != std::string::npos)
            return "rank " + std::to_string(i) + " of " + name() + " (global rank " +
                   std::to_string(global_ranks_[static_cast<size_t>(i)]) + ")";
        }
      } catch (const Error&) {
        // The store itself may be failing too; the error stands without the name.
      }
    }
    // Gloo occasionally reports another address of the peer (about 1 run in 60 here);
    // in a group of two the peer is known all the same.
    if (size() == 2) {
      const int other = 1 - rank();
      return "rank " + std::to_string(other) + " of " + name() + " (global rank " +
             std::to_string(global_ranks_[static_cast<size_t>(other)]) + ")";
    }
    return "";
  }

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

  /// call() for one Gloo collective. Gloo applies the timeout to each of its internal waits;
  /// a deadline for the whole operation (timeout() from now) keeps a collective whose peers
  /// progress slowly, step after step, within the timeout too.
  template <typename F>
  void call_collective(std::string_view op, F&& fn) {
    call(op, [&] { with_deadline(ctx_, op, name(), timeout(), std::forward<F>(fn)); });
  }

  /// This group's Gloo context (for the deadline of a pending Work).
  const std::shared_ptr<::gloo::Context>& context() const noexcept { return ctx_; }

  /// For tests that play a slow peer with Gloo's own algorithms: this group's Gloo context
  /// and the tag of its next collective (taken, as a collective would take it).
  std::pair<std::shared_ptr<::gloo::Context>, std::uint32_t> take_collective_for_testing() {
    return {ctx_, next_tag()};
  }
  COMMGRID_USING_TYPED_OVERLOADS;
  int rank() const noexcept override { return ctx_->rank; }
  int size() const noexcept override { return ctx_->size; }

  std::unique_ptr<Communicator> split(std::optional<std::int64_t> color, std::int64_t key,
                                      std::string name) override {
    count_creation();
    const auto deadline = Clock::now() + timeout();  // the exchange's and the creation's
    const auto n = static_cast<size_t>(size());
    std::array<std::int64_t, 3> mine{color ? 1 : 0, color.value_or(0), key};
    std::vector<std::int64_t> all(3 * n);
    allgather_bytes("split", mine.data(), all.data(), sizeof(mine));
    // Every rank of this group calls split in the same order, so the sequence number
    // names this split identically everywhere; the color keeps groups apart.
    const std::uint64_t seq = split_seq_++;
    if (!color) return nullptr;
    std::vector<int> members;
    for (size_t r = 0; r < n; ++r)
      if (all[3 * r] == 1 && all[3 * r + 1] == *color) members.push_back(static_cast<int>(r));
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[3 * static_cast<size_t>(a) + 2] < all[3 * static_cast<size_t>(b) + 2];
    });
    return make_group(members, std::move(name),
                      prefix_ + "/split" + std::to_string(seq) + "/c" + std::to_string(*color),
                      "split", deadline);
  }

  std::unique_ptr<Communicator> create_group(std::span<const int> members,
                                             std::string name) override {
    check_members("create_group", members, name, true);
    count_creation();
    // Only members call this, so a per-name count (not a per-communicator sequence) is what
    // every member agrees on; it lets a group be destroyed and created again.
    const int generation = created_by_name_[name]++;
    return make_group({members.begin(), members.end()}, name,
                      prefix_ + "/group/" + name + "/" + std::to_string(generation),
                      "create_group", Clock::now() + timeout());
  }

  std::unique_ptr<Communicator> create_group_collective(std::span<const int> members,
                                                        std::string name) override {
    check_members("create_group_collective", members, name, false);
    count_creation();
    const auto deadline = Clock::now() + timeout();  // the exchange's and the creation's
    // Every rank of this group takes part: exchanging a fingerprint of (members, name) both
    // waits for everyone (new_group's collective semantics) and catches ranks that passed
    // different arguments, which would otherwise wait for each other until the timeout.
    std::uint64_t fp = std::hash<std::string>{}(name);
    for (int m : members) fp = fp * 1000003u + static_cast<std::uint64_t>(m) + 1;
    std::vector<std::uint64_t> all(static_cast<size_t>(size()));
    allgather_bytes("create_group_collective", &fp, all.data(), sizeof(fp));
    std::vector<int> differ;
    for (int r = 0; r < size(); ++r)
      if (all[static_cast<size_t>(r)] != all[0]) differ.push_back(r);
    if (!differ.empty())
      throw BackendError("gloo create_group_collective on " + this->name() + " for " + name +
                         ": ranks " + join_ints(differ) +
                         " passed different members or name than rank 0");
    const std::uint64_t seq = collective_seq_++;
    if (!std::binary_search(members.begin(), members.end(), rank())) return nullptr;
    return make_group({members.begin(), members.end()}, name,
                      prefix_ + "/collective" + std::to_string(seq), "create_group_collective",
                      deadline);
  }

  std::unique_ptr<Work> barrier() override {
    if (size() > 1) {
      ::gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      call_collective("barrier", [&] { ::gloo::barrier(opts); });
    }
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> broadcast(void* buf, std::size_t count, DataType type,
                                  int root) override {
    check_rank("broadcast", "root", root);
    check_buffer("broadcast", buf, count);
    if (size() > 1 && count > 0) {
      ::gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<std::uint8_t*>(buf), bytes(count, type));
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      call_collective("broadcast", [&] { ::gloo::broadcast(opts); });
    }
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> allreduce(const void* send, void* recv, std::size_t count,
                                  DataType type, ReduceOp op) override {
    check_buffer("allreduce", send, count);
    check_buffer("allreduce", recv, count);
    if (count == 0) return std::make_unique<Work>();
    if (send != recv) std::memmove(recv, send, bytes(count, type));
    if (size() > 1) reduce_everywhere(recv, count, type, op);
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> allgather(const void* send, void* recv, std::size_t count,
                                  DataType type) override {
    check_buffer("allgather", send, count);
    check_buffer("allgather", recv, count);
    allgather_bytes("allgather", send, recv, bytes(count, type));
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t count,
                                       DataType type, ReduceOp op) override {
    check_buffer("reduce_scatter", send, count);
    check_buffer("reduce_scatter", recv, count);
    if (count == 0) return std::make_unique<Work>();
    const auto n = static_cast<size_t>(size());
    const size_t block = bytes(count, type);
    // An alltoall brings block rank() of every rank here; reducing them locally in rank
    // order makes the result deterministic and costs the same traffic as a ring.
    std::vector<std::uint8_t> gathered(n * block);
    alltoall_bytes("reduce_scatter", send, gathered.data(), block);
    reduce_gathered(gathered.data(), recv, count, type, op);
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> alltoall(const void* send, void* recv, std::size_t count,
                                 DataType type) override {
    check_buffer("alltoall", send, count);
    check_buffer("alltoall", recv, count);
    if (send == recv && count > 0 && size() > 1)
      throw ConfigError("buffer", "gloo alltoall on " + name() +
                                      ": send and recv must be different buffers");
    alltoall_bytes("alltoall", send, recv, bytes(count, type));
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> alltoallv(const void* send, std::span<const std::size_t> send_counts,
                                  void* recv, std::span<const std::size_t> recv_counts,
                                  DataType type) override {
    check_counts_list("alltoallv", "send_counts", send_counts);
    check_counts_list("alltoallv", "recv_counts", recv_counts);
    const size_t send_total = total(send_counts), recv_total = total(recv_counts);
    check_buffer("alltoallv", send, send_total);
    check_buffer("alltoallv", recv, recv_total);
    if (send == recv && send_total + recv_total > 0 && size() > 1)
      throw ConfigError("buffer", "gloo alltoallv on " + name() +
                                      ": send and recv must be different buffers");
    const size_t es = element_size(type);
    if (size() == 1) {
      check_self_count("alltoallv", send_counts[0], recv_counts[0]);
      if (send_total > 0) std::memmove(recv, send, send_total * es);
      return std::make_unique<Work>();
    }
    std::vector<std::int64_t> in(send_counts.begin(), send_counts.end());
    std::vector<std::int64_t> out(recv_counts.begin(), recv_counts.end());
    for (auto& c : in) c *= static_cast<std::int64_t>(es);
    for (auto& c : out) c *= static_cast<std::int64_t>(es);
    // Gloo wants a pointer even where a rank sends or receives nothing.
    std::uint8_t dummy_in = 0, dummy_out = 0;
    ::gloo::AlltoallvOptions opts(ctx_);
    opts.setInput(send_total > 0 ? static_cast<std::uint8_t*>(const_cast<void*>(send)) : &dummy_in, in);
    opts.setOutput(recv_total > 0 ? static_cast<std::uint8_t*>(recv) : &dummy_out, out);
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    call_collective("alltoallv", [&] { ::gloo::alltoallv(opts); });
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> allgatherv(const void* send, std::size_t count, void* recv,
                                   std::span<const std::size_t> recv_counts,
                                   DataType type) override {
    check_counts_list("allgatherv", "recv_counts", recv_counts);
    check_self_count("allgatherv", count, recv_counts[static_cast<size_t>(rank())]);
    const size_t recv_total = total(recv_counts);
    check_buffer("allgatherv", send, count);
    check_buffer("allgatherv", recv, recv_total);
    if (recv_total == 0) return std::make_unique<Work>();
    const size_t es = element_size(type);
    if (size() == 1) {
      std::memmove(recv, send, count * es);
      return std::make_unique<Work>();
    }
    std::vector<size_t> elements(recv_counts.begin(), recv_counts.end());
    for (auto& c : elements) c *= es;
    std::uint8_t dummy = 0;
    ::gloo::AllgathervOptions opts(ctx_);
    opts.setInput(count > 0 ? static_cast<std::uint8_t*>(const_cast<void*>(send)) : &dummy, count * es);
    opts.setOutput(static_cast<std::uint8_t*>(recv), elements);
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    call_collective("allgatherv", [&] { ::gloo::allgatherv(opts); });
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> reduce(const void* send, void* recv, std::size_t count, DataType type,
                               ReduceOp op, int root) override {
    check_rank("reduce", "root", root);
    check_buffer("reduce", send, count);
    if (rank() == root) check_buffer("reduce", recv, count);
    if (count == 0) return std::make_unique<Work>();
    // Root gathers every rank's input and reduces in rank order, as reduce_scatter does:
    // deterministic, and the same bits whatever the group's size.
    const size_t block = bytes(count, type);
    std::vector<std::uint8_t> gathered(rank() == root ? block * static_cast<size_t>(size()) : 0);
    gather_bytes("reduce", send, gathered.data(), block, root);
    if (rank() == root) reduce_gathered(gathered.data(), recv, count, type, op);
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> gather(const void* send, void* recv, std::size_t count, DataType type,
                               int root) override {
    check_rank("gather", "root", root);
    check_buffer("gather", send, count);
    if (rank() == root) check_buffer("gather", recv, count);
    gather_bytes("gather", send, recv, bytes(count, type), root);
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> scatter(const void* send, void* recv, std::size_t count, DataType type,
                                int root) override {
    check_rank("scatter", "root", root);
    if (rank() == root) check_buffer("scatter", send, count);
    check_buffer("scatter", recv, count);
    const size_t block = bytes(count, type);
    const std::uint64_t slot = rooted_slot(next_tag());
    if (block == 0) return std::make_unique<Work>();
    std::vector<PendingP2P> ops;
    if (rank() == root) {
      const auto* base = static_cast<const std::uint8_t*>(send);
      std::memmove(recv, base + static_cast<size_t>(root) * block, block);
      for (int r = 0; r < size(); ++r)
        if (r != root)
          ops.push_back(post_one(P2POp::Kind::send, const_cast<std::uint8_t*>(base) + static_cast<size_t>(r) * block,
                                 block, r, 0, slot, "scatter"));
    } else {
      ops.push_back(post_one(P2POp::Kind::recv, recv, block, root, 0, slot, "scatter"));
    }
    finish(std::move(ops), "scatter");
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> send(const void* buf, std::size_t count, DataType type, int peer,
                             int tag) override {
    check_blocking_peer("send", peer);
    auto work = isend(buf, count, type, peer, tag);
    work->wait();
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> recv(void* buf, std::size_t count, DataType type, int peer,
                             int tag) override {
    check_blocking_peer("recv", peer);
    auto work = irecv(buf, count, type, peer, tag);
    work->wait();
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> isend(const void* buf, std::size_t count, DataType type, int peer,
                              int tag) override {
    const P2POp op = P2POp::send(buf, count, type, peer, tag);
    return post_batch(std::span<const P2POp>(&op, 1), "isend");
  }

  std::unique_ptr<Work> irecv(void* buf, std::size_t count, DataType type, int peer,
                              int tag) override {
    const P2POp op = P2POp::recv(buf, count, type, peer, tag);
    return post_batch(std::span<const P2POp>(&op, 1), "irecv");
  }

  std::unique_ptr<Work> batch_isend_irecv(std::span<const P2POp> ops) override {
    return post_batch(ops, "batch_isend_irecv");
  }

  /// "peer rank 1 (global 5), tag 7", for messages.
  std::string peer_text(int peer, int tag) const {
    return "peer rank " + std::to_string(peer) + " (global " +
           std::to_string(global_ranks_[static_cast<size_t>(peer)]) + "), tag " +
           std::to_string(tag);
  }

 private:
  static size_t bytes(size_t count, DataType type) { return count * element_size(type); }

  // Gloo's collectives use slot prefixes 0x01-0x08 in the top byte; point-to-point uses its
  // own prefix so that a user's tag can never match a collective's message.
  static std::uint64_t p2p_slot(int tag) {
    return (std::uint64_t{0x40} << 56) | (static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag)) << 24);
  }

  // Collectives run in the same order on every rank of a group, so a counter gives every
  // rank the same tag for the same operation and keeps successive ones apart.
  std::uint32_t next_tag() { return tag_++ & 0xffffffu; }

  void check_rank(std::string_view op, const char* what, int r) const {
    if (r < 0 || r >= size())
      throw RankOutOfRangeError(what, "gloo " + std::string(op) + " on " + name() + ": " + what +
                                          " " + std::to_string(r) + " is not in [0, " +
                                          std::to_string(size()) + ")");
  }

  void check_peer(std::string_view op, int peer, int tag) const {
    check_rank(op, "peer", peer);
    if (tag < 0)
      throw InvalidValueError("tag", "gloo " + std::string(op) + " on " + name() +
                                         ": tag must be >= 0, got " + std::to_string(tag));
  }

  // A blocking send or receive to this rank itself could never be matched.
  void check_blocking_peer(std::string_view op, int peer) const {
    if (peer == rank())
      throw ConfigError("peer", "gloo " + std::string(op) + " on " + name() +
                                    ": peer is this rank (" + std::to_string(peer) +
                                    "); a blocking " + std::string(op) +
                                    " to itself would deadlock: use isend/irecv or "
                                    "batch_isend_irecv");
  }

  void check_counts_list(std::string_view op, const char* what,
                         std::span<const std::size_t> counts) const {
    if (counts.size() != static_cast<size_t>(size()))
      throw InvalidValueError(what, "gloo " + std::string(op) + " on " + name() + ": " + what +
                                        " has " + std::to_string(counts.size()) +
                                        " entries, needs one per rank (" +
                                        std::to_string(size()) + ")");
  }

  void check_self_count(std::string_view op, size_t mine, size_t listed) const {
    if (mine != listed)
      throw InvalidValueError("count", "gloo " + std::string(op) + " on " + name() + ": rank " +
                                           std::to_string(rank()) + " sends " +
                                           std::to_string(mine) + " elements to itself but " +
                                           "expects " + std::to_string(listed));
  }

  static size_t total(std::span<const std::size_t> counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  }

  // Point-to-point slots: a user's tag under prefix 0x40, commgrid's own rooted
  // collectives under 0x41 with the collective counter, so neither can match the other or
  // Gloo's collectives (prefixes 0x01-0x08).
  static std::uint64_t rooted_slot(std::uint32_t tag) {
    return (std::uint64_t{0x41} << 56) | (static_cast<std::uint64_t>(tag) << 24);
  }

  PendingP2P post_one(P2POp::Kind kind, void* buf, size_t nbytes, int peer, int tag,
                      std::uint64_t slot, std::string_view op) {
    PendingP2P p;
    p.kind = kind;
    p.peer = peer;
    p.tag = tag;
    if (nbytes == 0) {
      p.done = true;
    } else if (peer == rank()) {
      p.self = self_.post(kind == P2POp::Kind::send, slot, buf, nbytes,
                          "gloo " + std::string(op) + " on " + name());
    } else {
      call(op, [&] {
        p.ub = ctx_->createUnboundBuffer(buf, nbytes);
        if (kind == P2POp::Kind::send)
          p.ub->send(peer, slot);
        else
          p.ub->recv(peer, slot);
      }, peer_text(peer, tag));
    }
    return p;
  }

  std::unique_ptr<Work> post_batch(std::span<const P2POp> batch, std::string_view op) {
    const std::string where(op);
    for (const P2POp& o : batch) {
      check_peer(op, o.peer, o.tag);
      check_buffer(op, o.buf, o.count);
    }
    const auto deadline = Clock::now() + timeout();
    std::vector<PendingP2P> ops;
    ops.reserve(batch.size());
    for (const P2POp& o : batch)
      ops.push_back(post_one(o.kind, o.buf, bytes(o.count, o.type), o.peer, o.tag, p2p_slot(o.tag), op));
    return std::make_unique<GlooP2PWork>(*this, where, std::move(ops), deadline, timeout());
  }

  // Waits for internally posted operations (rooted collectives) at once.
  void finish(std::vector<PendingP2P> ops, std::string_view op) {
    GlooP2PWork work(*this, std::string(op), std::move(ops), Clock::now() + timeout(), timeout());
    work.wait();
  }

  // Root receives `block` bytes from every rank into recv (rank order); the others send.
  void gather_bytes(std::string_view op, const void* send, void* recv, size_t block, int root) {
    const std::uint64_t slot = rooted_slot(next_tag());
    if (block == 0) return;
    std::vector<PendingP2P> ops;
    if (rank() == root) {
      auto* base = static_cast<std::uint8_t*>(recv);
      std::memmove(base + static_cast<size_t>(root) * block, send, block);
      for (int r = 0; r < size(); ++r)
        if (r != root)
          ops.push_back(post_one(P2POp::Kind::recv, base + static_cast<size_t>(r) * block, block, r, 0, slot, op));
    } else {
      ops.push_back(post_one(P2POp::Kind::send, const_cast<void*>(send), block, root, 0, slot, op));
    }
    finish(std::move(ops), op);
  }

  // Reduces size() blocks of count elements (rank order) into out; avg divides at the end.
  void reduce_gathered(const std::uint8_t* gathered, void* out, size_t count, DataType type,
                       ReduceOp op) {
    const auto n = static_cast<size_t>(size());
    const ReduceOp eop = detail::engine_op(op);
    if (detail::is_half(type)) {
      std::vector<float> acc = detail::widen_half(gathered, count, type);
      for (size_t r = 1; r < n; ++r) {
        std::vector<float> next = detail::widen_half(gathered + r * count * 2, count, type);
        reduce_block(acc.data(), acc.data(), next.data(), count, eop);
      }
      if (op == ReduceOp::avg)
        for (float& v : acc) v /= static_cast<float>(n);
      detail::narrow_half(acc.data(), out, count, type);
      return;
    }
    detail::dispatch_native(type, [&](auto zero) {
      using T = decltype(zero);
      const auto* in = reinterpret_cast<const T*>(gathered);
      auto* o = static_cast<T*>(out);
      std::copy(in, in + count, o);
      for (size_t r = 1; r < n; ++r) reduce_block(o, o, in + r * count, count, eop);
    });
    if (op == ReduceOp::avg) detail::divide_by(out, count, type, size());
  }

  // allreduce of buf in place on every rank (size() > 1).
  void reduce_everywhere(void* buf, size_t count, DataType type, ReduceOp op) {
    const ReduceOp eop = detail::engine_op(op);
    if (detail::is_half(type)) {
      // Reduced in float32 and rounded once at the end, so every rank gets the same bits
      // and the result does not depend on the ring's order of partial roundings.
      std::vector<float> wide = detail::widen_half(buf, count, type);
      allreduce_typed<float>(wide.data(), count, eop);
      if (op == ReduceOp::avg)
        for (float& v : wide) v /= static_cast<float>(size());
      detail::narrow_half(wide.data(), buf, count, type);
      return;
    }
    detail::dispatch_native(type, [&](auto zero) {
      allreduce_typed<decltype(zero)>(buf, count, eop);
    });
    if (op == ReduceOp::avg) detail::divide_by(buf, count, type, size());
  }

  void check_buffer(std::string_view op, const void* p, size_t count) const {
    if (p == nullptr && count > 0)
      throw ConfigError("buffer", "gloo " + std::string(op) + " on " + name() +
                                      ": null buffer for " + std::to_string(count) +
                                      " elements");
  }

  void check_members(std::string_view op, std::span<const int> members, const std::string& name,
                     bool must_contain_self) const {
    auto fail = [&](const std::string& why) {
      throw ConfigError("members", "gloo " + std::string(op) + " on " + this->name() + " for " +
                                       name + ": " + why);
    };
    if (members.empty()) fail("members is empty");
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] < 0 || members[i] >= size())
        fail("member " + std::to_string(members[i]) + " is not in [0, " +
             std::to_string(size()) + ")");
      if (i > 0 && members[i] <= members[i - 1]) fail("members must be strictly ascending");
    }
    if (must_contain_self && !std::binary_search(members.begin(), members.end(), rank()))
      fail("this rank (" + std::to_string(rank()) + ") is not among the members; only "
           "members call create_group");
  }

  // Creates the group by `deadline`: split and create_group_collective exchange first, and
  // the whole call is one operation with one deadline.
  std::unique_ptr<Communicator> make_group(const std::vector<int>& members, std::string name,
                                           const std::string& prefix, const std::string& op,
                                           Clock::time_point deadline) {
    auto it = std::find(members.begin(), members.end(), rank());
    COMMGRID_ENFORCE(it != members.end(), "rank not among the members of " + name);
    std::vector<int> global;
    for (int m : members) global.push_back(global_ranks_[static_cast<size_t>(m)]);
    // A new group starts with this communicator's timeout.
    auto ctx = connect_group(*shared_, prefix, static_cast<int>(it - members.begin()), global,
                             op, name, timeout(), deadline);
    return std::make_unique<GlooCommunicator>(std::move(name), shared_, std::move(ctx),
                                              std::move(global), prefix, timeout());
  }

  template <typename T>
  void allreduce_typed(void* buf, size_t count, ReduceOp op) {
    ::gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(static_cast<T*>(buf), count);
    opts.setReduceFunction(reduce_function<T>(op));
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    call_collective("allreduce", [&] { ::gloo::allreduce(opts); });
  }

  void allgather_bytes(std::string_view op, const void* send, void* recv, size_t block) {
    if (block == 0) return;
    if (size() == 1) {
      std::memmove(recv, send, block);
      return;
    }
    ::gloo::AllgatherOptions opts(ctx_);
    opts.setInput(static_cast<std::uint8_t*>(const_cast<void*>(send)), block);
    opts.setOutput(static_cast<std::uint8_t*>(recv), block * static_cast<size_t>(size()));
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    call_collective(op, [&] { ::gloo::allgather(opts); });
  }

  void alltoall_bytes(std::string_view op, const void* send, void* recv, size_t block) {
    if (block == 0) return;
    const size_t total = block * static_cast<size_t>(size());
    if (size() == 1) {
      std::memmove(recv, send, total);
      return;
    }
    ::gloo::AlltoallOptions opts(ctx_);
    opts.setInput(static_cast<std::uint8_t*>(const_cast<void*>(send)), total);
    opts.setOutput(static_cast<std::uint8_t*>(recv), total);
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    call_collective(op, [&] { ::gloo::alltoall(opts); });
  }

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

void GlooP2PWork::wait() {
  waited_ = true;
  // While the deadline is ahead, the watchdog bounds the waits together and, when it passes,
  // closes the group's connections at once (Gloo's own timeout closes them one event-loop
  // turn apart, about 5 ms a peer: seconds in a large group). A wait that starts after the
  // deadline only collects what has completed, as a zero timeout does.
  std::optional<DeadlineGuard> deadline;
  if (Clock::now() < deadline_ &&
      std::any_of(ops_.begin(), ops_.end(), [](const PendingP2P& p) { return !p.done && p.ub; }))
    deadline.emplace(comm_.context(), op_, comm_.name(), timeout_, deadline_);
  auto ran_out = [&] { return deadline && (deadline->release() || deadline->passed()); };
  for (PendingP2P& op : ops_) {
    if (op.done) continue;
    const char* what = op.kind == P2POp::Kind::send ? "send to" : "receive from";
    if (op.self) {
      // This rank's own messages are matched when posted; one still open now can never
      // be (nothing else runs on this communicator while this thread waits).
      if (!op.self->done)
        throw BackendError("gloo " + op_ + " on " + comm_.name() + ": a " + what +
                           " this rank itself (tag " + std::to_string(op.tag) +
                           ") has no matching " +
                           (op.kind == P2POp::Kind::send ? "receive" : "send") +
                           "; post both before waiting");
      op.done = true;
      continue;
    }
    const auto left = std::max(Ms(0), std::chrono::duration_cast<Ms>(deadline_ - Clock::now()));
    try {
      comm_.call(op_, [&] {
        int peer = -1;
        const bool ok = op.kind == P2POp::Kind::send ? op.ub->waitSend(&peer, left)
                                                     : op.ub->waitRecv(&peer, left);
        if (!ok)
          throw AbortedError("gloo " + op_ + " on " + comm_.name() + ": aborted (" +
                             comm_.peer_text(op.peer, op.tag) + ")");
      }, comm_.peer_text(op.peer, op.tag));
    } catch (const Error&) {
      if (ran_out())
        throw TimeoutError(deadline->timeout_text() + " (" + comm_.peer_text(op.peer, op.tag) + ")");
      throw;
    }
    op.done = true;
  }
  // Everything completed, but just as the deadline passed: the connections are closed.
  if (deadline && deadline->release()) throw TimeoutError(deadline->timeout_text());
}

bool GlooP2PWork::done() const {
  for (PendingP2P& op : ops_) {
    if (op.done) continue;
    if (op.self) {
      if (!op.self->done) return false;
      op.done = true;
      continue;
    }
    try {
      int peer = -1;
      const bool ok = op.kind == P2POp::Kind::send ? op.ub->waitSend(&peer, Ms(0))
                                                   : op.ub->waitRecv(&peer, Ms(0));
      if (!ok) return false;
      op.done = true;
    } catch (const std::exception&) {
      return false;  // not yet (or failed: wait() reports it)
    }
  }
  return true;
}

// Listeners bind only to the interface the job uses: the local end of this rank's
// connection to the store (127.0.0.1 for the memory and file stores).
std::string default_hostname(const commgrid::Store& store) { return store.local_address(); }

// Every rank records the world size it was given before Gloo exchanges addresses (whose
// layout depends on the size), so that a mismatch is named instead of failing inside Gloo.
// Rank 0 alone reads every rank's size and then publishes its verdict; every other rank
// reads only rank 0's size and that verdict: O(size) store reads in all, not O(size^2).
void check_world_size(commgrid::Store& store, const std::string& prefix, int rank, int size,
                      Ms timeout, Clock::time_point deadline) {
  auto key = [&](int r) { return prefix + "/size/" + std::to_string(r); };
  const std::string verdict_key = prefix + "/size/verdict";
  const std::string mine = std::to_string(size);
  auto read = [&](const std::string& k) {
    const std::vector<char> v = store.get(k);
    return std::string(v.begin(), v.end());
  };
  auto left = [&] {
    return std::max(Ms(0), std::chrono::duration_cast<Ms>(deadline - Clock::now()));
  };
  auto mismatch = [](int r, const std::string& theirs, const std::string& zeros) {
    return IncompatibleError("world_size", "gloo create world: rank " + std::to_string(r) +
                                               " says world size " + theirs + ", rank 0 says " +
                                               zeros);
  };
  auto timed_out = [&](const std::string& waiting_for) {
    return TimeoutError("gloo create world on world: timed out after " + seconds_text(timeout) +
                        " waiting for " + waiting_for + " (store " + store.uri() + ", keys " +
                        prefix + "/*)");
  };
  auto missing_ranks = [&](const std::vector<int>& missing) {
    // World ranks are global ranks: both lists are the same, written as everywhere else.
    return std::string(missing.size() == 1 ? "rank " : "ranks ") + join_ints(missing) +
           " (global " + join_ints(missing) + ") of " + std::to_string(size) + " to arrive";
  };
  guard("create world", "world",
        [&] { store.set(key(rank), std::span<const char>(mine.data(), mine.size())); });
  if (rank == 0) {
    // The verdict ("o" ok, "i" or "t" and the error) lets every rank report the same error.
    auto publish = [&](char kind, const std::string& text) {
      const std::string v = kind + text;
      guard("create world", "world",
            [&] { store.set(verdict_key, std::span<const char>(v.data(), v.size())); });
    };
    // Ranks are checked in order: each round polls only the first missing one, so the reads
    // are one per rank plus one per pause, not one per rank per pause.
    int next = 1;
    auto pause = Ms(1);
    while (next < size) {
      if (store.aborted()) (void)store.wait_for({}, Ms(0));  // throws AbortedError
      if (store.has(key(next))) {
        if (const std::string theirs = read(key(next)); theirs != mine) {
          const IncompatibleError e = mismatch(next, theirs, mine);
          publish('i', e.what());
          throw e;
        }
        ++next;
        pause = Ms(1);
        continue;
      }
      if (Clock::now() >= deadline) {
        // Name every rank still missing, or a later rank that did arrive with another size.
        std::vector<int> missing;
        for (int r = next; r < size; ++r) {
          if (!store.has(key(r))) {
            missing.push_back(r);
          } else if (const std::string theirs = read(key(r)); theirs != mine) {
            const IncompatibleError e = mismatch(r, theirs, mine);
            publish('i', e.what());
            throw e;
          }
        }
        const TimeoutError e = timed_out(missing_ranks(missing));
        publish('t', e.what());
        throw e;
      }
      std::this_thread::sleep_for(std::min(pause, left() + Ms(1)));
      pause = std::min(pause * 2, Ms(20));
    }
    if (size > 1) publish('o', "");
    return;
  }
  const std::string zero_key = key(0);
  if (!store.wait_for(std::span<const std::string>(&zero_key, 1), left()).empty())
    throw timed_out(missing_ranks({0}));
  if (const std::string zeros = read(zero_key); zeros != mine) throw mismatch(rank, mine, zeros);
  // Rank 0 publishes its verdict when its own deadline passes, which may be a little after
  // this rank's when it arrived later; a grace of up to a second (within the bound of the
  // timeout plus 2 s) lets this rank report rank 0's finding rather than a bare timeout.
  const Ms grace = std::min(timeout, Ms(1000));
  if (!store.wait_for(std::span<const std::string>(&verdict_key, 1), left() + grace).empty())
    throw timed_out("rank 0 to see every rank arrive (rank 0's error names those missing)");
  const std::string verdict = read(verdict_key);
  if (verdict.starts_with("i")) throw IncompatibleError("world_size", verdict.substr(1));
  if (verdict.starts_with("t")) throw TimeoutError(verdict.substr(1));
}

}  // namespace

CollectiveForTesting take_collective_for_testing(Communicator& comm) {
  auto* gloo = dynamic_cast<GlooCommunicator*>(&comm);
  if (gloo == nullptr)
    throw ConfigError("comm", "take_collective_for_testing: " + comm.name() + " is a " +
                                  std::string(comm.backend()) + " communicator, not gloo");
  auto [context, tag] = gloo->take_collective_for_testing();
  return {std::move(context), tag};
}

}  // namespace gloo_backend

std::unique_ptr<Communicator> make_gloo_world(std::shared_ptr<Store> store, int rank, int size,
                                              const GlooOptions& options) {
  using namespace gloo_backend;
  if (!store) throw ConfigError("store", "gloo world: no store given");
  if (size < 1)
    throw InvalidValueError("world_size", "gloo world: world size must be >= 1, got " +
                                              std::to_string(size));
  if (rank < 0 || rank >= size)
    throw RankOutOfRangeError("rank", "gloo world: rank " + std::to_string(rank) +
                                          " is not in [0, " + std::to_string(size) + ")");
  if (options.timeout.count() <= 0)
    throw InvalidValueError("timeout", "gloo world: timeout must be > 0 ms, got " +
                                           std::to_string(options.timeout.count()));
  if (options.prefix.empty()) throw ConfigError("prefix", "gloo world: empty key prefix");
  auto shared = std::make_shared<Shared>();
  shared->store = std::move(store);
  shared->token = effective_token(*shared->store, options.token);  // no token: the store's job secret
  ::gloo::transport::tcp::attr attr;
  attr.hostname = options.hostname.empty() ? default_hostname(*shared->store) : options.hostname;
  guard("create device", "world",
        [&] { shared->device = ::gloo::transport::tcp::CreateDevice(attr); },
        "hostname " + attr.hostname);
  std::vector<int> global(static_cast<size_t>(size));
  std::iota(global.begin(), global.end(), 0);
  // Gloo writes to peers' sockets without MSG_NOSIGNAL: a peer that died would kill this
  // rank with SIGPIPE. Ignored (unless the program chose a handler), the write fails with
  // EPIPE and the survivor reports the lost peer as an error.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
  // One deadline for the whole creation: the size check, the connections and the barrier.
  const auto deadline = Clock::now() + options.timeout;
  check_world_size(*shared->store, options.prefix, rank, size, options.timeout, deadline);
  auto ctx = connect_group(*shared, options.prefix, rank, global, "create world", "world",
                           options.timeout, deadline);
  return std::make_unique<GlooCommunicator>("world", shared, std::move(ctx), std::move(global),
                                            options.prefix, options.timeout);
}

}  // namespace commgrid
