// Communicator: what a group of ranks can do, independent of the engine behind it.
#pragma once

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/error.hpp"

namespace commgrid {

/// Element types of communication buffers.
enum class DataType : std::uint8_t {
  float32,
  float64,
  bfloat16,
  int32,
  int64,
  float16,
  int8,
  uint8
};
/// Reductions. bfloat16 and float16 buffers hold 16-bit values and are reduced in float32.
/// avg is the sum divided by the group size (as NCCL's ncclAvg); on integer types the
/// division truncates toward zero.
enum class ReduceOp : std::uint8_t { sum, max, min, prod, avg };

/// Bytes per element of a DataType.
constexpr std::size_t element_size(DataType t) noexcept {
  switch (t) {
    case DataType::float32: return 4;
    case DataType::float64: return 8;
    case DataType::bfloat16: return 2;
    case DataType::int32: return 4;
    case DataType::int64: return 8;
    case DataType::float16: return 2;
    case DataType::int8: return 1;
    case DataType::uint8: return 1;
  }
  return 0;
}
[[nodiscard]] std::string_view datatype_name(DataType t) noexcept;
[[nodiscard]] std::string_view reduce_op_name(ReduceOp op) noexcept;

/// bfloat16 <-> float32 conversions (round to nearest even), for backends that reduce
/// bfloat16 in float32.
float bf16_to_float(std::uint16_t v) noexcept;
std::uint16_t float_to_bf16(float f) noexcept;
/// IEEE 754 half precision <-> float32 (round to nearest even; subnormals, infinities and
/// NaN kept).
float fp16_to_float(std::uint16_t v) noexcept;
std::uint16_t float_to_fp16(float f) noexcept;

/// A bfloat16 value (the upper 16 bits of a float32), for typed buffers:
/// std::span<commgrid::bfloat16>.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) noexcept : bits(float_to_bf16(f)) {}
  explicit operator float() const noexcept { return bf16_to_float(bits); }
  static bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 v;
    v.bits = b;
    return v;
  }
  friend bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }
};
static_assert(sizeof(bfloat16) == 2);

/// An IEEE 754 half-precision value, for typed buffers: std::span<commgrid::float16>.
struct float16 {
  std::uint16_t bits = 0;
  float16() = default;
  explicit float16(float f) noexcept : bits(float_to_fp16(f)) {}
  explicit operator float() const noexcept { return fp16_to_float(bits); }
  static float16 from_bits(std::uint16_t b) noexcept {
    float16 v;
    v.bits = b;
    return v;
  }
  friend bool operator==(float16 a, float16 b) noexcept { return a.bits == b.bits; }
};
static_assert(sizeof(float16) == 2);

/// The DataType of a C++ element type; defined for the eight element types only.
template <class T>
struct DataTypeOf;
template <>
struct DataTypeOf<float> {
  static constexpr DataType value = DataType::float32;
};
template <>
struct DataTypeOf<double> {
  static constexpr DataType value = DataType::float64;
};
template <>
struct DataTypeOf<bfloat16> {
  static constexpr DataType value = DataType::bfloat16;
};
template <>
struct DataTypeOf<float16> {
  static constexpr DataType value = DataType::float16;
};
template <>
struct DataTypeOf<std::int32_t> {
  static constexpr DataType value = DataType::int32;
};
template <>
struct DataTypeOf<std::int64_t> {
  static constexpr DataType value = DataType::int64;
};
template <>
struct DataTypeOf<std::int8_t> {
  static constexpr DataType value = DataType::int8;
};
template <>
struct DataTypeOf<std::uint8_t> {
  static constexpr DataType value = DataType::uint8;
};

/// An element type a typed buffer may hold (const or not).
template <class T>
concept CommElement = requires {
  DataTypeOf<std::remove_cv_t<T>>::value;
};

/// The DataType of T: datatype_of<float> == DataType::float32.
template <CommElement T>
inline constexpr DataType datatype_of = DataTypeOf<std::remove_cv_t<T>>::value;

/// Default timeout of every rendezvous and collective: 30 minutes, as Megatron-core's
/// distributed_timeout_minutes.
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);

/// The handle of an operation. Blocking calls complete before returning, so their Work is
/// done at once. isend, irecv and batch_isend_irecv (and a GPU backend's collectives) return
/// a pending Work: wait() blocks until the operation completes or the communicator's
/// timeout (taken when the operation was posted) passes, then throws TimeoutError naming
/// the group and the peer. Buffers of a pending operation must stay valid and untouched
/// until wait() returns. A pending Work destroyed without wait() waits in its destructor
/// (bounded by the same timeout) and swallows errors: call wait() to see them.
class Work {
 public:
  Work() = default;
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  /// Blocks until the operation completes; throws TimeoutError or BackendError.
  virtual void wait() {}
  /// Whether the operation has completed (never blocks).
  [[nodiscard]] virtual bool done() const { return true; }
};

/// One group of Communicator::create_groups: what create_group takes.
struct GroupSpec {
  std::vector<Rank> members;  ///< ranks in the parent, ascending, including the caller
  std::string name;
  /// Optional: a number of this group, the same on each of its members and distinct among
  /// the groups of the batch over all ranks (ProcessGroups numbers a layout's groups);
  /// -1: none. A backend that must give each group a name its members agree on may derive
  /// it from this instead of a rendezvous (Gloo over kept connections).
  std::int64_t index = -1;
};

/// One point-to-point operation of a batch (torch.distributed's P2POp): a send of `count`
/// elements to `peer`, or a receive from it, with a tag (>= 0). `peer` is a rank of the
/// communicator the batch runs on (use Communicator::group_rank to map a global rank).
struct P2POp {
  enum class Kind : std::uint8_t { send, recv };
  Kind kind = Kind::send;
  void* buf = nullptr;  ///< read for a send, written for a receive
  std::size_t count = 0;
  DataType type = DataType::float32;
  Rank peer = 0;
  int tag = 0;

  static P2POp send(const void* buf, std::size_t count, DataType type, Rank peer, int tag = 0) {
    return {Kind::send, const_cast<void*>(buf), count, type, peer, tag};
  }
  static P2POp recv(void* buf, std::size_t count, DataType type, Rank peer, int tag = 0) {
    return {Kind::recv, buf, count, type, peer, tag};
  }
  template <CommElement T>
  static P2POp send(std::span<T> buf, Rank peer, int tag = 0) {
    return send(buf.data(), buf.size(), datatype_of<T>, peer, tag);
  }
  template <CommElement T>
  requires(!std::is_const_v<T>) static P2POp recv(std::span<T> buf, Rank peer, int tag = 0) {
    return recv(buf.data(), buf.size(), datatype_of<T>, peer, tag);
  }
};

/// A communicator over a group of ranks: the one contract every backend (MPI, Gloo, NCCL)
/// implements.
///
/// Every collective is collective: every rank of the group calls it with the same count,
/// type, op and root. Buffers are host memory unless a backend says otherwise. Ranks, sizes,
/// roots, peers and members are commgrid::Rank on every backend; a backend narrows them to
/// its engine's int only after the checks below have put them in [0, size()).
///
/// **Arguments are checked here, once, the same way on every backend**, before the backend
/// sees the call and before any communication, so that a mistake raises the same typed
/// error (and the CLI the same exit code, 2) whatever the engine. The message is
/// "<backend> <op> on <group>: <what is wrong, with the values>"; parameter() names the
/// argument:
///
// clang-format off
/// | mistake                                        | error               | parameter()           |
/// |------------------------------------------------|---------------------|-----------------------|
/// | null buffer with a count > 0                   | ConfigError         | send, recv or buf     |
/// | root, peer or member outside [0, size())       | RankOutOfRangeError | root, peer or members |
/// | tag < 0 or above max_tag()                     | InvalidValueError   | tag                   |
/// | a count above max_count(), a counts list of    | InvalidValueError   | count, send_counts,   |
/// | the wrong length, allgatherv's count !=        |                     | recv_counts           |
/// | recv_counts[rank()], alltoallv's block to this |                     |                       |
/// | rank sent and expected with different counts   |                     |                       |
/// | a typed buffer of the wrong size               | InvalidValueError   | send or recv          |
/// | a DataType or ReduceOp outside the enumeration | InvalidValueError   | type or op            |
/// | send and recv overlapping (allreduce and       | ConfigError         | recv                  |
/// | reduce on root allow the very same buffer);    |                     |                       |
/// | batch receives overlapping each other or a     |                     |                       |
/// | send of the batch                              |                     |                       |
/// | a blocking send or recv to this rank itself    | ConfigError         | peer                  |
/// | (it could only hang)                           |                     |                       |
/// | split color outside [0, 2^31), key outside     | InvalidValueError   | color or key          |
/// | int32                                          |                     |                       |
/// | members empty, not strictly ascending, or      | ConfigError         | members               |
/// | (create_group) without this rank               |                     |                       |
/// | a timeout <= 0                                 | InvalidValueError   | timeout               |
// clang-format on
///
/// What only happens on the wire is the backend's and is BackendError (TimeoutError when the
/// communicator's timeout passes, naming the ranks that did not arrive where the backend can
/// know them); every call has the communicator's timeout and checks the backend's return
/// codes. A backend implements the protected do_* functions; they are called only with
/// arguments that passed these checks.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// "mpi", "gloo", ...
  [[nodiscard]] virtual std::string_view backend() const noexcept = 0;
  /// The group's deterministic name, e.g. "world", "tp#3" (kind#group index).
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// This rank's rank in the group, 0 ... size()-1.
  [[nodiscard]] virtual Rank rank() const noexcept = 0;
  /// Number of ranks in the group.
  [[nodiscard]] virtual Rank size() const noexcept = 0;
  /// The timeout of every call on this communicator. A communicator made by split or
  /// create_group* starts with its parent's timeout.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Sets the timeout of every later call on this communicator (a call in flight keeps its
  /// own). Throws InvalidValueError for a timeout <= 0.
  void set_timeout(std::chrono::milliseconds timeout);
  /// Number of communicator-creation calls this object made on the backend so far
  /// (split, create_group, create_group_collective), for benchmarks.
  [[nodiscard]] std::int64_t creation_calls() const noexcept { return creation_calls_; }
  /// The largest tag point-to-point calls accept (MPI: the communicator's MPI_TAG_UB).
  [[nodiscard]] virtual int max_tag() const noexcept { return INT_MAX; }
  /// The largest element count (of one buffer, and of a counts list's sum) one call
  /// accepts (MPI: INT_MAX, its count type).
  [[nodiscard]] virtual std::size_t max_count() const noexcept { return SIZE_MAX; }

  /// Collective over this group: ranks with the same color form a new group, ordered by
  /// key (ties by rank). A rank passing no color takes part but gets nullptr. `name`
  /// names the new group of this rank. color in [0, 2^31), key fits an int32.
  [[nodiscard]] std::unique_ptr<Communicator> split(std::optional<std::int64_t> color,
                                                    std::int64_t key, std::string name);
  /// Only the members call it: creates the group of `members` (ranks in this group,
  /// ascending, including this rank); ranks outside do nothing. `name` must be the same on
  /// every member and unique among the groups created from this communicator.
  [[nodiscard]] std::unique_ptr<Communicator> create_group(std::span<const Rank> members,
                                                           std::string name);
  /// Collective over this group: every rank passes the groups it is a member of (none is
  /// fine), each as create_group takes it, and gets their communicators in that order. Every
  /// member of a group must list it in the same order relative to the other groups it shares
  /// with them (e.g. group kinds in one fixed order). A backend may make them all at once
  /// (Gloo: every rank publishes every group's addresses before it waits for any, and one
  /// barrier over this group ends the creation); otherwise it is create_group for each in
  /// turn. `created(i)`, when given, is called once group i is usable (for timings).
  [[nodiscard]] std::vector<std::unique_ptr<Communicator>> create_groups(
      std::span<const GroupSpec> groups, const std::function<void(std::size_t)>& created = {});
  /// Collective over this whole group (Megatron's new_group): every rank calls it with the
  /// same members (ascending); members get the new communicator, others nullptr. Ranks that
  /// pass different members or names fail on every rank.
  [[nodiscard]] std::unique_ptr<Communicator> create_group_collective(std::span<const Rank> members,
                                                                      std::string name);

  /// Collective: returns when every rank has entered.
  [[nodiscard]] std::unique_ptr<Work> barrier();
  /// Collective: `count` elements from root's buf to every rank's buf.
  [[nodiscard]] std::unique_ptr<Work> broadcast(void* buf, std::size_t count, DataType type,
                                                Rank root);
  /// Collective: recv = op over every rank's send (count elements). send == recv allowed
  /// (in place); otherwise they must not overlap.
  [[nodiscard]] std::unique_ptr<Work> allreduce(const void* send, void* recv, std::size_t count,
                                                DataType type, ReduceOp op);
  /// Collective: recv (size()*count elements) = every rank's send (count) in rank order.
  [[nodiscard]] std::unique_ptr<Work> allgather(const void* send, void* recv, std::size_t count,
                                                DataType type);
  /// Collective: reduces send (size()*count elements) and leaves block rank() (count
  /// elements) in recv.
  [[nodiscard]] std::unique_ptr<Work> reduce_scatter(const void* send, void* recv,
                                                     std::size_t count, DataType type, ReduceOp op);
  /// Collective: block j (count elements) of send goes to rank j; block i of recv comes
  /// from rank i. Both hold size()*count elements.
  [[nodiscard]] std::unique_ptr<Work> alltoall(const void* send, void* recv, std::size_t count,
                                               DataType type);
  /// Collective: block j of send (send_counts[j] elements, blocks packed in rank order)
  /// goes to rank j; block i of recv (recv_counts[i] elements) comes from rank i. Both
  /// count lists have size() entries; zeros are allowed. recv_counts[i] on this rank must
  /// equal send_counts[rank()] on rank i (checked here for i == rank()).
  [[nodiscard]] std::unique_ptr<Work> alltoallv(const void* send,
                                                std::span<const std::size_t> send_counts,
                                                void* recv,
                                                std::span<const std::size_t> recv_counts,
                                                DataType type);
  /// Collective: recv = every rank's send in rank order, rank i contributing
  /// recv_counts[i] elements (recv_counts[rank()] == count). Zeros allowed.
  [[nodiscard]] std::unique_ptr<Work> allgatherv(const void* send, std::size_t count, void* recv,
                                                 std::span<const std::size_t> recv_counts,
                                                 DataType type);
  /// Collective: root's recv = op over every rank's send (count elements). recv is only
  /// written on root (other ranks may pass nullptr). send == recv allowed on root.
  [[nodiscard]] std::unique_ptr<Work> reduce(const void* send, void* recv, std::size_t count,
                                             DataType type, ReduceOp op, Rank root);
  /// Collective: root's recv (size()*count elements) = every rank's send (count) in rank
  /// order. recv is only used on root (other ranks may pass nullptr).
  [[nodiscard]] std::unique_ptr<Work> gather(const void* send, void* recv, std::size_t count,
                                             DataType type, Rank root);
  /// Collective: block i (count elements) of root's send (size()*count elements) goes to
  /// rank i's recv. send is only read on root (other ranks may pass nullptr).
  [[nodiscard]] std::unique_ptr<Work> scatter(const void* send, void* recv, std::size_t count,
                                              DataType type, Rank root);

  /// Point to point, blocking: sends count elements to peer (a rank of this group, not this
  /// rank) with a tag >= 0. On Gloo a send returns only when the receiver has the data
  /// (synchronous, like MPI_Ssend): two ranks that both send first deadlock; use
  /// batch_isend_irecv.
  [[nodiscard]] std::unique_ptr<Work> send(const void* buf, std::size_t count, DataType type,
                                           Rank peer, int tag);
  /// Point to point, blocking: receives exactly count elements from peer (not this rank)
  /// with a tag.
  [[nodiscard]] std::unique_ptr<Work> recv(void* buf, std::size_t count, DataType type, Rank peer,
                                           int tag);
  /// Point to point, nonblocking: posts the send and returns a pending Work. Messages
  /// between two ranks with the same tag are received in the order they were posted.
  /// peer may be this rank (matched with this rank's own irecv).
  [[nodiscard]] std::unique_ptr<Work> isend(const void* buf, std::size_t count, DataType type,
                                            Rank peer, int tag);
  /// Point to point, nonblocking: posts the receive and returns a pending Work.
  [[nodiscard]] std::unique_ptr<Work> irecv(void* buf, std::size_t count, DataType type, Rank peer,
                                            int tag);
  /// Posts every operation of the batch, then returns one pending Work for all of them
  /// (torch's batch_isend_irecv, NCCL's group calls). Because nothing waits before
  /// everything is posted, any mix of sends and receives to any peers completes when the
  /// peers post theirs: a symmetric exchange, a ring shift both ways, a peer that is both
  /// next and previous stage. Not collective: only the ranks named take part. A receive's
  /// buffer must not overlap another operation's of the batch.
  [[nodiscard]] std::unique_ptr<Work> batch_isend_irecv(std::span<const P2POp> ops);

  // ---- members: group ranks and global ranks ---------------------------------------
  /// The global ranks (ranks of the world this communicator was created from) of the
  /// members, ascending: members()[i] is group rank i (torch's get_process_group_ranks).
  /// The world's members are 0 ... size()-1.
  [[nodiscard]] const std::vector<Rank>& members() const;
  /// The global rank of group rank r (torch's get_global_rank). Throws RankOutOfRangeError.
  [[nodiscard]] Rank global_rank(Rank group_rank) const;
  /// The group rank of a global rank (torch's get_group_rank). Throws RankOutOfRangeError
  /// naming the group when `global` is not a member.
  [[nodiscard]] Rank group_rank(Rank global) const;

  // ---- typed buffers: the DataType comes from the element type --------------------
  // Sizes are checked before any communication: a mismatch is an InvalidValueError naming
  // the operation, the group and both sizes.
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> broadcast(std::span<T> buf, Rank root) {
    return broadcast(buf.data(), buf.size(), datatype_of<T>, root);
  }
  /// In place: buf = op over every rank's buf.
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> allreduce(std::span<T> buf, ReduceOp op) {
    return allreduce(buf.data(), buf.data(), buf.size(), datatype_of<T>, op);
  }
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> allreduce(std::type_identity_t<std::span<const T>> send,
                                                std::span<T> recv, ReduceOp op) {
    check_typed("allreduce", "recv", recv.size(), send.size());
    return allreduce(send.data(), recv.data(), send.size(), datatype_of<T>, op);
  }
  /// recv holds size() * send.size() elements.
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> allgather(std::type_identity_t<std::span<const T>> send,
                                                std::span<T> recv) {
    check_typed("allgather", "recv", recv.size(), send.size() * group_size());
    return allgather(send.data(), recv.data(), send.size(), datatype_of<T>);
  }
  /// send holds size() * recv.size() elements.
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> reduce_scatter(std::type_identity_t<std::span<const T>> send,
                                                     std::span<T> recv, ReduceOp op) {
    check_typed("reduce_scatter", "send", send.size(), recv.size() * group_size());
    return reduce_scatter(send.data(), recv.data(), recv.size(), datatype_of<T>, op);
  }
  /// send and recv hold size() * block elements each.
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> alltoall(std::type_identity_t<std::span<const T>> send,
                                               std::span<T> recv) {
    check_typed("alltoall", "recv", recv.size(), send.size());
    check_typed("alltoall", "send", send.size(), send.size() / group_size() * group_size());
    return alltoall(send.data(), recv.data(), send.size() / group_size(), datatype_of<T>);
  }
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> alltoallv(std::type_identity_t<std::span<const T>> send,
                                                std::span<const std::size_t> send_counts,
                                                std::span<T> recv,
                                                std::span<const std::size_t> recv_counts) {
    check_counts("alltoallv", "send", send.size(), send_counts);
    check_counts("alltoallv", "recv", recv.size(), recv_counts);
    return alltoallv(send.data(), send_counts, recv.data(), recv_counts, datatype_of<T>);
  }
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> allgatherv(std::type_identity_t<std::span<const T>> send,
                                                 std::span<T> recv,
                                                 std::span<const std::size_t> recv_counts) {
    check_counts("allgatherv", "recv", recv.size(), recv_counts);
    check_typed("allgatherv", "send", send.size(), recv_counts[static_cast<std::size_t>(rank())]);
    return allgatherv(send.data(), send.size(), recv.data(), recv_counts, datatype_of<T>);
  }
  /// recv is used on root only (other ranks may pass an empty span).
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> reduce(std::type_identity_t<std::span<const T>> send,
                                             std::span<T> recv, ReduceOp op, Rank root) {
    if (rank() == root) check_typed("reduce", "recv", recv.size(), send.size());
    return reduce(send.data(), recv.data(), send.size(), datatype_of<T>, op, root);
  }
  /// recv (root only) holds size() * send.size() elements.
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> gather(std::type_identity_t<std::span<const T>> send,
                                             std::span<T> recv, Rank root) {
    if (rank() == root) check_typed("gather", "recv", recv.size(), send.size() * group_size());
    return gather(send.data(), recv.data(), send.size(), datatype_of<T>, root);
  }
  /// send (root only) holds size() * recv.size() elements.
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> scatter(std::type_identity_t<std::span<const T>> send,
                                              std::span<T> recv, Rank root) {
    if (rank() == root) check_typed("scatter", "send", send.size(), recv.size() * group_size());
    return scatter(send.data(), recv.data(), recv.size(), datatype_of<T>, root);
  }
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> send(std::span<T> buf, Rank peer, int tag = 0) {
    return send(buf.data(), buf.size(), datatype_of<T>, peer, tag);
  }
  template <CommElement T>
  requires(!std::is_const_v<T>)
      [[nodiscard]] std::unique_ptr<Work> recv(std::span<T> buf, Rank peer, int tag = 0) {
    return recv(buf.data(), buf.size(), datatype_of<T>, peer, tag);
  }
  template <CommElement T>
  [[nodiscard]] std::unique_ptr<Work> isend(std::span<T> buf, Rank peer, int tag = 0) {
    return isend(buf.data(), buf.size(), datatype_of<T>, peer, tag);
  }
  template <CommElement T>
  requires(!std::is_const_v<T>)
      [[nodiscard]] std::unique_ptr<Work> irecv(std::span<T> buf, Rank peer, int tag = 0) {
    return irecv(buf.data(), buf.size(), datatype_of<T>, peer, tag);
  }

 protected:
  Communicator(std::string name, std::chrono::milliseconds timeout)
      : name_(std::move(name)), timeout_(timeout) {}
  /// The members' global ranks, ascending (a backend sets them when it creates a group;
  /// unset means 0 ... size()-1).
  void set_members(std::vector<Rank> members) { members_ = std::move(members); }

  // ---- what a backend implements: called only with checked arguments ------------------
  /// Called after the timeout changed (set_timeout), for a backend whose engine keeps its
  /// own copy.
  virtual void timeout_changed(std::chrono::milliseconds /*timeout*/) {}
  virtual std::unique_ptr<Communicator> do_split(std::optional<std::int64_t> color,
                                                 std::int64_t key, std::string name) = 0;
  virtual std::unique_ptr<Communicator> do_create_group(std::span<const Rank> members,
                                                        std::string name) = 0;
  virtual std::unique_ptr<Communicator> do_create_group_collective(std::span<const Rank> members,
                                                                   std::string name) = 0;
  /// create_group for each in turn, unless the backend does better.
  virtual std::vector<std::unique_ptr<Communicator>> do_create_groups(
      std::span<const GroupSpec> groups, const std::function<void(std::size_t)>& created);
  virtual std::unique_ptr<Work> do_barrier() = 0;
  virtual std::unique_ptr<Work> do_broadcast(void* buf, std::size_t count, DataType type,
                                             Rank root) = 0;
  virtual std::unique_ptr<Work> do_allreduce(const void* send, void* recv, std::size_t count,
                                             DataType type, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> do_allgather(const void* send, void* recv, std::size_t count,
                                             DataType type) = 0;
  virtual std::unique_ptr<Work> do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                                  DataType type, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> do_alltoall(const void* send, void* recv, std::size_t count,
                                            DataType type) = 0;
  virtual std::unique_ptr<Work> do_alltoallv(const void* send,
                                             std::span<const std::size_t> send_counts, void* recv,
                                             std::span<const std::size_t> recv_counts,
                                             DataType type) = 0;
  virtual std::unique_ptr<Work> do_allgatherv(const void* send, std::size_t count, void* recv,
                                              std::span<const std::size_t> recv_counts,
                                              DataType type) = 0;
  virtual std::unique_ptr<Work> do_reduce(const void* send, void* recv, std::size_t count,
                                          DataType type, ReduceOp op, Rank root) = 0;
  virtual std::unique_ptr<Work> do_gather(const void* send, void* recv, std::size_t count,
                                          DataType type, Rank root) = 0;
  virtual std::unique_ptr<Work> do_scatter(const void* send, void* recv, std::size_t count,
                                           DataType type, Rank root) = 0;
  /// Posts the batch (isend and irecv are batches of one); `op` is the public call's name
  /// ("isend", "irecv", "batch_isend_irecv", or "send"/"recv" from the blocking defaults),
  /// for messages.
  virtual std::unique_ptr<Work> do_batch_isend_irecv(std::span<const P2POp> ops,
                                                     std::string_view op) = 0;
  /// A blocking send or receive (peer != rank()). By default the batch of one, waited for.
  virtual std::unique_ptr<Work> do_send(const P2POp& op);
  virtual std::unique_ptr<Work> do_recv(const P2POp& op);

 private:
  [[nodiscard]] std::size_t group_size() const noexcept { return static_cast<std::size_t>(size()); }
  /// Throws InvalidValueError "<backend> <op> on <group>: <what> holds N elements, needs M".
  void check_typed(const char* op, const char* what, std::size_t have, std::size_t need) const;
  /// Checks that counts has size() entries summing to `have`.
  void check_counts(const char* op, const char* what, std::size_t have,
                    std::span<const std::size_t> counts) const;
  /// The checks of point-to-point operation `o` of the public call `op`.
  void check_p2p(const P2POp& o, const char* op) const;

  std::string name_;
  std::chrono::milliseconds timeout_;
  std::int64_t creation_calls_ = 0;
  mutable std::vector<Rank> members_;
};

}  // namespace commgrid
