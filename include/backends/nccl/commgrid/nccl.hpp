// The NCCL backend: commgrid's Communicator on GPUs, over NCCL communicators made from any
// commgrid Communicator (an MPI or Gloo world) as bootstrap. Link commgrid::nccl.
// No CUDA or NCCL header is included here: cudaStream_t is CUstream_st* and ncclComm_t is
// ncclComm*, so this header (and <commgrid/commgrid.hpp>) compiles without CUDA's paths.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/rank_map.hpp"

struct CUstream_st;  // cudaStream_t
struct ncclComm;     // ncclComm_t

namespace commgrid {

/// How an NCCL world is made (make_nccl_world).
struct NcclOptions {
  /// The ranks' bootstrap: any Communicator over the same ranks (a Gloo or MPI world), over
  /// which the ranks exchange host names, devices and the NCCL unique id; the NCCL world's
  /// ranks are its ranks. The world and every group made from it keep it alive (the ids of
  /// member-only groups travel over it). To lend one that the caller keeps alive longer,
  /// pass a pointer that owns nothing: std::shared_ptr<Communicator>(std::shared_ptr<void>(),
  /// &bootstrap).
  std::shared_ptr<Communicator> bootstrap;
  /// This rank's CUDA device. nullopt: from the local rank (this rank's position among the
  /// bootstrap's ranks on the same host, found by exchanging host names): device
  /// `local rank`, or device 0 when the process sees exactly one device (one GPU per
  /// process through CUDA_VISIBLE_DEVICES). Ranks of one host that would share a device
  /// are an error on every rank: NCCL needs one GPU per rank.
  std::optional<int> device;
  /// Timeout of the world's creation and of every creation and operation on it and on the
  /// groups made from it. nullopt: the bootstrap's timeout.
  std::optional<std::chrono::milliseconds> timeout;
};

/// The number of CUDA devices this process sees; 0 without a driver or a device.
[[nodiscard]] int cuda_device_count() noexcept;
/// Empty when this process sees a CUDA device; otherwise why not, starting with
/// "no CUDA device" ("no CUDA device (cudaGetDeviceCount: CUDA driver version is
/// insufficient for CUDA runtime version)").
[[nodiscard]] std::string cuda_unavailable_reason();
/// The version of the NCCL library linked at run time, e.g. "2.28.9".
[[nodiscard]] std::string nccl_version();

struct NcclCommunicatorAccess;

/// A Communicator over an NCCL communicator on one CUDA device.
///
/// Buffers: device memory of device() (cudaMalloc) and managed memory are used in place, and
/// operations are enqueued on the communicator's stream; device memory of another device is
/// ConfigError naming the buffer. Host memory (pageable or pinned) is accepted too, staged
/// through pinned and device memory (for small control data such as ProcessGroups'
/// fingerprint and verify's checks): host inputs are copied before the call returns, so
/// they may be reused at once; host outputs are written when wait() (or done() returning
/// true) sees the operation complete. Staging makes no synchronous copy and gives no memory
/// back to CUDA (cudaFree, cudaFreeHost); its device memory comes in stream order from the
/// communicator's own memory pool, its pinned memory from a cache that each communicator
/// seeds when it is made, so a pending operation of one group holds no other group's wait().
/// Only a miss of that cache (a host buffer over 64 KiB, or more staged operations pending at
/// once than were seeded) allocates pinned memory while operations may be pending, and
/// cudaHostAlloc may then synchronize the device.
///
/// Every operation returns a pending Work wrapping a CUDA event recorded after it (send and
/// recv, blocking by the interface, wait before returning). wait() polls the event and the
/// communicator's asynchronous NCCL error against the timeout taken when the operation was
/// posted; on timeout it aborts the communicator (ncclCommAbort, as torch's NCCL watchdog
/// does) and throws TimeoutError naming the operation, the group and its members. An NCCL
/// error aborts the communicator too; after an abort every call throws BackendError saying
/// that the communicator was aborted and why, and so does wait() on every operation it had
/// not yet seen complete (an aborted operation's event completes too, with its output
/// undefined). done() never blocks: it waits for no lock, and while another thread's call
/// holds the communicator it answers false (not yet known). Other communicators (the parent,
/// other groups) are not affected: each has resources of its own (NCCL_COMM_BLOCKING or
/// NCCL_COMM_SPLIT_SHARE_RESOURCES set on, which would change that, is ConfigError at every
/// creation).
///
/// NCCL has no tags: point-to-point messages between two ranks match in the order they
/// were posted, whatever their tags (tags must still be >= 0).
///
/// Creation is nonblocking NCCL (config.blocking = 0) polled with ncclCommGetAsyncError
/// against the timeout; on timeout the communicator being made (for split: the parent,
/// whose abort also stops the child's initialization) is aborted and TimeoutError names the
/// kind and group (the `name` argument), and the members. One thread uses one communicator
/// at a time (it may differ between calls); abort(), aborted() and abort_reason() may be
/// called from any thread at any time (a watchdog's abort waits for the NCCL call in progress
/// on the communicator, never frees it under that call, and ends the others' waits). Each
/// call makes device() current for its duration and restores the caller's current device.
class NcclCommunicator final : public Communicator {
 public:
  struct State;  ///< the NCCL handle, stream and abort state, shared with pending Work
  /// Finalizes and destroys the NCCL communicator once pending operations are done (bounded
  /// by the timeout, then aborted). An aborted communicator has nothing of NCCL left to
  /// free; its stream, event and memory pool go once neither it nor any of its Work remains.
  ~NcclCommunicator() override;

  [[nodiscard]] std::string_view backend() const noexcept override { return "nccl"; }
  [[nodiscard]] Rank rank() const noexcept override;
  [[nodiscard]] Rank size() const noexcept override;

  /// The CUDA device of this rank.
  [[nodiscard]] int device() const noexcept;
  /// The stream operations are enqueued on: the communicator's own unless set_stream chose
  /// one. The own stream is non-blocking (a cudaMemcpy elsewhere never waits for its pending
  /// operations), and each operation on it first waits for the work the calling thread
  /// queued on the legacy default stream (an event), so that code written for one stream
  /// sees its data in order.
  [[nodiscard]] CUstream_st* stream() const noexcept;
  /// Enqueues later operations on `stream` (a stream of device()); nullptr: back to the
  /// communicator's own stream. The caller orders work on `stream` and keeps it alive while
  /// operations on it are pending.
  void set_stream(CUstream_st* stream) noexcept;
  /// The NCCL communicator, for calling NCCL directly; nullptr once aborted. Read under the
  /// communicator's lock (it waits for a call or an abort in progress), but what the caller
  /// does with it is not guarded: do not use it while another thread may abort().
  [[nodiscard]] ncclComm* native() const noexcept;
  /// Whether the communicator was aborted (by a timeout, an NCCL error or abort()).
  [[nodiscard]] bool aborted() const noexcept;
  /// Why it was aborted; empty when it was not.
  [[nodiscard]] std::string abort_reason() const;
  /// Aborts the NCCL communicator (ncclCommAbort): operations in flight end, and every later
  /// call throws BackendError naming `reason`. Thread-safe: it waits for the NCCL call in
  /// progress on another thread, if any, and returns once the communicator is destroyed
  /// (also when another thread's abort came first; then `reason` is dropped).
  void abort(const std::string& reason) noexcept;

 private:
  /// Also bounds the finalization of the NCCL communicator when it is destroyed.
  void timeout_changed(std::chrono::milliseconds timeout) override;
  /// ncclCommSplit of this communicator: color = group index (nullopt: NCCL_SPLIT_NOCOLOR,
  /// the rank gets nullptr), key orders the new group. Color must be in [0, 2^31), key must
  /// fit an int. The members' global ranks are exchanged over the new group (one allgather).
  std::unique_ptr<Communicator> do_split(std::optional<std::int64_t> color, std::int64_t key,
                                         std::string name) override;
  /// Only the members call it: the first member makes an ncclUniqueId and sends it to the
  /// others through the bootstrap communicator (point to point, with the name's hash, so that
  /// members disagreeing on the name fail instead of joining the wrong group), then the
  /// members initialize (ncclCommInitRankConfig). The bootstrap must still be alive.
  std::unique_ptr<Communicator> do_create_group(std::span<const Rank> members,
                                                std::string name) override;
  /// Collective over this whole group (Megatron's new_group): one allgather over this
  /// communicator carries every rank's fingerprint of (members, name) and the first member's
  /// ncclUniqueId; ranks that passed different arguments fail on every rank; then the members
  /// initialize, the others get nullptr.
  std::unique_ptr<Communicator> do_create_group_collective(std::span<const Rank> members,
                                                           std::string name) override;

  /// An allreduce of one int on a device buffer (NCCL has no barrier).
  std::unique_ptr<Work> do_barrier() override;
  std::unique_ptr<Work> do_broadcast(void* buf, std::size_t count, DataType type,
                                     Rank root) override;
  std::unique_ptr<Work> do_allreduce(const void* send, void* recv, std::size_t count, DataType type,
                                     ReduceOp op) override;
  std::unique_ptr<Work> do_allgather(const void* send, void* recv, std::size_t count,
                                     DataType type) override;
  std::unique_ptr<Work> do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                          DataType type, ReduceOp op) override;
  std::unique_ptr<Work> do_alltoall(const void* send, void* recv, std::size_t count,
                                    DataType type) override;
  /// Grouped ncclSend/ncclRecv (ncclGroupStart/End), one pair per peer with a count > 0.
  std::unique_ptr<Work> do_alltoallv(const void* send, std::span<const std::size_t> send_counts,
                                     void* recv, std::span<const std::size_t> recv_counts,
                                     DataType type) override;
  /// Grouped ncclBroadcast, one per rank with a count > 0, into recv's blocks.
  std::unique_ptr<Work> do_allgatherv(const void* send, std::size_t count, void* recv,
                                      std::span<const std::size_t> recv_counts,
                                      DataType type) override;
  std::unique_ptr<Work> do_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                  ReduceOp op, Rank root) override;
  std::unique_ptr<Work> do_gather(const void* send, void* recv, std::size_t count, DataType type,
                                  Rank root) override;
  std::unique_ptr<Work> do_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                   Rank root) override;
  /// ncclGroupStart, every operation, ncclGroupEnd: one Work for all. A peer may be this rank.
  std::unique_ptr<Work> do_batch_isend_irecv(std::span<const P2POp> ops,
                                             std::string_view op) override;

  friend struct NcclCommunicatorAccess;  // the recovery functions below
  NcclCommunicator(std::string name, std::shared_ptr<State> state,
                   std::chrono::milliseconds timeout);
  /// Wraps an initialized NCCL communicator; `members` are the global ranks by group rank.
  static std::unique_ptr<NcclCommunicator> adopt(std::shared_ptr<State> state,
                                                 std::chrono::milliseconds timeout,
                                                 std::vector<std::int64_t> members);
  std::shared_ptr<State> state_;
};

/// Creates the NCCL world over the ranks of options.bootstrap: collective over the bootstrap
/// (every rank calls it with the same options). The ranks exchange host names, device counts and
/// PCI bus ids (so that a rank without a usable device, or two ranks sharing one, is an error
/// on every rank, never a hang); rank 0 makes the ncclUniqueId and broadcasts it; every rank
/// initializes its NCCL communicator on its device (nonblocking, bounded by the timeout).
/// The chosen device becomes the calling thread's current device (as torch.cuda.set_device),
/// so that the rank's own allocations land on it.
/// The world's ranks are the bootstrap's ranks.
/// Throws InvalidValueError ("bootstrap") without a bootstrap, InvalidValueError for another
/// bad option, ConfigError naming NCCL_COMM_BLOCKING or NCCL_COMM_SPLIT_SHARE_RESOURCES when
/// one is set on (before anything is sent), BackendError naming the rank and host without a
/// device (or the ranks sharing one), TimeoutError when initialization does not complete.
[[nodiscard]] std::unique_ptr<NcclCommunicator> make_nccl_world(const NcclOptions& options);

// ---- recovery (docs/nccl.md, "Recovery"; docs/resilience.md) -------------------------------

/// Aborts every NCCL communicator of the epoch `comm` belongs to: the world it was made from
/// and every group made from that world (by split, create_group or per-group creation, also
/// from its groups) that still exists; `comm` may be the world or any of them. Each is
/// aborted as abort(reason) does (ncclCommAbort; no peer is waited for, so a dead peer holds
/// nothing up; a call in progress on another thread ends at its next look), and a group
/// whose creation completes after this call is aborted as it is made. Idempotent: returns
/// how many communicators this call aborted (0 the second time). Call it before releasing
/// the epoch's groups: a communicator destroyed without an abort first finalizes, which
/// waits (up to its timeout) for peers that may be dead.
std::size_t abort_nccl_epoch(NcclCommunicator& comm, const std::string& reason) noexcept;
/// The same for a Communicator (EpochGroups::world): ConfigError ("backend") naming the
/// backend when it is not an NCCL communicator.
std::size_t abort_nccl_epoch(Communicator& comm, const std::string& reason);

/// How shrink_nccl_world makes the smaller world, chosen when commgrid was compiled.
enum class NcclShrinkMethod : std::uint8_t {
  /// ncclCommShrink of the old world (NCCL 2.27 and later): only the survivors take part,
  /// no unique id is exchanged, the bootstrap is optional.
  comm_shrink,
  /// A new world over NcclShrinkOptions::bootstrap (a fresh unique id, as make_nccl_world):
  /// NCCL older than 2.27, or commgrid built with COMMGRID_NCCL_NO_SHRINK defined.
  new_world,
};
/// The method this build uses.
[[nodiscard]] NcclShrinkMethod nccl_shrink_method() noexcept;
/// "ncclCommShrink" or "new world".
[[nodiscard]] const char* nccl_shrink_method_name(NcclShrinkMethod method) noexcept;

/// How a world is shrunk.
struct NcclShrinkOptions {
  /// A bootstrap over the survivors only, ranked as in the new world (the old ranks in
  /// their order, without the excluded). Needed by the new_world method (ConfigError
  /// "bootstrap" without it) and by member-only groups of the new world (create_group
  /// without it is BackendError "no bootstrap communicator"; split and per-group creation
  /// do not need one). Kept alive by the new world.
  std::shared_ptr<Communicator> bootstrap;
  /// comm_shrink: NCCL_SHRINK_ABORT (the old world's operations in flight are ended before
  /// the shrink; the only safe choice after a failure). false: NCCL_SHRINK_DEFAULT, for a
  /// healthy world with nothing pending.
  bool abort_in_flight = true;
  /// Bounds the shrink (or the new world's creation); nullopt: the world's timeout. Also
  /// the new world's timeout.
  std::optional<std::chrono::milliseconds> timeout;
};

/// The next epoch's world from a surviving one: every rank of `world` not in `exclude` calls
/// it with the same list (its old ranks; NCCL forbids the excluded to take part), and gets
/// a world of size() - exclude.size() ranks in which the survivors keep their order. First
/// it aborts every group of the world's epoch (not the world); then comm_shrink calls
/// ncclCommShrink (nonblocking, polled until the timeout, as split is) and new_world makes a
/// world over options.bootstrap on the world's device; either way the old world is
/// aborted when this returns or throws (it has dead peers: finalizing it would wait for
/// them). The new world is an epoch of its own. A rank that replaces a dead one (a spare)
/// has no old world and cannot take part: with spares, make the next world afresh
/// (make_nccl_world, make_nccl_world_factory); a shrink is for survivors only (a
/// data-parallel shrink).
/// Throws, before anything is sent or aborted: RankOutOfRangeError ("exclude") for a rank
/// outside the world, InvalidValueError ("exclude") for a rank given twice or this rank
/// excluded, InvalidValueError ("timeout") for a timeout <= 0, InvalidValueError
/// ("bootstrap") for a bootstrap whose size or rank is not this rank's in the new world,
/// ConfigError ("bootstrap") for the new_world method without one, ConfigError for NCCL's
/// refused environment variables; BackendError when the world was aborted already (the
/// comm_shrink method needs it alive) or NCCL fails, TimeoutError when the shrink does not
/// complete within the timeout.
[[nodiscard]] std::unique_ptr<NcclCommunicator> shrink_nccl_world(
    NcclCommunicator& world, std::span<const Rank> exclude, const NcclShrinkOptions& options = {});

/// The ranks of the previous epoch's world to exclude after a decision that declared the
/// processes `dead`: the logical ranks they held in `previous` (the map of that epoch),
/// ascending; a dead process that held none (a spare) adds nothing. Throws
/// RankOutOfRangeError ("process") for a process that `previous` does not have.
[[nodiscard]] std::vector<Rank> nccl_excluded_ranks(const RankMap& previous,
                                                    std::span<const Rank> dead);

/// Whether the world of the epoch `next` can be made by shrinking the world of `previous`
/// (shrink_nccl_world), and excluding which of its ranks: yes when every rank of `next` is
/// held by a process that held a rank in `previous`, in the same order (ncclCommShrink keeps
/// the survivors' order), as after a data-parallel shrink without spares (RankMap::shrink,
/// replace_or_shrink). Then the old ranks whose processes hold none in `next` (the dead, and
/// the survivors of dropped replicas, which become spares) are the ones to exclude,
/// ascending. nullopt when a spare joins (it has no old communicator: a shrink cannot
/// include it) or the order changes: make the world afresh. Throws RankOutOfRangeError
/// ("process") when the maps are not of one job.
[[nodiscard]] std::optional<std::vector<Rank>> nccl_shrink_exclusion(const RankMap& previous,
                                                                     const RankMap& next);

/// A factory of an epoch's world, as Recovery takes one (commgrid::WorldFactory, the same
/// type): `prefix` the epoch's store prefix, `rank` and `size` this rank's in that world.
using NcclWorldFactory =
    std::function<std::unique_ptr<Communicator>(const std::string& prefix, Rank rank, Rank size)>;

/// A WorldFactory for Recovery on NCCL. Each call: aborts the worlds (and their groups) that
/// this factory made for other prefixes (earlier epochs; abort_nccl_epoch), makes the
/// epoch's bootstrap with `bootstrap(prefix, rank, size)` (e.g. make_gloo_world with the
/// epoch's prefix), then a fresh NCCL world over it (make_nccl_world with `options`), which
/// keeps the bootstrap alive. Spares join this way (a fresh world via the store, never a
/// shrink). Throws what the bootstrap factory or make_nccl_world throws (BackendError "nccl
/// world: rank R (host H): no CUDA device (...)" on every rank without a device),
/// InvalidValueError ("bootstrap") when the bootstrap factory returns null or a
/// communicator of another rank or size; at once, InvalidValueError ("bootstrap") when
/// `bootstrap` is empty or options.bootstrap is set (each epoch's comes from the factory).
[[nodiscard]] NcclWorldFactory make_nccl_world_factory(NcclWorldFactory bootstrap,
                                                       NcclOptions options = {});

}  // namespace commgrid
