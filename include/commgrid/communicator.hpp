// Communicator: what a group of ranks can do, independent of the engine behind it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "commgrid/error.hpp"

namespace commgrid {

/// Element types of communication buffers.
enum class DataType : std::uint8_t { float32, float64, bfloat16, int32, int64 };
/// Reductions. bfloat16 buffers hold 16-bit values and are reduced in float32.
enum class ReduceOp : std::uint8_t { sum, max, min, prod };

/// Bytes per element of a DataType.
constexpr std::size_t element_size(DataType t) noexcept {
  switch (t) {
    case DataType::float32: return 4;
    case DataType::float64: return 8;
    case DataType::bfloat16: return 2;
    case DataType::int32: return 4;
    case DataType::int64: return 8;
  }
  return 0;
}
std::string_view datatype_name(DataType t) noexcept;
std::string_view reduce_op_name(ReduceOp op) noexcept;

/// Default timeout of every rendezvous and collective: 30 minutes, as Megatron-core's
/// distributed_timeout_minutes.
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);

/// A backend call failed. The message names the backend, the operation, the group and the
/// backend's own text: `mpi allreduce on tp#3: MPI_ERR_TRUNCATE: message truncated`.
class BackendError : public Error {
 public:
  using Error::Error;
};

/// A rendezvous or collective did not complete within its timeout. The message names the
/// group and, where the backend can tell, the ranks that did not arrive.
class TimeoutError : public BackendError {
 public:
  using BackendError::BackendError;
};

/// The handle of a collective. CPU backends complete before returning, so wait() returns at
/// once; a GPU backend returns a pending handle (as c10d's Work), and wait() blocks until
/// the operation completes or the timeout passes (TimeoutError).
class Work {
 public:
  Work() = default;
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  /// Blocks until the operation completes.
  virtual void wait() {}
  /// Whether the operation has completed.
  [[nodiscard]] virtual bool done() const { return true; }
};

/// A communicator over a group of ranks. Every collective is collective: every rank of the
/// group calls it with the same count, type, op and root. Buffers are host memory unless a
/// backend says otherwise; send and receive buffers of a collective may be the same pointer
/// only where a method says so. Every call has the communicator's timeout, checks the
/// backend's return code and throws BackendError (TimeoutError) naming the backend, the
/// operation and the group.
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
  [[nodiscard]] virtual int rank() const noexcept = 0;
  /// Number of ranks in the group.
  [[nodiscard]] virtual int size() const noexcept = 0;
  /// The timeout of every call on this communicator. A communicator made by split or
  /// create_group* starts with its parent's timeout.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Sets the timeout of every later call on this communicator (a call in flight keeps its
  /// own). A backend whose engine keeps its own copy overrides this and calls the base.
  virtual void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  /// Number of communicator-creation calls this object made on the backend so far
  /// (split, create_group, create_group_collective), for benchmarks.
  [[nodiscard]] std::int64_t creation_calls() const noexcept { return creation_calls_; }

  /// Collective over this group: ranks with the same color form a new group, ordered by
  /// key (ties by rank). A rank passing no color takes part but gets nullptr. `name`
  /// names the new group of this rank.
  virtual std::unique_ptr<Communicator> split(std::optional<std::int64_t> color,
                                              std::int64_t key, std::string name) = 0;
  /// Only the members call it: creates the group of `members` (ranks in this group,
  /// ascending, including this rank); ranks outside do nothing. `name` must be the same on
  /// every member and unique among the groups created from this communicator.
  virtual std::unique_ptr<Communicator> create_group(std::span<const int> members,
                                                     std::string name) = 0;
  /// Collective over this whole group (Megatron's new_group): every rank calls it with the
  /// same members; members get the new communicator, others nullptr.
  virtual std::unique_ptr<Communicator> create_group_collective(std::span<const int> members,
                                                                std::string name) = 0;

  /// Collective: returns when every rank has entered.
  virtual std::unique_ptr<Work> barrier() = 0;
  /// Collective: `count` elements from root's buf to every rank's buf.
  virtual std::unique_ptr<Work> broadcast(void* buf, std::size_t count, DataType type,
                                          int root) = 0;
  /// Collective: recv = op over every rank's send (count elements). send == recv allowed.
  virtual std::unique_ptr<Work> allreduce(const void* send, void* recv, std::size_t count,
                                          DataType type, ReduceOp op) = 0;
  /// Collective: recv (size()*count elements) = every rank's send (count) in rank order.
  virtual std::unique_ptr<Work> allgather(const void* send, void* recv, std::size_t count,
                                          DataType type) = 0;
  /// Collective: reduces send (size()*count elements) and leaves block rank() (count
  /// elements) in recv.
  virtual std::unique_ptr<Work> reduce_scatter(const void* send, void* recv,
                                               std::size_t count, DataType type,
                                               ReduceOp op) = 0;
  /// Collective: block j (count elements) of send goes to rank j; block i of recv comes
  /// from rank i. Both hold size()*count elements.
  virtual std::unique_ptr<Work> alltoall(const void* send, void* recv, std::size_t count,
                                         DataType type) = 0;
  /// Point to point: sends count elements to peer (a rank of this group) with a tag.
  virtual std::unique_ptr<Work> send(const void* buf, std::size_t count, DataType type,
                                     int peer, int tag) = 0;
  /// Point to point: receives count elements from peer with a tag.
  virtual std::unique_ptr<Work> recv(void* buf, std::size_t count, DataType type, int peer,
                                     int tag) = 0;

 protected:
  Communicator(std::string name, std::chrono::milliseconds timeout)
      : name_(std::move(name)), timeout_(timeout) {}
  void count_creation() noexcept { ++creation_calls_; }

 private:
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::int64_t creation_calls_ = 0;
};

/// bfloat16 <-> float32 conversions (round to nearest even), for backends that reduce
/// bfloat16 in float32.
float bf16_to_float(std::uint16_t v) noexcept;
std::uint16_t float_to_bf16(float f) noexcept;

}  // namespace commgrid
