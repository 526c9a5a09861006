#include "commgrid/communicator.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "commgrid/error.hpp"

namespace commgrid {

std::string_view datatype_name(DataType t) noexcept {
  switch (t) {
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
    case DataType::bfloat16: return "bfloat16";
    case DataType::int32: return "int32";
    case DataType::int64: return "int64";
    case DataType::float16: return "float16";
    case DataType::int8: return "int8";
    case DataType::uint8: return "uint8";
  }
  return "unknown";
}

std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
    case ReduceOp::avg: return "avg";
  }
  return "unknown";
}

float bf16_to_float(std::uint16_t v) noexcept {
  // bfloat16 is the upper half of a float32, so widening is exact.
  return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16);
}

std::uint16_t float_to_bf16(float f) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  // NaN: truncating could clear every mantissa bit left and turn it into infinity, so keep
  // the sign and force the quiet bit instead.
  if ((bits & 0x7fffffffU) > 0x7f800000U) return static_cast<std::uint16_t>((bits >> 16) | 0x0040U);
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit. A carry into the
  // exponent is the correct result (up to infinity for values above the largest bfloat16).
  const std::uint32_t rounding = 0x7fffU + ((bits >> 16) & 1U);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

float fp16_to_float(std::uint16_t v) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(v & 0x8000U) << 16;
  const std::uint32_t exp = (v >> 10) & 0x1fU;
  std::uint32_t mant = v & 0x3ffU;
  if (exp == 0x1f)  // infinity or NaN: all-ones exponent, mantissa kept
    return std::bit_cast<float>(sign | 0x7f800000U | (mant << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112U) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal half: normalize into a float32 exponent.
  int e = -1;
  do {
    ++e;
    mant <<= 1;
  } while ((mant & 0x400U) == 0);
  return std::bit_cast<float>(sign | (static_cast<std::uint32_t>(112 - e) << 23) |
                              ((mant & 0x3ffU) << 13));
}

std::uint16_t float_to_fp16(float f) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000U);
  const std::uint32_t abs = bits & 0x7fffffffU;
  if (abs > 0x7f800000U) return static_cast<std::uint16_t>(sign | 0x7e00U);   // NaN stays NaN
  if (abs >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // rounds to inf
  if (abs < 0x38800000U) {
    // Below the smallest normal half (2^-14): a subnormal or zero. Shift the full
    // significand right and round to nearest even on the bits shifted out.
    if (abs < 0x33000000U) return sign;  // below half the smallest subnormal: zero
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7fffffU) | 0x800000U;
    const std::uint32_t shift = 126U - exp;  // 14 + (127 - exp) - 1 ... into 10 bits
    std::uint32_t half = mant >> shift;
    const std::uint32_t rest = mant & ((1U << shift) - 1U);
    const std::uint32_t midpoint = 1U << (shift - 1U);
    if (rest > midpoint || (rest == midpoint && (half & 1U) != 0)) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even; a
  // carry into the exponent is the right result.
  const std::uint32_t rebased = abs - 0x38000000U;  // exponent 127 -> 15
  const std::uint32_t rounded = rebased + 0xfffU + ((rebased >> 13) & 1U);
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

const std::vector<Rank>& Communicator::members() const {
  if (members_.empty()) {
    members_.resize(static_cast<std::size_t>(size()));
    std::iota(members_.begin(), members_.end(), Rank{0});
  }
  return members_;
}

Rank Communicator::global_rank(Rank group_rank) const {
  if (group_rank < 0 || group_rank >= size())
    throw RankOutOfRangeError("group_rank", std::string(backend()) + " global_rank on " + name() +
                                                ": group rank " + std::to_string(group_rank) +
                                                " is not in [0, " + std::to_string(size()) + ")");
  return members()[static_cast<std::size_t>(group_rank)];
}

Rank Communicator::group_rank(Rank global) const {
  const auto& m = members();
  const auto it = std::find(m.begin(), m.end(), global);
  if (it == m.end())
    throw RankOutOfRangeError("global_rank", std::string(backend()) + " group_rank on " + name() +
                                                 ": global rank " + std::to_string(global) +
                                                 " is not a member of " + name());
  return static_cast<Rank>(it - m.begin());
}

void Communicator::check_typed(const char* op, const char* what, std::size_t have,
                               std::size_t need) const {
  if (have != need)
    throw InvalidValueError(what, std::string(backend()) + " " + op + " on " + name() + ": " +
                                      what + " holds " + std::to_string(have) +
                                      " elements, needs " + std::to_string(need) + " (group of " +
                                      std::to_string(size()) + ")");
}

void Communicator::check_counts(const char* op, const char* what, std::size_t have,
                                std::span<const std::size_t> counts) const {
  const std::string subject = std::string(backend()) + " " + op + " on " + name() + ": ";
  if (counts.size() != group_size())
    throw InvalidValueError(std::string(what) + "_counts",
                            subject + what + "_counts has " + std::to_string(counts.size()) +
                                " entries, needs one per rank (" + std::to_string(size()) + ")");
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  if (have != total)
    throw InvalidValueError(what, subject + what + " holds " + std::to_string(have) +
                                      " elements, " + what + "_counts sum to " +
                                      std::to_string(total));
}

// ---- the contract: every argument checked here, once, for every backend -------------------

namespace {

std::string subject(const Communicator& c, std::string_view op) {
  return std::string(c.backend()) + " " + std::string(op) + " on " + c.name() + ": ";
}

bool valid_type(DataType t) noexcept {
  return static_cast<std::uint8_t>(t) <= static_cast<std::uint8_t>(DataType::uint8);
}
bool valid_op(ReduceOp op) noexcept {
  return static_cast<std::uint8_t>(op) <= static_cast<std::uint8_t>(ReduceOp::avg);
}

// One call's argument checks, each raising the contract's error for its mistake.
class Checks {
 public:
  Checks(const Communicator& c, std::string_view op) : c_(c), op_(op) {}

  void type(DataType t) const {
    if (!valid_type(t))
      throw InvalidValueError("type", subject(c_, op_) + "DataType " +
                                          std::to_string(static_cast<int>(t)) +
                                          " is not one of commgrid's element types");
  }
  void op(ReduceOp op) const {
    if (!valid_op(op))
      throw InvalidValueError("op", subject(c_, op_) + "ReduceOp " +
                                        std::to_string(static_cast<int>(op)) +
                                        " is not one of commgrid's reductions");
  }
  void count(std::size_t n, const char* what = "count") const {
    if (n > c_.max_count())
      throw InvalidValueError(what, subject(c_, op_) + what + " " + std::to_string(n) +
                                        " exceeds " + std::to_string(c_.max_count()) +
                                        ", the largest count of one " + std::string(c_.backend()) +
                                        " call");
  }
  void buffer(const void* p, std::size_t n, const char* what) const {
    if (p == nullptr && n > 0)
      throw ConfigError(what, subject(c_, op_) + "null " + what + " buffer for " +
                                  std::to_string(n) + " elements");
  }
  void rank(Rank r, const char* what) const {
    if (r < 0 || r >= c_.size())
      throw RankOutOfRangeError(what, subject(c_, op_) + what + " " + std::to_string(r) +
                                          " is not in [0, " + std::to_string(c_.size()) + ")");
  }
  void tag(int t) const {
    if (t < 0 || t > c_.max_tag())
      throw InvalidValueError("tag", subject(c_, op_) + "tag " + std::to_string(t) +
                                         " is not in [0, " + std::to_string(c_.max_tag()) + "]");
  }
  // A counts list: one entry per rank, each and their sum within max_count(); returns the sum.
  std::size_t counts(std::span<const std::size_t> counts, const char* what) const {
    if (counts.size() != static_cast<std::size_t>(c_.size()))
      throw InvalidValueError(
          what, subject(c_, op_) + what + " has " + std::to_string(counts.size()) +
                    " entries, needs one per rank (" + std::to_string(c_.size()) + ")");
    std::size_t total = 0;
    for (std::size_t n : counts) {
      count(n, what);
      total += n;
      count(total, what);
    }
    return total;
  }
  // send and recv, each of `bytes` bytes, must not overlap; `same_ok`: unless they are the
  // very same buffer (in place).
  void apart(const void* send, std::size_t send_bytes, const void* recv, std::size_t recv_bytes,
             bool same_ok) const {
    if (send_bytes == 0 || recv_bytes == 0) return;
    if (same_ok && send == recv) return;
    if (!overlap(send, send_bytes, recv, recv_bytes)) return;
    if (same_ok)
      throw ConfigError("recv", subject(c_, op_) +
                                    "send and recv buffers overlap; pass the very "
                                    "same buffer (in place) or two that do not");
    throw ConfigError("recv", subject(c_, op_) +
                                  (send == recv ? "send and recv are the same buffer"
                                                : "send and recv buffers overlap") +
                                  "; only allreduce allows that (and reduce on root)");
  }
  // A collective over blocks of `count` elements: send holds `send_blocks` of them and recv
  // `recv_blocks` (1 or the group size), in separate buffers. (bytes() is below.)
  void blocks(DataType t, std::size_t n, const void* send, std::size_t send_blocks,
              const void* recv, std::size_t recv_blocks) const {
    type(t);
    count(n);
    count(n * std::max(send_blocks, recv_blocks));
    buffer(send, n, "send");
    buffer(recv, n, "recv");
    const std::size_t es = element_size(t);
    apart(send, n * send_blocks * es, recv, n * recv_blocks * es, false);
  }
  static bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
    const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
    return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
  }
  void members(std::span<const Rank> members, const std::string& name,
               bool must_contain_self) const {
    auto fail = [&](const std::string& why) {
      throw ConfigError("members", std::string(c_.backend()) + " " + std::string(op_) + " on " +
                                       c_.name() + " for " + name + ": " + why);
    };
    if (members.empty()) fail("members is empty");
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i] < 0 || members[i] >= c_.size())
        throw RankOutOfRangeError("members", std::string(c_.backend()) + " " + std::string(op_) +
                                                 " on " + c_.name() + " for " + name + ": member " +
                                                 std::to_string(members[i]) + " is not in [0, " +
                                                 std::to_string(c_.size()) + ")");
      if (i > 0 && members[i] <= members[i - 1])
        fail("members must be strictly ascending, got " + std::to_string(members[i - 1]) +
             " before " + std::to_string(members[i]));
    }
    if (must_contain_self && !std::binary_search(members.begin(), members.end(), c_.rank()))
      fail("this rank (" + std::to_string(c_.rank()) + ") is not among the members; " +
           (op_ == "create_groups" ? "a rank lists only its own groups"
                                   : "only members call create_group"));
  }

 private:
  const Communicator& c_;
  std::string_view op_;
};

std::size_t bytes(std::size_t count, DataType type) { return count * element_size(type); }

}  // namespace

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0)
    throw InvalidValueError("timeout", subject(*this, "set_timeout") +
                                           "timeout must be > 0 ms, got " +
                                           std::to_string(timeout.count()));
  timeout_ = timeout;
  timeout_changed(timeout);
}

std::unique_ptr<Communicator> Communicator::split(std::optional<std::int64_t> color,
                                                  std::int64_t key, std::string name) {
  const std::string where = std::string(backend()) + " split on " + name_ + " for " + name + ": ";
  if (color && (*color < 0 || *color > INT32_MAX))
    throw InvalidValueError("color", where + "color " + std::to_string(*color) + " is not in [0, " +
                                         std::to_string(INT32_MAX) + "]");
  if (key < INT32_MIN || key > INT32_MAX)
    throw InvalidValueError("key", where + "key " + std::to_string(key) + " does not fit an int32");
  ++creation_calls_;
  return do_split(color, key, std::move(name));
}

std::unique_ptr<Communicator> Communicator::create_group(std::span<const Rank> members,
                                                         std::string name) {
  Checks(*this, "create_group").members(members, name, true);
  ++creation_calls_;
  return do_create_group(members, std::move(name));
}

std::vector<std::unique_ptr<Communicator>> Communicator::create_groups(
    std::span<const GroupSpec> groups, const std::function<void(std::size_t)>& created) {
  for (const GroupSpec& g : groups) Checks(*this, "create_groups").members(g.members, g.name, true);
  creation_calls_ += static_cast<std::int64_t>(groups.size());
  return do_create_groups(groups, created);
}

std::vector<std::unique_ptr<Communicator>> Communicator::do_create_groups(
    std::span<const GroupSpec> groups, const std::function<void(std::size_t)>& created) {
  std::vector<std::unique_ptr<Communicator>> out;
  out.reserve(groups.size());
  for (std::size_t i = 0; i < groups.size(); ++i) {
    out.push_back(do_create_group(groups[i].members, groups[i].name));
    if (created) created(i);
  }
  return out;
}

std::unique_ptr<Communicator> Communicator::create_group_collective(std::span<const Rank> members,
                                                                    std::string name) {
  Checks(*this, "create_group_collective").members(members, name, false);
  ++creation_calls_;
  return do_create_group_collective(members, std::move(name));
}

std::unique_ptr<Work> Communicator::barrier() { return do_barrier(); }

std::unique_ptr<Work> Communicator::broadcast(void* buf, std::size_t count, DataType type,
                                              Rank root) {
  const Checks c(*this, "broadcast");
  c.type(type);
  c.count(count);
  c.rank(root, "root");
  c.buffer(buf, count, "buf");
  return do_broadcast(buf, count, type, root);
}

std::unique_ptr<Work> Communicator::allreduce(const void* send, void* recv, std::size_t count,
                                              DataType type, ReduceOp op) {
  const Checks c(*this, "allreduce");
  c.type(type);
  c.op(op);
  c.count(count);
  c.buffer(send, count, "send");
  c.buffer(recv, count, "recv");
  c.apart(send, bytes(count, type), recv, bytes(count, type), true);
  return do_allreduce(send, recv, count, type, op);
}

std::unique_ptr<Work> Communicator::allgather(const void* send, void* recv, std::size_t count,
                                              DataType type) {
  Checks(*this, "allgather").blocks(type, count, send, 1, recv, group_size());
  return do_allgather(send, recv, count, type);
}

std::unique_ptr<Work> Communicator::reduce_scatter(const void* send, void* recv, std::size_t count,
                                                   DataType type, ReduceOp op) {
  const Checks c(*this, "reduce_scatter");
  c.op(op);
  c.blocks(type, count, send, group_size(), recv, 1);
  return do_reduce_scatter(send, recv, count, type, op);
}

std::unique_ptr<Work> Communicator::alltoall(const void* send, void* recv, std::size_t count,
                                             DataType type) {
  Checks(*this, "alltoall").blocks(type, count, send, group_size(), recv, group_size());
  return do_alltoall(send, recv, count, type);
}

std::unique_ptr<Work> Communicator::alltoallv(const void* send,
                                              std::span<const std::size_t> send_counts, void* recv,
                                              std::span<const std::size_t> recv_counts,
                                              DataType type) {
  const Checks c(*this, "alltoallv");
  c.type(type);
  const std::size_t send_total = c.counts(send_counts, "send_counts");
  const std::size_t recv_total = c.counts(recv_counts, "recv_counts");
  const auto me = static_cast<std::size_t>(rank());
  if (send_counts[me] != recv_counts[me])
    throw InvalidValueError(
        "recv_counts", subject(*this, "alltoallv") + "rank " + std::to_string(me) + " sends " +
                           std::to_string(send_counts[me]) + " elements to itself (send_counts[" +
                           std::to_string(me) + "]) but expects " +
                           std::to_string(recv_counts[me]) + " (recv_counts[" + std::to_string(me) +
                           "])");
  c.buffer(send, send_total, "send");
  c.buffer(recv, recv_total, "recv");
  c.apart(send, bytes(send_total, type), recv, bytes(recv_total, type), false);
  return do_alltoallv(send, send_counts, recv, recv_counts, type);
}

std::unique_ptr<Work> Communicator::allgatherv(const void* send, std::size_t count, void* recv,
                                               std::span<const std::size_t> recv_counts,
                                               DataType type) {
  const Checks c(*this, "allgatherv");
  c.type(type);
  const std::size_t total = c.counts(recv_counts, "recv_counts");
  const std::size_t listed = recv_counts[static_cast<std::size_t>(rank())];
  if (count != listed)
    throw InvalidValueError("count", subject(*this, "allgatherv") + "rank " +
                                         std::to_string(rank()) + " sends " +
                                         std::to_string(count) + " elements but recv_counts[" +
                                         std::to_string(rank()) + "] is " + std::to_string(listed));
  c.buffer(send, count, "send");
  c.buffer(recv, total, "recv");
  c.apart(send, bytes(count, type), recv, bytes(total, type), false);
  return do_allgatherv(send, count, recv, recv_counts, type);
}

std::unique_ptr<Work> Communicator::reduce(const void* send, void* recv, std::size_t count,
                                           DataType type, ReduceOp op, Rank root) {
  const Checks c(*this, "reduce");
  c.type(type);
  c.op(op);
  c.count(count);
  c.rank(root, "root");
  c.buffer(send, count, "send");
  if (rank() == root) {
    c.buffer(recv, count, "recv");
    c.apart(send, bytes(count, type), recv, bytes(count, type), true);
  }
  return do_reduce(send, recv, count, type, op, root);
}

std::unique_ptr<Work> Communicator::gather(const void* send, void* recv, std::size_t count,
                                           DataType type, Rank root) {
  const Checks c(*this, "gather");
  c.type(type);
  c.count(count);
  c.count(count * group_size());
  c.rank(root, "root");
  c.buffer(send, count, "send");
  if (rank() == root) {
    c.buffer(recv, count, "recv");
    c.apart(send, bytes(count, type), recv, bytes(count * group_size(), type), false);
  }
  return do_gather(send, recv, count, type, root);
}

std::unique_ptr<Work> Communicator::scatter(const void* send, void* recv, std::size_t count,
                                            DataType type, Rank root) {
  const Checks c(*this, "scatter");
  c.type(type);
  c.count(count);
  c.count(count * group_size());
  c.rank(root, "root");
  c.buffer(recv, count, "recv");
  if (rank() == root) {
    c.buffer(send, count, "send");
    c.apart(send, bytes(count * group_size(), type), recv, bytes(count, type), false);
  }
  return do_scatter(send, recv, count, type, root);
}

void Communicator::check_p2p(const P2POp& o, const char* op) const {
  const Checks c(*this, op);
  if (o.kind != P2POp::Kind::send && o.kind != P2POp::Kind::recv)
    throw InvalidValueError("kind", subject(*this, op) + "P2POp kind " +
                                        std::to_string(static_cast<int>(o.kind)) +
                                        " is neither send nor recv");
  c.type(o.type);
  c.count(o.count);
  c.rank(o.peer, "peer");
  c.tag(o.tag);
  c.buffer(o.buf, o.count, "buf");
}

std::unique_ptr<Work> Communicator::send(const void* buf, std::size_t count, DataType type,
                                         Rank peer, int tag) {
  const P2POp o = P2POp::send(buf, count, type, peer, tag);
  check_p2p(o, "send");
  if (peer == rank())
    throw ConfigError("peer", subject(*this, "send") + "peer is this rank (" +
                                  std::to_string(peer) +
                                  "); a blocking send to itself could never complete: use "
                                  "isend/irecv or batch_isend_irecv");
  return do_send(o);
}

std::unique_ptr<Work> Communicator::recv(void* buf, std::size_t count, DataType type, Rank peer,
                                         int tag) {
  const P2POp o = P2POp::recv(buf, count, type, peer, tag);
  check_p2p(o, "recv");
  if (peer == rank())
    throw ConfigError("peer", subject(*this, "recv") + "peer is this rank (" +
                                  std::to_string(peer) +
                                  "); a blocking recv from itself could never complete: use "
                                  "isend/irecv or batch_isend_irecv");
  return do_recv(o);
}

std::unique_ptr<Work> Communicator::isend(const void* buf, std::size_t count, DataType type,
                                          Rank peer, int tag) {
  const P2POp o = P2POp::send(buf, count, type, peer, tag);
  check_p2p(o, "isend");
  return do_batch_isend_irecv(std::span<const P2POp>(&o, 1), "isend");
}

std::unique_ptr<Work> Communicator::irecv(void* buf, std::size_t count, DataType type, Rank peer,
                                          int tag) {
  const P2POp o = P2POp::recv(buf, count, type, peer, tag);
  check_p2p(o, "irecv");
  return do_batch_isend_irecv(std::span<const P2POp>(&o, 1), "irecv");
}

namespace {

// The first two operations of a batch whose buffers overlap while one of them is a receive
// (they run at once, so that is a race); nullopt when there are none. Small batches (the
// usual pipeline exchange of 2-4) are compared pairwise without allocating; larger ones are
// sorted by address and swept once.
std::optional<std::pair<std::size_t, std::size_t>> overlapping_receive(std::span<const P2POp> ops) {
  auto range = [&](std::size_t i) {
    const auto b = reinterpret_cast<std::uintptr_t>(ops[i].buf);
    return std::pair<std::uintptr_t, std::uintptr_t>{b, b + bytes(ops[i].count, ops[i].type)};
  };
  auto clash = [&](std::size_t i, std::size_t j) {
    if (ops[i].kind != P2POp::Kind::recv && ops[j].kind != P2POp::Kind::recv) return false;
    const auto [bi, ei] = range(i);
    const auto [bj, ej] = range(j);
    return bi < ei && bj < ej && bi < ej && bj < ei;
  };
  if (ops.size() <= 8) {
    for (std::size_t i = 0; i < ops.size(); ++i)
      for (std::size_t j = i + 1; j < ops.size(); ++j)
        if (clash(i, j)) return std::pair{i, j};
    return std::nullopt;
  }
  struct Range {
    std::uintptr_t begin, end;
    bool recv;
    std::size_t index;
  };
  std::vector<Range> ranges;
  ranges.reserve(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const auto [b, e] = range(i);
    if (b < e) ranges.push_back({b, e, ops[i].kind == P2POp::Kind::recv, i});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& x, const Range& y) { return x.begin < y.begin; });
  // The range that reaches furthest so far overlaps every later range that begins before
  // its end; only a pair with a receive in it is a clash.
  const Range* reach = nullptr;
  for (const Range& r : ranges) {
    if (reach != nullptr && r.begin < reach->end && (r.recv || reach->recv))
      return std::pair{std::min(reach->index, r.index), std::max(reach->index, r.index)};
    if (reach == nullptr || r.end > reach->end) reach = &r;
  }
  return std::nullopt;
}

}  // namespace

std::unique_ptr<Work> Communicator::batch_isend_irecv(std::span<const P2POp> ops) {
  for (const P2POp& o : ops) check_p2p(o, "batch_isend_irecv");
  if (const auto pair = overlapping_receive(ops))
    throw ConfigError("buf", subject(*this, "batch_isend_irecv") + "operations " +
                                 std::to_string(pair->first) + " and " +
                                 std::to_string(pair->second) +
                                 " use overlapping buffers and one of them is a receive; a "
                                 "receive's buffer must not overlap any other buffer of the "
                                 "batch");
  return do_batch_isend_irecv(ops, "batch_isend_irecv");
}

std::unique_ptr<Work> Communicator::do_send(const P2POp& op) {
  auto work = do_batch_isend_irecv(std::span<const P2POp>(&op, 1), "send");
  work->wait();
  return work;
}

std::unique_ptr<Work> Communicator::do_recv(const P2POp& op) {
  auto work = do_batch_isend_irecv(std::span<const P2POp>(&op, 1), "recv");
  work->wait();
  return work;
}

}  // namespace commgrid
