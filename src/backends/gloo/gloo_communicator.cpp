#include "gloo_communicator.hpp"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <system_error>
#include <thread>

#include "commgrid/store.hpp"
#include "engine_int.hpp"
#include "fingerprint.hpp"
#include "gloo_testing.hpp"
#include "mesh_view.hpp"
#include "reduce_util.hpp"
#include "store_adapter.hpp"
#include "time_text.hpp"

namespace commgrid::gloo_backend {

std::string GlooCommunicator::peer_named_in(const std::string& text) const {
  for (int i = 0; i < size(); ++i) {
    if (i == rank()) continue;
    try {
      // The address member i's pair for this rank listens on, as i published it.
      const std::string key = prefix_ + "/" + pair_key(i, ctx_->rank);
      if (!shared_->store->has(key)) continue;
      const std::string address = pair_address_text(shared_->store->get(key));
      if (!address.empty() && text.find(address) != std::string::npos)
        return "rank " + std::to_string(i) + " of " + name() + " (global rank " +
               std::to_string(global_ranks_[static_cast<size_t>(i)]) + ")";
    } catch (const Error&) {
      // The store itself may be failing too; the error stands without the name.
    }
  }
  // Gloo occasionally reports another address of the peer (about 1 run in 60 here);
  // in a group of two the peer is known all the same.
  if (size() == 2) {
    const int other = 1 - ctx_->rank;
    return "rank " + std::to_string(other) + " of " + name() + " (global rank " +
           std::to_string(global_ranks_[static_cast<size_t>(other)]) + ")";
  }
  return "";
}

std::string GlooCommunicator::peer_text(int peer, int tag) const {
  return "peer rank " + std::to_string(peer) + " (global " +
         std::to_string(global_ranks_[static_cast<size_t>(peer)]) + "), tag " + std::to_string(tag);
}

std::string GlooCommunicator::census(std::string_view op, std::uint32_t tag, bool wait) {
  const std::string base = prefix_ + "/reached/" + std::to_string(tag) + "/";
  Store& store = *shared_->store;
  try {
    store.set(base + std::to_string(rank()), std::vector<char>{'1'});
  } catch (const Error&) {
    return "";  // the store is failing too (or the key exists: the tag counter wrapped)
  }
  if (!wait) return "";
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r)
    if (r != rank()) keys.push_back(base + std::to_string(r));
  const Ms grace = std::clamp(timeout() / 4, Ms(1), Ms(1000));
  std::vector<std::string> missing_keys;
  try {
    missing_keys = store.wait_for(keys, grace);
  } catch (const Error&) { return ""; }
  const std::string what =
      std::string(op) + " (collective " + std::to_string(tag) + " of " + name() + ")";
  if (missing_keys.empty())
    return "; every rank of the group reached this " + what +
           ": a peer was too slow or stuck inside it";
  std::vector<int> missing, missing_global;
  for (const std::string& k : missing_keys) missing.push_back(std::stoi(k.substr(base.size())));
  std::sort(missing.begin(), missing.end());
  for (int r : missing) missing_global.push_back(global_ranks_[static_cast<size_t>(r)]);
  return "; " + std::string(missing.size() == 1 ? "rank " : "ranks ") + join_ints(missing) +
         " (global " + join_ints(missing_global) + ") of " + std::to_string(size()) +
         " did not reach this " + what + ", or were still inside it " + seconds_text(grace) +
         " after this rank's deadline";
}

std::unique_ptr<Communicator> GlooCommunicator::do_split(std::optional<std::int64_t> color,
                                                         std::int64_t key, std::string name) {
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

std::string GlooCommunicator::next_group_prefix(const std::string& name) {
  return prefix_ + "/group/" + name + "/" + std::to_string(created_by_name_[name]++);
}

std::unique_ptr<Communicator> GlooCommunicator::do_create_group(std::span<const Rank> members,
                                                                std::string name) {
  const std::string prefix = next_group_prefix(name);
  return make_group(detail::engine_ints(members), std::move(name), prefix, "create_group",
                    Clock::now() + timeout());
}

namespace {

// How many pairs a rank connects at once in create_groups (see there).
constexpr std::size_t kWavePairs = 128;

// Connects every group's pairs (their addresses have arrived), each group on a thread of
// its own (the first on this one). Gloo connects a group's pairs one after another, each
// waiting for its peer's side; one group after another, a rank would wait once per group for
// its slowest member (on a loaded machine a scheduling delay each), in parallel about once.
// The first group's error (in the groups' order) is what is thrown; every thread has ended
// by then, since all share the batch's deadline.
void connect_in_parallel(std::span<const std::unique_ptr<GroupConnection>> conns) {
  std::vector<std::exception_ptr> errors(conns.size());
  auto run = [&](std::size_t i) {
    try {
      conns[i]->connect_pairs();
    } catch (...) { errors[i] = std::current_exception(); }
  };
  std::vector<std::thread> threads;
  threads.reserve(conns.size());
  for (std::size_t i = 1; i < conns.size(); ++i) {
    try {
      threads.emplace_back(run, i);
    } catch (const std::system_error&) {
      run(i);  // no thread to be had: this one connects it
    }
  }
  if (!conns.empty()) run(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> GlooCommunicator::view_groups(
    std::span<const GroupSpec> groups, const std::vector<std::string>& prefixes,
    const std::string& op, Clock::time_point deadline,
    const std::function<void(std::size_t)>& created) {
  ViewTransport& parent = *view_of(*ctx_);
  // The first batch made from an epoch's world view names each numbered group (GroupSpec::
  // index) by a namespace derived from the epoch and the number, alike on every member
  // without a rendezvous; any other group's first member picks one and publishes it.
  const std::optional<std::uint32_t> base = parent.take_derived();
  const std::uint32_t span = parent.mesh().derived_span();
  auto derived = [&](const GroupSpec& g) {
    return base && g.index >= 0 && g.index + 1 < static_cast<std::int64_t>(span);
  };
  std::vector<std::string> keys;
  std::vector<bool> leads;
  std::vector<std::size_t> named;  // the groups the store names
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (derived(groups[i])) continue;
    keys.push_back(prefixes[i] + "/namespace");
    leads.push_back(detail::engine_int(groups[i].members.front()) == rank());
    named.push_back(i);
  }
  const std::vector<std::uint32_t> picked =
      agree_namespaces(parent.mesh(), keys, leads, deadline, op, name());
  std::vector<std::uint32_t> ns(groups.size());
  for (std::size_t i = 0; i < groups.size(); ++i)
    if (derived(groups[i])) ns[i] = *base + 1 + static_cast<std::uint32_t>(groups[i].index);
  for (std::size_t j = 0; j < named.size(); ++j) ns[named[j]] = picked[j];
  std::vector<std::unique_ptr<Communicator>> out;
  out.reserve(groups.size());
  for (std::size_t i = 0; i < groups.size(); ++i) {
    std::vector<int> processes, global;
    int me = -1;
    for (const Rank m : groups[i].members) {
      const int r = detail::engine_int(m);
      if (r == rank()) me = static_cast<int>(processes.size());
      processes.push_back(parent.process_of(r));
      global.push_back(global_ranks_[static_cast<size_t>(r)]);
    }
    auto ctx = std::make_shared<MeshViewContext>(parent.mesh().shared_from_this(),
                                                 std::move(processes), me, ns[i]);
    out.push_back(std::make_unique<GlooCommunicator>(groups[i].name, shared_, std::move(ctx),
                                                     std::move(global), prefixes[i], timeout()));
    if (created) created(i);
  }
  return out;
}

std::vector<std::unique_ptr<Communicator>> GlooCommunicator::do_create_groups(
    std::span<const GroupSpec> groups, const std::function<void(std::size_t)>& created) {
  const auto deadline = Clock::now() + timeout();  // the whole batch's
  if (view_of(*ctx_) != nullptr) {
    std::vector<std::string> prefixes;
    prefixes.reserve(groups.size());
    for (const GroupSpec& g : groups) prefixes.push_back(next_group_prefix(g.name));
    // No barrier: a view connects nothing, and ending one closes nothing (a connected
    // group's barrier keeps a member from destroying pairs a peer is still connecting).
    return view_groups(groups, prefixes, "create_groups", deadline, created);
  }
  std::vector<std::unique_ptr<GroupConnection>> conns;
  conns.reserve(groups.size());
  for (const GroupSpec& g : groups)
    conns.push_back(group_connection(detail::engine_ints(g.members), g.name,
                                     next_group_prefix(g.name), "create_groups", deadline));
  // In waves of at most kWavePairs pairs (a group larger than that is a wave of its own):
  // this Gloo opens a listening socket on both ends of every pair it has not connected yet,
  // and a whole batch's at once would exhaust the ephemeral ports of one address at a few
  // dozen ranks. Each rank cuts its own waves; the groups' one order keeps them from
  // waiting on each other in a cycle.
  for (std::size_t begin = 0; begin < conns.size();) {
    std::size_t end = begin, pairs = 0;
    do {
      pairs += conns[end]->global_ranks().size() - 1;
      ++end;
    } while (end < conns.size() && pairs + conns[end]->global_ranks().size() - 1 <= kWavePairs);
    const std::span<const std::unique_ptr<GroupConnection>> wave(conns.data() + begin, end - begin);
    for (const auto& c : wave) c->publish();
    // The store waits here, one group after another: a wait holds the process's store
    // connection while it lasts, so threads waiting at once would queue behind each other.
    for (const auto& c : wave) c->await_addresses();
    connect_in_parallel(wave);
    for (const auto& c : wave) c->post_proofs();
    begin = end;
  }
  std::vector<std::unique_ptr<Communicator>> out;
  out.reserve(groups.size());
  for (std::size_t i = 0; i < conns.size(); ++i) {
    conns[i]->wait_proofs();
    out.push_back(std::make_unique<GlooCommunicator>(groups[i].name, shared_, conns[i]->context(),
                                                     conns[i]->global_ranks(), conns[i]->prefix(),
                                                     timeout()));
    if (created) created(i);
  }
  // No member ends before every member has connected every group (see GroupConnection's
  // barrier): one barrier over this communicator instead of one per group.
  end_with_barrier(ctx_, "create_groups", name(), timeout(), deadline);
  return out;
}

std::unique_ptr<Communicator> GlooCommunicator::do_create_group_collective(
    std::span<const Rank> members, std::string name) {
  const auto deadline = Clock::now() + timeout();  // the exchange's and the creation's
  // Every rank of this group takes part: exchanging a fingerprint of (members, name) both
  // waits for everyone (new_group's collective semantics) and catches ranks that passed
  // different arguments, which would otherwise wait for each other until the timeout.
  std::uint64_t fp = detail::group_fingerprint(members, name);
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
  return make_group(detail::engine_ints(members), name,
                    prefix_ + "/collective" + std::to_string(seq), "create_group_collective",
                    deadline);
}

std::unique_ptr<Work> GlooCommunicator::do_barrier() {
  if (size() > 1) {
    ::gloo::BarrierOptions opts(ctx_);
    const std::uint32_t tag = next_tag();
    opts.setTag(tag);
    opts.setTimeout(timeout());
    call_collective("barrier", tag, [&] { ::gloo::barrier(opts); });
  }
  return std::make_unique<Work>();
}

std::unique_ptr<Work> GlooCommunicator::do_broadcast(void* buf, std::size_t count, DataType type,
                                                     Rank root) {
  if (size() > 1 && count > 0) {
    ::gloo::BroadcastOptions opts(ctx_);
    opts.setOutput(static_cast<std::uint8_t*>(buf), bytes(count, type));
    opts.setRoot(detail::engine_int(root));
    const std::uint32_t tag = next_tag();
    opts.setTag(tag);
    opts.setTimeout(timeout());
    call_collective("broadcast", tag, [&] { ::gloo::broadcast(opts); });
  }
  return std::make_unique<Work>();
}

std::unique_ptr<Work> GlooCommunicator::do_allreduce(const void* send, void* recv,
                                                     std::size_t count, DataType type,
                                                     ReduceOp op) {
  if (count == 0) return std::make_unique<Work>();
  if (send != recv) std::memmove(recv, send, bytes(count, type));
  if (size() > 1) reduce_everywhere(recv, count, type, op);
  return std::make_unique<Work>();
}

std::unique_ptr<Work> GlooCommunicator::do_reduce_scatter(const void* send, void* recv,
                                                          std::size_t count, DataType type,
                                                          ReduceOp op) {
  if (count == 0) return std::make_unique<Work>();
  const auto n = static_cast<size_t>(size());
  const size_t block = bytes(count, type);
  // An alltoall brings block rank() of every rank here; reducing them locally in rank
  // order makes the result deterministic and costs the same traffic as a ring.
  std::vector<std::uint8_t> gathered(n * block);
  alltoall_bytes("reduce_scatter", send, gathered.data(), block);
  detail::reduce_blocks(gathered.data(), recv, count, type, op, size());
  return std::make_unique<Work>();
}

std::unique_ptr<Work> GlooCommunicator::do_alltoallv(const void* send,
                                                     std::span<const std::size_t> send_counts,
                                                     void* recv,
                                                     std::span<const std::size_t> recv_counts,
                                                     DataType type) {
  const size_t send_total = total(send_counts), recv_total = total(recv_counts);
  const size_t es = element_size(type);
  if (size() == 1) {
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
  opts.setInput(send_total > 0 ? static_cast<std::uint8_t*>(const_cast<void*>(send)) : &dummy_in,
                in);
  opts.setOutput(recv_total > 0 ? static_cast<std::uint8_t*>(recv) : &dummy_out, out);
  const std::uint32_t tag = next_tag();
  opts.setTag(tag);
  opts.setTimeout(timeout());
  call_collective("alltoallv", tag, [&] { ::gloo::alltoallv(opts); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> GlooCommunicator::do_allgatherv(const void* send, std::size_t count,
                                                      void* recv,
                                                      std::span<const std::size_t> recv_counts,
                                                      DataType type) {
  const size_t recv_total = total(recv_counts);
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
  opts.setInput(count > 0 ? static_cast<std::uint8_t*>(const_cast<void*>(send)) : &dummy,
                count * es);
  opts.setOutput(static_cast<std::uint8_t*>(recv), elements);
  const std::uint32_t tag = next_tag();
  opts.setTag(tag);
  opts.setTimeout(timeout());
  call_collective("allgatherv", tag, [&] { ::gloo::allgatherv(opts); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> GlooCommunicator::do_reduce(const void* send, void* recv, std::size_t count,
                                                  DataType type, ReduceOp op, Rank root) {
  if (count == 0) return std::make_unique<Work>();
  // Root gathers every rank's input and reduces in rank order, as reduce_scatter does:
  // deterministic, and the same bits whatever the group's size.
  const size_t block = bytes(count, type);
  std::vector<std::uint8_t> gathered(rank() == root ? block * static_cast<size_t>(size()) : 0);
  gather_bytes("reduce", send, gathered.data(), block, detail::engine_int(root));
  if (rank() == root) detail::reduce_blocks(gathered.data(), recv, count, type, op, size());
  return std::make_unique<Work>();
}

std::unique_ptr<Work> GlooCommunicator::do_scatter(const void* send, void* recv, std::size_t count,
                                                   DataType type, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const size_t block = bytes(count, type);
  const std::uint64_t slot = rooted_slot(next_tag());
  if (block == 0) return std::make_unique<Work>();
  std::vector<PendingP2P> ops;
  if (rank() == root) {
    const auto* base = static_cast<const std::uint8_t*>(send);
    std::memmove(recv, base + static_cast<size_t>(root) * block, block);
    for (int r = 0; r < size(); ++r)
      if (r != root)
        ops.push_back(post_one(P2POp::Kind::send,
                               const_cast<std::uint8_t*>(base) + static_cast<size_t>(r) * block,
                               block, r, 0, slot, "scatter"));
  } else {
    ops.push_back(post_one(P2POp::Kind::recv, recv, block, root, 0, slot, "scatter"));
  }
  finish(std::move(ops), "scatter");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> GlooCommunicator::do_batch_isend_irecv(std::span<const P2POp> batch,
                                                             std::string_view op) {
  const auto deadline = Clock::now() + timeout();
  std::vector<PendingP2P> ops;
  ops.reserve(batch.size());
  for (const P2POp& o : batch)
    ops.push_back(post_one(o.kind, o.buf, bytes(o.count, o.type), detail::engine_int(o.peer), o.tag,
                           p2p_slot(o.tag), op));
  return std::make_unique<GlooP2PWork>(*this, std::string(op), std::move(ops), deadline, timeout());
}

PendingP2P GlooCommunicator::post_one(P2POp::Kind kind, void* buf, size_t nbytes, int peer, int tag,
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
    call(
        op,
        [&] {
          p.ub = ctx_->createUnboundBuffer(buf, nbytes);
          if (kind == P2POp::Kind::send) p.ub->send(peer, slot);
          else p.ub->recv(peer, slot);
        },
        peer_text(peer, tag));
  }
  return p;
}

void GlooCommunicator::gather_bytes(std::string_view op, const void* send, void* recv, size_t block,
                                    int root) {
  const std::uint64_t slot = rooted_slot(next_tag());
  if (block == 0) return;
  std::vector<PendingP2P> ops;
  if (rank() == root) {
    auto* base = static_cast<std::uint8_t*>(recv);
    std::memmove(base + static_cast<size_t>(root) * block, send, block);
    for (int r = 0; r < size(); ++r)
      if (r != root)
        ops.push_back(post_one(P2POp::Kind::recv, base + static_cast<size_t>(r) * block, block, r,
                               0, slot, op));
  } else {
    ops.push_back(post_one(P2POp::Kind::send, const_cast<void*>(send), block, root, 0, slot, op));
  }
  finish(std::move(ops), op);
}

namespace {

// GlooAlgorithm::automatic (docs/benchmarks.md, "Gloo's allreduce algorithms"): bcube up to
// kGlooBcubeMaxBytes, unless the buffer holds fewer elements than log2(W). Then ring's
// empty segments send nothing: its 2c(W-1) messages for c elements are fewer than bcube's
// 2 W log2(W), and on a busy host the messages, more than the rounds, set the time.
bool bcube_allreduce(GlooAlgorithm algorithm, size_t count, size_t element, int size) {
  if (algorithm != GlooAlgorithm::automatic) return algorithm == GlooAlgorithm::bcube;
  if (size <= 2 || count * element > kGlooBcubeMaxBytes) return false;
  size_t log2w = 0;
  while ((size_t{1} << log2w) < static_cast<size_t>(size)) ++log2w;
  return count >= log2w;
}

}  // namespace

template <typename T>
void GlooCommunicator::allreduce_typed(void* buf, size_t count, ReduceOp op) {
  ::gloo::AllreduceOptions opts(ctx_);
  opts.setOutput(static_cast<T*>(buf), count);
  opts.setReduceFunction([op](void* c, const void* a, const void* b, size_t n) {
    detail::reduce_block(static_cast<T*>(c), static_cast<const T*>(a), static_cast<const T*>(b), n,
                         op);
  });
  const std::uint32_t tag = next_tag();
  opts.setTag(tag);
  opts.setTimeout(timeout());
  if (bcube_allreduce(shared_->algorithm, count, sizeof(T), size()))
    opts.setAlgorithm(::gloo::AllreduceOptions::Algorithm::BCUBE);
  call_collective("allreduce", tag, [&] { ::gloo::allreduce(opts); });
}

void GlooCommunicator::reduce_everywhere(void* buf, size_t count, DataType type, ReduceOp op) {
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
  detail::dispatch_native(type,
                          [&](auto zero) { allreduce_typed<decltype(zero)>(buf, count, eop); });
  if (op == ReduceOp::avg) detail::divide_by(buf, count, type, size());
}

std::unique_ptr<Communicator> GlooCommunicator::make_group(const std::vector<int>& members,
                                                           std::string name,
                                                           const std::string& prefix,
                                                           const std::string& op,
                                                           Clock::time_point deadline) {
  if (view_of(*ctx_) != nullptr) {
    const GroupSpec spec{{members.begin(), members.end()}, name};
    auto out = view_groups(std::span<const GroupSpec>(&spec, 1), {prefix}, op, deadline, {});
    return std::move(out.front());
  }
  const std::unique_ptr<GroupConnection> c = group_connection(members, name, prefix, op, deadline);
  c->run_alone();
  // A new group starts with this communicator's timeout.
  return std::make_unique<GlooCommunicator>(std::move(name), shared_, c->context(),
                                            c->global_ranks(), prefix, timeout());
}

std::unique_ptr<GroupConnection> GlooCommunicator::group_connection(const std::vector<int>& members,
                                                                    const std::string& name,
                                                                    const std::string& prefix,
                                                                    const std::string& op,
                                                                    Clock::time_point deadline) {
  const auto it = std::find(members.begin(), members.end(), rank());
  COMMGRID_ENFORCE(it != members.end(), "rank not among the members of " + name);
  std::vector<int> global;
  global.reserve(members.size());
  for (int m : members) global.push_back(global_ranks_[static_cast<size_t>(m)]);
  return std::make_unique<GroupConnection>(*shared_, prefix, static_cast<int>(it - members.begin()),
                                           std::move(global), op, name, timeout(), deadline);
}

void GlooCommunicator::allgather_bytes(std::string_view op, const void* send, void* recv,
                                       size_t block) {
  if (block == 0) return;
  if (size() == 1) {
    std::memmove(recv, send, block);
    return;
  }
  const size_t total = block * static_cast<size_t>(size());
  const GlooAlgorithm algorithm = shared_->algorithm;
  if (algorithm == GlooAlgorithm::bcube ||
      (algorithm == GlooAlgorithm::automatic && size() > 2 && total <= kGlooBcubeMaxBytes)) {
    // Each rank's block in its place, zeros elsewhere: a max over the ranks' bytes is every
    // rank's block (GlooAlgorithm::bcube).
    // (send and recv never overlap: Communicator::allgather refuses it.)
    auto* out = static_cast<std::uint8_t*>(recv);
    std::memset(out, 0, total);
    std::memcpy(out + static_cast<size_t>(rank()) * block, send, block);
    ::gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(out, total);
    opts.setReduceFunction([](void* c, const void* a, const void* b, size_t n) {
      detail::reduce_block(static_cast<std::uint8_t*>(c), static_cast<const std::uint8_t*>(a),
                           static_cast<const std::uint8_t*>(b), n, ReduceOp::max);
    });
    opts.setAlgorithm(::gloo::AllreduceOptions::Algorithm::BCUBE);
    const std::uint32_t tag = next_tag();
    opts.setTag(tag);
    opts.setTimeout(timeout());
    call_collective(op, tag, [&] { ::gloo::allreduce(opts); });
    return;
  }
  ::gloo::AllgatherOptions opts(ctx_);
  opts.setInput(static_cast<std::uint8_t*>(const_cast<void*>(send)), block);
  opts.setOutput(static_cast<std::uint8_t*>(recv), block * static_cast<size_t>(size()));
  const std::uint32_t tag = next_tag();
  opts.setTag(tag);
  opts.setTimeout(timeout());
  call_collective(op, tag, [&] { ::gloo::allgather(opts); });
}

void GlooCommunicator::alltoall_bytes(std::string_view op, const void* send, void* recv,
                                      size_t block) {
  if (block == 0) return;
  const size_t total = block * static_cast<size_t>(size());
  if (size() == 1) {
    std::memmove(recv, send, total);
    return;
  }
  ::gloo::AlltoallOptions opts(ctx_);
  opts.setInput(static_cast<std::uint8_t*>(const_cast<void*>(send)), total);
  opts.setOutput(static_cast<std::uint8_t*>(recv), total);
  const std::uint32_t tag = next_tag();
  opts.setTag(tag);
  opts.setTimeout(timeout());
  call_collective(op, tag, [&] { ::gloo::alltoall(opts); });
}

CollectiveForTesting take_collective_for_testing(Communicator& comm) {
  auto* gloo = dynamic_cast<GlooCommunicator*>(&comm);
  if (gloo == nullptr)
    throw ConfigError("comm", "take_collective_for_testing: " + comm.name() + " is a " +
                                  std::string(comm.backend()) + " communicator, not gloo");
  auto [context, tag] = gloo->take_collective_for_testing();
  return {std::move(context), tag};
}

}  // namespace commgrid::gloo_backend
