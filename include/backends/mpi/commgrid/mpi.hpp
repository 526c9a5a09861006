// The MPI backend: commgrid's Communicator over an MPI communicator (Open MPI, MPICH).
// Link commgrid::mpi. Everything here needs <mpi.h>; the rest of commgrid does not.
#pragma once

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"

namespace commgrid::detail {
class WatchedCalls;
class MpiP2PWork;
}  // namespace commgrid::detail

namespace commgrid {

/// How an MpiCommunicator calls MPI's collectives.
enum class MpiCollectiveCalls : std::uint8_t {
  /// The nonblocking call (MPI_Iallreduce, ...) tested until it completes or the
  /// communicator's timeout passes: a timeout is a TimeoutError this rank can handle (the
  /// default).
  nonblocking,
  /// The blocking call (MPI_Allreduce, ...), which Open MPI runs with faster algorithms for
  /// small messages (about 2x at 1 KiB and below on 2 ranks here: docs/benchmarks.md). MPI
  /// cannot interrupt a blocking call, so past the timeout (plus up to 0.1 s) the
  /// process-wide watchdog prints which call on which group did not complete and aborts the
  /// job (MPI_Abort), as for group creation.
  blocking,
};

/// The thread support requested from MPI_Init_thread.
enum class MpiThreadSupport : int {
  single = MPI_THREAD_SINGLE,
  funneled = MPI_THREAD_FUNNELED,
  serialized = MPI_THREAD_SERIALIZED,  ///< any thread, one at a time (the default)
  multiple = MPI_THREAD_MULTIPLE,
};

/// Initializes MPI on construction and finalizes it on destruction, but only if MPI was
/// not initialized already: a program that owns MPI itself may still create one, and
/// nothing happens. Create at most one at a time, before any communicator.
class MpiEnvironment {
 public:
  /// Calls MPI_Init_thread unless MPI is initialized. Throws BackendError when the call
  /// fails or MPI provides less thread support than `required`, InvalidValueError
  /// ("init_timeout") for a bound <= 0. The call is bounded by `init_timeout` (a launched
  /// program passes the launch environment's timeout, COMMGRID_TIMEOUT): past it (a rank of
  /// the job never started it), this process writes one error line and exits 1, and mpirun
  /// ends the job.
  explicit MpiEnvironment(MpiThreadSupport required = MpiThreadSupport::serialized,
                          std::chrono::milliseconds init_timeout = kDefaultTimeout);
  /// Same, passing the program's arguments on to MPI (some launchers need them).
  MpiEnvironment(int* argc, char*** argv, MpiThreadSupport required = MpiThreadSupport::serialized,
                 std::chrono::milliseconds init_timeout = kDefaultTimeout);
  /// Calls MPI_Finalize if this object called MPI_Init_thread. Every communicator should
  /// be destroyed by then; one destroyed later skips MPI_Comm_free (MPI is gone).
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  /// Whether this object initialized MPI (and will finalize it).
  [[nodiscard]] bool owns_mpi() const noexcept { return owns_; }
  /// The thread support MPI provides.
  [[nodiscard]] MpiThreadSupport provided() const noexcept { return provided_; }

  /// Ends every process of the job with `code` (MPI_Abort on MPI_COMM_WORLD). For errors
  /// that only some ranks see, where the others would otherwise wait for them until their
  /// timeout.
  [[noreturn]] static void abort(int code) noexcept;

 private:
  void init(int* argc, char*** argv, MpiThreadSupport required,
            std::chrono::milliseconds init_timeout);
  bool owns_ = false;
  MpiThreadSupport provided_ = MpiThreadSupport::single;
};

/// A Communicator over an MPI communicator that it owns (freed in the destructor).
/// Arguments are checked by Communicator (the same errors as every backend); what MPI
/// itself reports throws BackendError "mpi <operation> on <group>: <MPI_Error_string>"
/// (MPI_ERRORS_RETURN is set and every return code is checked). Counts are MPI ints:
/// max_count() is INT_MAX, max_tag() the communicator's MPI_TAG_UB.
/// Collectives and point-to-point calls are nonblocking MPI calls polled with MPI_Test until
/// they complete or the communicator's timeout passes (TimeoutError; MPI cannot tell which
/// ranks did not arrive, so the message names the group and this rank only); after a
/// collective's timeout the communicator is unusable, because MPI cannot cancel a started
/// collective, and every later call throws. With MpiCollectiveCalls::blocking, collectives are
/// MPI's blocking calls instead, and a timeout aborts the job (see MpiCollectiveCalls). Creating
/// groups (split, create_group*) uses MPI's blocking calls, which cannot be cancelled: one
/// process-wide watchdog thread bounds each by the timeout and, past it, prints which call and
/// group did not complete and aborts the whole job (MPI_Abort). Every call completes before
/// returning: the returned Work is already done, except for isend, irecv and batch_isend_irecv.
class MpiCommunicator final : public Communicator {
 public:
  /// Takes ownership of `comm` (not MPI_COMM_WORLD or MPI_COMM_SELF: pass a duplicate, see
  /// duplicate()) and sets MPI_ERRORS_RETURN on it.
  MpiCommunicator(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout);
  ~MpiCommunicator() override;

  /// A Communicator over a duplicate of `comm` (MPI_Comm_dup: traffic on it never mixes
  /// with the caller's). Collective over `comm`.
  [[nodiscard]] static std::unique_ptr<MpiCommunicator> duplicate(
      MPI_Comm comm, std::string name, std::chrono::milliseconds timeout);

  /// The MPI communicator, for passing to other MPI code; it stays owned by this object.
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }

  [[nodiscard]] std::string_view backend() const noexcept override { return "mpi"; }
  [[nodiscard]] Rank rank() const noexcept override { return rank_; }
  [[nodiscard]] Rank size() const noexcept override { return size_; }
  [[nodiscard]] int max_tag() const noexcept override { return tag_ub_; }
  [[nodiscard]] std::size_t max_count() const noexcept override { return INT_MAX; }

  /// How later collectives call MPI (point to point is always nonblocking). Groups created
  /// from this communicator start with its choice. Not collective, but every rank of a
  /// group should choose alike, so that a timeout ends the job the same way everywhere.
  void set_collective_calls(MpiCollectiveCalls calls);
  [[nodiscard]] MpiCollectiveCalls collective_calls() const noexcept;

 private:
  friend class detail::MpiP2PWork;
  /// MPI_Comm_split; no color is MPI_UNDEFINED.
  std::unique_ptr<Communicator> do_split(std::optional<std::int64_t> color, std::int64_t key,
                                         std::string name) override;
  /// MPI_Comm_create_group. The tag comes from the name's prefix before its last '#' (the
  /// kind in commgrid's "kind#index" names), so the groups of one prefix share a tag: they
  /// must be disjoint (as the groups of one kind are) or created one after another. Their
  /// order is the new communicator's.
  std::unique_ptr<Communicator> do_create_group(std::span<const Rank> members,
                                                std::string name) override;
  /// MPI_Comm_create over this whole communicator; non-members get nullptr.
  std::unique_ptr<Communicator> do_create_group_collective(std::span<const Rank> members,
                                                           std::string name) override;
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
  std::unique_ptr<Work> do_alltoallv(const void* send, std::span<const std::size_t> send_counts,
                                     void* recv, std::span<const std::size_t> recv_counts,
                                     DataType type) override;
  std::unique_ptr<Work> do_allgatherv(const void* send, std::size_t count, void* recv,
                                      std::span<const std::size_t> recv_counts,
                                      DataType type) override;
  std::unique_ptr<Work> do_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                  ReduceOp op, Rank root) override;
  std::unique_ptr<Work> do_gather(const void* send, void* recv, std::size_t count, DataType type,
                                  Rank root) override;
  std::unique_ptr<Work> do_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                   Rank root) override;
  std::unique_ptr<Work> do_batch_isend_irecv(std::span<const P2POp> ops,
                                             std::string_view op) override;
  /// One MPI_Isend waited for (no batch bookkeeping).
  std::unique_ptr<Work> do_send(const P2POp& op) override;
  /// A receive that times out is cancelled (MPI_Cancel), which gives its buffer back and
  /// leaves the communicator usable.
  std::unique_ptr<Work> do_recv(const P2POp& op) override;

  void timeout_changed(std::chrono::milliseconds timeout) override;
  /// Runs one collective in the chosen form: blocking() under the watchdog, or start(&req)
  /// then wait(). Both return an MPI return code.
  template <class Blocking, class Start>
  void collective(const char* op, Blocking&& blocking, Start&& start);
  void check(int rc, const char* op) const;
  /// MPI's counts and displacements of a v-collective (Communicator checked they fit).
  static void v_layout(std::span<const std::size_t> counts, std::vector<int>& out_counts,
                       std::vector<int>& out_displs);
  void check_usable(const char* op) const;
  void wait(MPI_Request& request, const char* op, MPI_Status* status = nullptr);
  std::unique_ptr<Communicator> adopt(MPI_Comm comm, std::string name);
  void group_of_members(std::span<const Rank> members, const char* op, MPI_Group& out) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  int tag_ub_ = 32767;   ///< MPI_TAG_UB of comm_
  bool broken_ = false;  ///< set by a timeout; every later call throws
  /// Set while collectives are blocking calls: the watchdog's bound of them.
  std::unique_ptr<detail::WatchedCalls> blocking_;
};

/// The MPI tag that create_group uses for a group name (exposed for tests): a hash of the
/// name's prefix before its last '#', in [0, tag_upper_bound].
[[nodiscard]] int mpi_create_group_tag(std::string_view name, int tag_upper_bound) noexcept;

/// How the MPI world is made (make_mpi_world).
struct MpiOptions {
  /// Timeout of every call on the world and on every group made from it.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  /// How the world's collectives (and those of every group made from it) call MPI.
  MpiCollectiveCalls collective_calls = MpiCollectiveCalls::nonblocking;
};

/// The world communicator of this job: a duplicate of MPI_COMM_WORLD named "world", the MPI
/// backend's world factory (make_gloo_world and make_nccl_world are Gloo's and NCCL's, each
/// taking its backend's options). Collective over MPI_COMM_WORLD. MPI must be initialized
/// (see MpiEnvironment); throws BackendError when it is not, InvalidValueError ("timeout")
/// for a timeout <= 0.
[[nodiscard]] std::unique_ptr<MpiCommunicator> make_mpi_world(const MpiOptions& options = {});

}  // namespace commgrid
