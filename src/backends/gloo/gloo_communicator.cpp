// The Gloo backend: every Communicator method on Gloo's TCP transport, groups made by
// member-only rendezvous through a Store.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>
#include <type_traits>

#include "commgrid/gloo.hpp"
#include "gloo_errors.hpp"

namespace commgrid {
namespace gloo_backend {
namespace {

using Ms = std::chrono::milliseconds;

// What every communicator of one rank shares: the store it meets others through and the TCP
// device (one event loop thread per rank).
struct Shared {
  std::shared_ptr<Store> store;
  std::shared_ptr<::gloo::transport::Device> device;
};

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

std::string seconds_text(Ms t) {
  std::ostringstream s;
  s << static_cast<double>(t.count()) / 1000.0 << " s";
  return s.str();
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

class RendezvousStore final : public ::gloo::rendezvous::Store {
 public:
  RendezvousStore(commgrid::Store& store, std::string prefix, std::string op, std::string group,
                  const std::vector<int>& global_ranks, Ms timeout)
      : store_(store), prefix_(std::move(prefix)), op_(std::move(op)), group_(std::move(group)),
        global_ranks_(global_ranks), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(full(key), data);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return store_.get(full(key));
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Ms& timeout) override {
    std::vector<std::string> full_keys;
    for (const auto& k : keys) full_keys.push_back(full(k));
    try {
      if (store_.wait_for(full_keys, timeout).empty()) return;
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
  commgrid::Store& store_;
  std::string prefix_, op_, group_;
  const std::vector<int>& global_ranks_;
  Ms timeout_;
};

std::shared_ptr<::gloo::Context> connect_group(Shared& shared, const std::string& prefix,
                                               int rank, const std::vector<int>& global_ranks,
                                               const std::string& op, const std::string& group,
                                               Ms timeout) {
  const int size = static_cast<int>(global_ranks.size());
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  RendezvousStore store(*shared.store, prefix, op, group, global_ranks, timeout);
  guard(op, group, [&] { shared.store->set(arrival_key(prefix, rank), std::vector<char>{'1'}); });
  guard(op, group, [&] { ctx->connectFullMesh(store, shared.device); });
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
    opts.setTimeout(timeout);
    guard(op, group, [&] { ::gloo::barrier(opts); });
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

// ---- the communicator ---------------------------------------------------------------

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::string name, std::shared_ptr<Shared> shared,
                   std::shared_ptr<::gloo::Context> ctx, std::vector<int> global_ranks,
                   std::string prefix, Ms timeout)
      : Communicator(std::move(name), timeout), shared_(std::move(shared)),
        ctx_(std::move(ctx)), global_ranks_(std::move(global_ranks)),
        prefix_(std::move(prefix)) {}

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
  int rank() const noexcept override { return ctx_->rank; }
  int size() const noexcept override { return ctx_->size; }

  std::unique_ptr<Communicator> split(std::optional<std::int64_t> color, std::int64_t key,
                                      std::string name) override {
    count_creation();
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
                      "split");
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
                      "create_group");
  }

  std::unique_ptr<Communicator> create_group_collective(std::span<const int> members,
                                                        std::string name) override {
    check_members("create_group_collective", members, name, false);
    count_creation();
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
                      prefix_ + "/collective" + std::to_string(seq), "create_group_collective");
  }

  std::unique_ptr<Work> barrier() override {
    if (size() > 1) {
      ::gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      call("barrier", [&] { ::gloo::barrier(opts); });
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
      call("broadcast", [&] { ::gloo::broadcast(opts); });
    }
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> allreduce(const void* send, void* recv, std::size_t count,
                                  DataType type, ReduceOp op) override {
    check_buffer("allreduce", send, count);
    check_buffer("allreduce", recv, count);
    if (count == 0) return std::make_unique<Work>();
    if (send != recv) std::memmove(recv, send, bytes(count, type));
    if (size() == 1) return std::make_unique<Work>();
    switch (type) {
      case DataType::float32: allreduce_typed<float>(recv, count, op); break;
      case DataType::float64: allreduce_typed<double>(recv, count, op); break;
      case DataType::int32: allreduce_typed<std::int32_t>(recv, count, op); break;
      case DataType::int64: allreduce_typed<std::int64_t>(recv, count, op); break;
      case DataType::bfloat16: {
        // Reduced in float32 and rounded once at the end, so every rank gets the same
        // bits and the result does not depend on the ring's order of partial roundings.
        auto* p = static_cast<std::uint16_t*>(recv);
        std::vector<float> wide(count);
        for (size_t i = 0; i < count; ++i) wide[i] = bf16_to_float(p[i]);
        allreduce_typed<float>(wide.data(), count, op);
        for (size_t i = 0; i < count; ++i) p[i] = float_to_bf16(wide[i]);
        break;
      }
    }
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
    switch (type) {
      case DataType::float32: reduce_blocks<float>(gathered.data(), recv, count, op); break;
      case DataType::float64: reduce_blocks<double>(gathered.data(), recv, count, op); break;
      case DataType::int32: reduce_blocks<std::int32_t>(gathered.data(), recv, count, op); break;
      case DataType::int64: reduce_blocks<std::int64_t>(gathered.data(), recv, count, op); break;
      case DataType::bfloat16: {
        const auto* in = reinterpret_cast<const std::uint16_t*>(gathered.data());
        std::vector<float> acc(count), next(count);
        for (size_t i = 0; i < count; ++i) acc[i] = bf16_to_float(in[i]);
        for (size_t r = 1; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) next[i] = bf16_to_float(in[r * count + i]);
          reduce_block(acc.data(), acc.data(), next.data(), count, op);
        }
        auto* out = static_cast<std::uint16_t*>(recv);
        for (size_t i = 0; i < count; ++i) out[i] = float_to_bf16(acc[i]);
        break;
      }
    }
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

  std::unique_ptr<Work> send(const void* buf, std::size_t count, DataType type, int peer,
                             int tag) override {
    check_peer("send", peer, tag);
    check_buffer("send", buf, count);
    if (count == 0) return std::make_unique<Work>();
    const std::string hint = peer_text(peer, tag);
    call("send", [&] {
      auto ub = ctx_->createUnboundBuffer(const_cast<void*>(buf), bytes(count, type));
      ub->send(peer, p2p_slot(tag));
      if (!ub->waitSend(timeout()))
        throw BackendError("gloo send on " + name() + ": aborted (" + hint + ")");
    }, hint);
    return std::make_unique<Work>();
  }

  std::unique_ptr<Work> recv(void* buf, std::size_t count, DataType type, int peer,
                             int tag) override {
    check_peer("recv", peer, tag);
    check_buffer("recv", buf, count);
    if (count == 0) return std::make_unique<Work>();
    const std::string hint = peer_text(peer, tag);
    call("recv", [&] {
      auto ub = ctx_->createUnboundBuffer(buf, bytes(count, type));
      ub->recv(peer, p2p_slot(tag));
      if (!ub->waitRecv(timeout()))
        throw BackendError("gloo recv on " + name() + ": aborted (" + hint + ")");
    }, hint);
    return std::make_unique<Work>();
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

  std::string peer_text(int peer, int tag) const {
    return "peer rank " + std::to_string(peer) + " (global " +
           std::to_string(global_ranks_[static_cast<size_t>(peer)]) + "), tag " +
           std::to_string(tag);
  }

  void check_rank(std::string_view op, const char* what, int r) const {
    if (r < 0 || r >= size())
      throw RankOutOfRangeError(what, "gloo " + std::string(op) + " on " + name() + ": " + what +
                                          " " + std::to_string(r) + " is not in [0, " +
                                          std::to_string(size()) + ")");
  }

  void check_peer(std::string_view op, int peer, int tag) const {
    check_rank(op, "peer", peer);
    if (peer == rank())
      throw ConfigError("peer", "gloo " + std::string(op) + " on " + name() +
                                    ": peer is this rank (" + std::to_string(peer) +
                                    "); send and recv are blocking, so a self-message would "
                                    "deadlock");
    if (tag < 0)
      throw ConfigError("tag", "gloo " + std::string(op) + " on " + name() +
                                   ": tag must be >= 0, got " + std::to_string(tag));
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

  std::unique_ptr<Communicator> make_group(const std::vector<int>& members, std::string name,
                                           const std::string& prefix, const std::string& op) {
    auto it = std::find(members.begin(), members.end(), rank());
    COMMGRID_ENFORCE(it != members.end(), "rank not among the members of " + name);
    std::vector<int> global;
    for (int m : members) global.push_back(global_ranks_[static_cast<size_t>(m)]);
    // A new group starts with this communicator's timeout, for its rendezvous too.
    auto ctx = connect_group(*shared_, prefix, static_cast<int>(it - members.begin()), global,
                             op, name, timeout());
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
    call("allreduce", [&] { ::gloo::allreduce(opts); });
  }

  template <typename T>
  void reduce_blocks(const std::uint8_t* gathered, void* recv, size_t count, ReduceOp op) {
    const auto* in = reinterpret_cast<const T*>(gathered);
    auto* out = static_cast<T*>(recv);
    std::copy(in, in + count, out);
    for (size_t r = 1; r < static_cast<size_t>(size()); ++r)
      reduce_block(out, out, in + r * count, count, op);
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
    call(op, [&] { ::gloo::allgather(opts); });
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
    call(op, [&] { ::gloo::alltoall(opts); });
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<::gloo::Context> ctx_;
  std::vector<int> global_ranks_;  // world rank of each rank of this group
  std::string prefix_;             // this group's key prefix in the store
  std::uint64_t split_seq_ = 0;
  std::uint64_t collective_seq_ = 0;
  std::map<std::string, int> created_by_name_;
  std::uint32_t tag_ = 1;
};

std::string default_hostname(const commgrid::Store& store) {
  if (store.uri().rfind("redis://", 0) != 0) return "127.0.0.1";
  // Redis joins machines that share nothing, so peers must reach this one by its name.
  std::array<char, HOST_NAME_MAX + 1> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "127.0.0.1";
  return buf.data();
}

}  // namespace
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
  ::gloo::transport::tcp::attr attr;
  attr.hostname = options.hostname.empty() ? default_hostname(*shared->store) : options.hostname;
  guard("create device", "world",
        [&] { shared->device = ::gloo::transport::tcp::CreateDevice(attr); },
        "hostname " + attr.hostname);
  std::vector<int> global(static_cast<size_t>(size));
  std::iota(global.begin(), global.end(), 0);
  auto ctx = connect_group(*shared, options.prefix, rank, global, "create world", "world",
                           options.timeout);
  return std::make_unique<GlooCommunicator>("world", shared, std::move(ctx), std::move(global),
                                            options.prefix, options.timeout);
}

}  // namespace commgrid
