// The host-side parts of the NCCL backend, apart from the device so that they are tested on
// machines without a GPU: the exchanges over the bootstrap communicator (unique ids, host
// names and devices), device choice, the texts of errors, and the decisions the device code
// takes (where a buffer may be used, what one look at a pending operation means, who may
// touch a communicator that another thread can abort).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
UniqueId broadcast_unique_id(Communicator& bootstrap, Rank root, const MakeUniqueId& make,
                             const std::string& what);

/// Only the members call it: `members` are ranks of `bootstrap`, ascending, this rank among
/// them. The first member calls make() and sends the id, with a hash of `name`, to every other
/// member at once (batch_isend_irecv); the others receive it. A member whose name differs
/// from the first member's throws BackendError naming both; a failing make() is reported to
/// every member.
UniqueId distribute_unique_id(Communicator& bootstrap, std::span<const Rank> members,
                              const std::string& name, const MakeUniqueId& make);

/// What one rank says about itself before the NCCL world is made.
struct HostInfo {
  std::string host;      ///< host name
  int device_count = 0;  ///< CUDA devices the process sees
  int device = -1;       ///< the device it chose (-1: none)
  std::string bus_id;    ///< that device's PCI bus id; empty without one
  std::string problem;   ///< why this rank cannot take part; empty when it can
};

/// Collective over `bootstrap`: every rank's HostInfo, in rank order (host names cut to 63
/// bytes, bus ids to 31, problems to 200).
std::vector<HostInfo> exchange_host_info(Communicator& bootstrap, const HostInfo& mine);

/// This rank's local rank and the number of ranks on its host, from exchanged host names.
struct LocalRank {
  int rank = 0;
  int size = 1;
};
LocalRank local_rank_of(const std::vector<HostInfo>& all, Rank rank);

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
  host,         ///< pageable host memory (cudaMemoryTypeUnregistered)
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
  /// NCCL's state was not read: another thread held the communicator (a call in progress),
  /// and this look (done()'s) does not wait for it.
  bool nccl_unknown = false;
  bool past_deadline = false;
};

/// What a look means, in this order: a CUDA error; an abort (an aborted operation's kernels
/// exit early and its event completes, so a completed event says nothing about the result);
/// an NCCL error (NCCL stops the kernels of a failed communicator too); NCCL's state unread
/// (pending: a completed event proves nothing while an NCCL error may be unseen); completion;
/// the deadline; else still pending.
enum class WorkVerdict : std::uint8_t {
  pending,
  complete,
  cuda_error,
  aborted,
  nccl_error,
  timed_out
};
WorkVerdict judge(const WorkLook& look) noexcept;

/// What AbortableHandle::try_use found.
enum class TryUse : std::uint8_t {
  ran,      ///< fn ran on the handle; the value is its result
  busy,     ///< another thread holds the handle (a call, or a destruction, in progress)
  stopped,  ///< the handle is stopping, aborted or released: fn was not called
};

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
  AbortableHandle(Handle handle, Destroy destroy) : handle_(handle), destroy_(std::move(destroy)) {}
  /// Takes over what `owned` owns, to be destroyed by its deleter (on abort()). `owned` gives
  /// it up only once nothing here can throw any more, so that a failure on the way (an
  /// allocation of the deleter's copy) leaves it with its owner, which destroys it.
  template <class T, class Deleter>
  requires std::is_same_v<T*, Handle>
  explicit AbortableHandle(std::unique_ptr<T, Deleter>&& owned)
      : handle_(owned.get()), destroy_([d = owned.get_deleter()](Handle h) { d(h); }) {
    (void)owned.release();
  }
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

  /// use() that never waits: fn(handle) only if the lock is free at once (try_lock). For
  /// looks that must not block (Work::done()): while another thread's call or abort holds
  /// the handle it answers busy; once the handle is stopping, stopped.
  template <class F>
  auto try_use(F&& fn) -> std::pair<TryUse, std::optional<std::invoke_result_t<F, Handle>>> {
    if (stopping_.load()) return {TryUse::stopped, std::nullopt};
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return {stopping_.load() ? TryUse::stopped : TryUse::busy, std::nullopt};
    if (stopping_.load() || handle_ == Handle{}) return {TryUse::stopped, std::nullopt};
    return {TryUse::ran, fn(handle_)};
  }

  /// Marks the handle stopping with `reason` (the first reason wins), as abort() does, but
  /// does not destroy it: from now on use() and try_use() refuse it and aborted() is true, so
  /// that other threads' looks end and report it aborted, while its owner makes a last use
  /// of it with use_stopping() (a shrink, which ends the handle's operations in flight);
  /// abort() destroys it afterwards.
  void stop(const std::string& reason) noexcept {
    bool expected = false;
    if (stopping_.compare_exchange_strong(expected, true)) {
      std::lock_guard lock(reason_mutex_);
      try {
        reason_ = reason;
      } catch (...) {  // out of memory: stopping matters more than its reason
      }
    }
  }

  /// fn(handle) under the lock even while the handle is stopping (after stop()); nullopt
  /// without calling fn once it is destroyed or released.
  template <class F>
  auto use_stopping(F&& fn) -> std::optional<std::invoke_result_t<F, Handle>> {
    std::lock_guard lock(mutex_);
    if (handle_ == Handle{}) return std::nullopt;
    return fn(handle_);
  }

  /// Marks the handle aborted with `reason` (the first reason wins), waits for the call in
  /// progress and destroys the handle. Returns whether this call destroyed it.
  bool abort(const std::string& reason) noexcept {
    stop(reason);
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

  /// The handle, for callers that call NCCL directly (native()); empty once aborted or
  /// released. It is read under the lock, so it waits for a call or a destruction in
  /// progress; what the caller then does with it is not guarded (an abort may destroy it).
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

/// Whether an NCCL integer variable's value turns its feature on as NCCL reads it: set, not
/// empty, and not 0 ("0", "00", "+0"). NCCL parses such values with strtoll; a value that is
/// not a number is counted as on, so that it is refused rather than guessed at.
bool nccl_flag_on(const char* value) noexcept;

/// Refuses the NCCL environment variables that NCCL reads over the configuration commgrid
/// gives it (NCCL 2.28 init.cc, envConfigOverride), and that would undo what this backend
/// relies on: ConfigError whose parameter() is the variable, with its value and what it
/// breaks. NCCL_COMM_BLOCKING on: NCCL's creation and calls would block, unbounded by any
/// timeout. NCCL_COMM_SPLIT_SHARE_RESOURCES on: a split's child would share its parent's
/// resources and abort flag, so that one group's abort (a timeout) would abort the other.
/// `what` starts the message ("nccl world", "nccl split on world for tp#0"). Read with
/// std::getenv at each creation, before anything is sent.
/// With `shrink`, NCCL_COMM_SHRINK_SHARE_RESOURCES on is refused too: a shrunk world would
/// share the old world's resources and abort flag, and the old world is aborted after the
/// shrink.
void check_nccl_environment(const std::string& what, bool shrink = false);

/// The size of a block that holds `bytes`: powers of two from 4 KiB.
std::size_t size_class(std::size_t bytes) noexcept;

/// How many blocks of one size class each user of a BlockCache wants kept.
struct Seed {
  std::size_t cls = 0;       ///< a size_class()
  std::size_t per_user = 0;  ///< blocks of that class per attached user
};

/// Free blocks of one kind of memory (pinned host memory, or one device's), by size class.
/// Blocks are never given back to CUDA, because cudaFreeHost and cudaFree synchronize the
/// device (they would wait, without a timeout, for every pending operation on it). So that
/// this does not grow without end, the cache makes blocks for its users only up to what the
/// users alive at once asked for: attach() makes blocks until the cache owns `per_user` of a
/// class for each attached user; detach() leaves the blocks to the next user. Blocks made on
/// a miss (take_or_make) count as owned too. Thread-safe; `make` runs outside the lock.
class BlockCache {
 public:
  /// Makes a block of `bytes` (CUDA's allocation), or throws.
  using Make = std::function<void*(std::size_t bytes)>;

  /// A block and its size class.
  struct Block {
    void* ptr = nullptr;
    std::size_t cls = 0;
  };
  /// A free block of class `cls`, else of the smallest larger class that has one free (a
  /// bigger block beats an allocation that may synchronize), else one of `cls` made now.
  /// Give it back with its own class.
  Block take_or_make(std::size_t cls, const Make& make);
  /// Gives a block back for reuse.
  void give(void* block, std::size_t cls);
  /// A block that will not come back (still used by copies of an operation that failed).
  void lose(std::size_t cls) noexcept;
  /// One more user: makes the blocks `seed` asks for that the cache does not own yet. On a
  /// failure of `make` the user is not attached, the blocks made are kept, and it rethrows.
  void attach(std::span<const Seed> seed, const Make& make);
  /// One user fewer; its blocks stay.
  void detach() noexcept;

  [[nodiscard]] std::size_t free_blocks(std::size_t cls) const;
  [[nodiscard]] std::size_t owned_blocks(std::size_t cls) const;
  [[nodiscard]] int users() const;
  /// Blocks made since the cache was created.
  [[nodiscard]] std::size_t made() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
  std::map<std::size_t, std::size_t> owned_;
  int users_ = 0;
  std::size_t made_ = 0;
};

/// The communicators of one epoch: a world and every group made from it (directly or from
/// its groups), so that recovery can abort them all at once. It holds them weakly (a group
/// that is gone is skipped). Once abort_all() was called, a member added later (a group whose
/// creation was under way on another thread) is aborted as it is added: nothing of an
/// aborted epoch outlives it alive. Thread-safe; `abort` runs outside the lock, one member
/// after another, so that a member's abort that waits for its call in progress never holds
/// up add() or another thread's abort_all().
template <class Member>
class EpochMembers {
 public:
  /// Aborts one member with a reason; returns whether this call aborted it (false when it
  /// was aborted before).
  using Abort = std::function<bool(Member&, const std::string&)>;
  explicit EpochMembers(Abort abort) : abort_(std::move(abort)) {}
  EpochMembers(const EpochMembers&) = delete;
  EpochMembers& operator=(const EpochMembers&) = delete;

  /// Adds a member; aborts it at once (with the epoch's reason) when the epoch was aborted.
  void add(const std::shared_ptr<Member>& m) {
    std::string late;
    {
      std::lock_guard lock(mutex_);
      if (!aborted_) {
        // Members that are gone make room, so that an epoch with many short-lived groups
        // does not grow without end.
        std::erase_if(members_, [](const std::weak_ptr<Member>& w) { return w.expired(); });
        members_.push_back(m);
        return;
      }
      late = reason_;
    }
    (void)abort_(*m, late);
  }

  /// Aborts every member still alive but `keep` (nullptr: every one) and marks the epoch
  /// aborted (when `keep` is nullptr); returns how many this call aborted. Idempotent: the
  /// members aborted before count 0, and the first reason stays the epoch's.
  std::size_t abort_all(const std::string& reason, const Member* keep = nullptr) {
    std::vector<std::shared_ptr<Member>> alive;
    {
      std::lock_guard lock(mutex_);
      if (keep == nullptr && !aborted_) {
        aborted_ = true;
        reason_ = reason;
      }
      for (const std::weak_ptr<Member>& w : members_)
        if (auto m = w.lock(); m && m.get() != keep) alive.push_back(std::move(m));
    }
    std::size_t n = 0;
    for (const auto& m : alive)
      if (abort_(*m, reason)) ++n;
    return n;
  }

  /// Whether abort_all() (without `keep`) was called.
  [[nodiscard]] bool aborted() const {
    std::lock_guard lock(mutex_);
    return aborted_;
  }
  /// Members still alive.
  [[nodiscard]] std::size_t alive() const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(
        std::count_if(members_.begin(), members_.end(),
                      [](const std::weak_ptr<Member>& w) { return !w.expired(); }));
  }

 private:
  Abort abort_;
  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<Member>> members_;
  bool aborted_ = false;
  std::string reason_;
};

/// What a shrink of a world of `size` ranks that leaves out `exclude` makes of this rank.
struct WorldShrink {
  std::vector<int> exclude;     ///< ascending, no duplicates (NCCL's excludeRanksList)
  Rank rank = 0;                ///< this rank in the new world
  Rank size = 0;                ///< the new world's size
  std::vector<Rank> survivors;  ///< the old ranks, by new rank (NCCL keeps their order)
};

/// Checks a shrink's arguments on a surviving rank, before anything is sent: every excluded
/// rank in [0, size) (RankOutOfRangeError "exclude"), none twice (InvalidValueError
/// "exclude"), and `rank` not excluded (InvalidValueError "exclude": an excluded rank takes
/// no part in a shrink, as NCCL requires). `what` starts the messages ("nccl shrink of
/// world").
WorldShrink plan_world_shrink(Rank size, Rank rank, std::span<const Rank> exclude,
                              const std::string& what);

/// "[0,1,2,3]", at most 16 ranks then ",... (N ranks)".
std::string members_text(std::span<const std::int64_t> members);

/// The message of a creation or operation that did not complete in time:
/// "nccl <op> on <group> for <target>: did not complete within <t>; <aborted> aborted
/// (members [..])". `target` may be empty (an operation on the group itself).
std::string timeout_message(const std::string& op, const std::string& group,
                            const std::string& target, std::chrono::milliseconds timeout,
                            const std::string& aborted, std::span<const std::int64_t> members);

}  // namespace commgrid::nccl_host
