// The host-side parts of the NCCL backend, apart from the device so that they are tested on
// machines without a GPU: the exchanges over the bootstrap communicator (unique ids, host
// names and devices), device choice, the texts of errors, and the decisions the device code
// takes (where a buffer may be used, what one look at a pending operation means, who may
// touch a communicator that another thread can abort).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "commgrid/communicator.hpp"

namespace commgrid::nccl_host {

/// An ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES), opaque here.
inline constexpr std::size_t kUniqueIdBytes = 128;
using UniqueId = std::array<unsigned char, kUniqueIdBytes>;

/// The bootstrap tag of unique-id messages, and their length in int64 words (status, name
/// hash, id, error text).
inline constexpr int kUniqueIdTag = 0x6e63636c;  // "nccl"
inline constexpr std::size_t kIdMessageWords = 2 + kUniqueIdBytes / 8 + 25;

/// Makes a unique id, or throws (BackendError with NCCL's text). On the ranks that make one.
using MakeUniqueId = std::function<UniqueId()>;

/// Collective over `bootstrap`: `root` calls make() and every rank returns its id. When
/// make() throws on root, every rank throws BackendError carrying root's message (cut to
/// 200 bytes), so no rank waits for an id that never comes.
UniqueId broadcast_unique_id(Communicator& bootstrap, int root, const MakeUniqueId& make,
                             const std::string& what);

/// Only the members call it: `members` are ranks of `bootstrap`, ascending, this rank among
/// them. The first member calls make() and sends the id, with a hash of `name`, to every other
/// member at once (batch_isend_irecv); the others receive it. A member whose name differs
/// from the first member's throws BackendError naming both; a failing make() is reported to
/// every member.
UniqueId distribute_unique_id(Communicator& bootstrap, std::span<const int> members,
                              const std::string& name, const MakeUniqueId& make);

/// What one rank says about itself before the NCCL world is made.
struct HostInfo {
  std::string host;        ///< host name
  int device_count = 0;    ///< CUDA devices the process sees
  int device = -1;         ///< the device it chose (-1: none)
  std::string bus_id;      ///< that device's PCI bus id; empty without one
  std::string problem;     ///< why this rank cannot take part; empty when it can
};

/// Collective over `bootstrap`: every rank's HostInfo, in rank order (host names cut to 63
/// bytes, bus ids to 31, problems to 200).
std::vector<HostInfo> exchange_host_info(Communicator& bootstrap, const HostInfo& mine);

/// This rank's local rank and the number of ranks on its host, from exchanged host names.
struct LocalRank {
  int rank = 0;
  int size = 1;
};
LocalRank local_rank_of(const std::vector<HostInfo>& all, int rank);

/// The device of a rank: `requested` when given (InvalidValueError when it is not below
/// device_count), else the local rank, or 0 when the process sees exactly one device
/// (CUDA_VISIBLE_DEVICES per rank). Throws BackendError "no CUDA device ..." when
/// device_count is 0 (with `why`), and InvalidValueError when the local rank has no device
/// of its own.
int choose_device(std::optional<int> requested, LocalRank local, int device_count,
                  const std::string& host, const std::string& why);

/// The first problem among the exchanged infos, the same text on every rank: a rank's own
/// problem ("rank 3 (host gpu7): no CUDA device ..."), or two ranks of one host on one
/// device ("ranks 0 and 1 on host gpu7 both chose CUDA device 0 (bus 0000:3b:00.0); NCCL
/// needs one GPU per rank"): of all such pairs, the one whose first rank is lowest, then
/// whose second is. Empty when every rank can take part. O(W log W): a sort of one 64-bit
/// hash per rank (names compared only where hashes are equal), so that every rank of a
/// 10^6-rank world can afford it.
std::string world_problem(const std::vector<HostInfo>& all);

/// world_problem as first written: every pair of ranks compared, O(W^2). The reference that
/// the tests and bench/bench_nccl_world compare world_problem with; not used by the backend.
std::string world_problem_pairwise(const std::vector<HostInfo>& all);

/// What cudaPointerGetAttributes says a buffer is.
enum class MemoryKind : std::uint8_t {
  host,         ///< pageable host memory (cudaMemoryTypeUnregistered, or no answer)
  pinned_host,  ///< page-locked host memory (cudaMemoryTypeHost)
  device,       ///< device memory of `device` (cudaMemoryTypeDevice)
  managed,      ///< managed memory (cudaMemoryTypeManaged): any device may use it
};

/// Whether NCCL may use a buffer in place (true: device memory of the communicator's device,
/// or managed memory) or it is host memory to stage through the device (false). Device memory
/// of another device is ConfigError naming `what`: "nccl allreduce on world: send buffer is
/// memory of CUDA device 1, and this communicator's device is 0". Rank-threads share one
/// address space, so such a pointer would reach NCCL, whose kernels would fault with an
/// illegal address (a sticky error that ends every rank of the process).
bool use_in_place(MemoryKind kind, int buffer_device, int comm_device, const std::string& op,
                  const std::string& group, const std::string& what);

/// One look at a pending operation, each fact read after the one before it: the event first,
/// so that whatever made the operation's kernels end early (an abort, an NCCL error) is seen.
struct WorkLook {
  bool event_done = false;   ///< cudaEventQuery: cudaSuccess
  bool event_error = false;  ///< cudaEventQuery: neither cudaSuccess nor cudaErrorNotReady
  bool aborted = false;      ///< the communicator was (or is being) aborted
  bool nccl_error = false;   ///< ncclCommGetAsyncError: an error
  bool past_deadline = false;
};

/// What a look means, in this order: a CUDA error; an abort (an aborted operation's kernels
/// exit early and its event completes, so a completed event says nothing about the result);
/// an NCCL error (NCCL stops the kernels of a failed communicator too); completion; the
/// deadline; else still pending.
enum class WorkVerdict : std::uint8_t { pending, complete, cuda_error, aborted, nccl_error, timed_out };
WorkVerdict judge(const WorkLook& look) noexcept;

/// A handle (an NCCL communicator) used by one thread at a time that any thread may abort.
/// use() runs each call on the handle under a lock; abort() first marks the handle as
/// stopping (so that polling loops end at their next look), then takes the lock, which waits
/// for the call in progress, and destroys the handle under it. So no call ever runs on a
/// destroyed handle, and when abort() returns, on any thread and whether or not it was the
/// first, the destruction is complete. Never call abort() from inside use().
template <class Handle>
class AbortableHandle {
 public:
  using Destroy = std::function<void(Handle)>;
  AbortableHandle(Handle handle, Destroy destroy)
      : handle_(handle), destroy_(std::move(destroy)) {}
  AbortableHandle(const AbortableHandle&) = delete;
  AbortableHandle& operator=(const AbortableHandle&) = delete;

  /// fn(handle) under the lock, and its result; nullopt without calling fn once the handle is
  /// stopping, aborted or released.
  template <class F>
  auto use(F&& fn) -> std::optional<std::invoke_result_t<F, Handle>> {
    if (stopping_.load()) return std::nullopt;
    std::lock_guard lock(mutex_);
    if (stopping_.load() || handle_ == Handle{}) return std::nullopt;
    return fn(handle_);
  }

  /// Marks the handle aborted with `reason` (the first reason wins), waits for the call in
  /// progress and destroys the handle. Returns whether this call destroyed it.
  bool abort(const std::string& reason) noexcept {
    bool expected = false;
    if (stopping_.compare_exchange_strong(expected, true)) {
      std::lock_guard lock(reason_mutex_);
      try {
        reason_ = reason;
      } catch (...) {  // out of memory: the abort matters more than its reason
      }
    }
    std::lock_guard lock(mutex_);
    if (handle_ == Handle{}) return false;
    const Handle h = handle_;
    handle_ = Handle{};
    destroy_(h);
    return true;
  }

  /// Takes the handle out (for an orderly destruction by the owner); empty once aborted.
  Handle release() noexcept {
    std::lock_guard lock(mutex_);
    return std::exchange(handle_, Handle{});
  }

  /// The handle without the lock, for callers that call NCCL directly (native()); empty once
  /// aborted or released.
  Handle peek() const noexcept {
    std::lock_guard lock(mutex_);
    return handle_;
  }

  /// Whether abort() was called (its destruction may still be under way).
  [[nodiscard]] bool aborted() const noexcept { return stopping_.load(); }
  [[nodiscard]] std::string reason() const {
    std::lock_guard lock(reason_mutex_);
    return reason_;
  }

 private:
  mutable std::mutex mutex_;  // held by each use() and by the destruction
  Handle handle_;
  Destroy destroy_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex reason_mutex_;
  std::string reason_;
};

/// "[0,1,2,3]", at most 16 ranks then ",... (N ranks)".
std::string members_text(std::span<const std::int64_t> members);

/// The message of a creation or operation that did not complete in time:
/// "nccl <op> on <group> for <target>: did not complete within <t>; <aborted> aborted
/// (members [..])". `target` may be empty (an operation on the group itself).
std::string timeout_message(const std::string& op, const std::string& group,
                            const std::string& target, std::chrono::milliseconds timeout,
                            const std::string& aborted,
                            std::span<const std::int64_t> members);

}  // namespace commgrid::nccl_host
