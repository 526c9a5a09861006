// The MPI backend: commgrid's Communicator over an MPI communicator (Open MPI, MPICH).
// Link commgrid::mpi. Everything here needs <mpi.h>; the rest of commgrid does not.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"

namespace commgrid::mpi {

/// The thread support requested from MPI_Init_thread.
enum class ThreadSupport : int {
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
  /// fails or MPI provides less thread support than `required`. The call is bounded by
  /// COMMGRID_TIMEOUT (else kDefaultTimeout): past it (a rank of the job never started it),
  /// this process writes one error line and exits 1, and mpirun ends the job.
  explicit MpiEnvironment(ThreadSupport required = ThreadSupport::serialized);
  /// Same, passing the program's arguments on to MPI (some launchers need them).
  MpiEnvironment(int* argc, char*** argv,
                 ThreadSupport required = ThreadSupport::serialized);
  /// Calls MPI_Finalize if this object called MPI_Init_thread. Every communicator should
  /// be destroyed by then; one destroyed later skips MPI_Comm_free (MPI is gone).
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  /// Whether this object initialized MPI (and will finalize it).
  [[nodiscard]] bool owns_mpi() const noexcept { return owns_; }
  /// The thread support MPI provides.
  [[nodiscard]] ThreadSupport provided() const noexcept { return provided_; }

  /// Ends every process of the job with `code` (MPI_Abort on MPI_COMM_WORLD). For errors
  /// that only some ranks see, where the others would otherwise wait for them until their
  /// timeout.
  [[noreturn]] static void abort(int code) noexcept;

 private:
  void init(int* argc, char*** argv, ThreadSupport required);
  bool owns_ = false;
  ThreadSupport provided_ = ThreadSupport::single;
};

/// A Communicator over an MPI communicator that it owns (freed in the destructor).
/// Every call sets MPI_ERRORS_RETURN, checks the return code and throws BackendError
/// "mpi <operation> on <group>: <MPI_Error_string>". Collectives and point-to-point calls
/// are nonblocking MPI calls polled with MPI_Test until they complete or the
/// communicator's timeout passes (TimeoutError); after a timeout the communicator is
/// unusable, because MPI cannot cancel a started collective, and every later call throws.
/// Creating groups (split, create_group*) uses MPI's blocking calls, which cannot be
/// cancelled: a watchdog bounds each by the timeout and, past it, prints which call and
/// group did not complete and aborts the whole job (MPI_Abort).
/// Every call completes before returning: the returned Work is already done.
class MpiP2PWork;

class MpiCommunicator final : public Communicator {
 public:
  /// Takes ownership of `comm` (not MPI_COMM_WORLD or MPI_COMM_SELF: pass a duplicate, see
  /// duplicate()) and sets MPI_ERRORS_RETURN on it.
  MpiCommunicator(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout);
  ~MpiCommunicator() override;

  /// A Communicator over a duplicate of `comm` (MPI_Comm_dup: traffic on it never mixes
  /// with the caller's). Collective over `comm`.
  static std::unique_ptr<MpiCommunicator> duplicate(MPI_Comm comm, std::string name,
                                                    std::chrono::milliseconds timeout);

  /// The MPI communicator, for passing to other MPI code; it stays owned by this object.
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }

  [[nodiscard]] std::string_view backend() const noexcept override { return "mpi"; }
  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }

  /// MPI_Comm_split; no color is MPI_UNDEFINED. Color and key must fit an int, color >= 0.
  std::unique_ptr<Communicator> split(std::optional<std::int64_t> color, std::int64_t key,
                                      std::string name) override;
  /// MPI_Comm_create_group. The tag comes from the name's prefix before its last '#' (the
  /// kind in commgrid's "kind#index" names), so the groups of one prefix share a tag: they
  /// must be disjoint (as the groups of one kind are) or created one after another. Members
  /// must be ascending and include this rank; their order is the new communicator's.
  std::unique_ptr<Communicator> create_group(std::span<const int> members,
                                             std::string name) override;
  /// MPI_Comm_create over this whole communicator; non-members get nullptr. Members must be
  /// ascending.
  std::unique_ptr<Communicator> create_group_collective(std::span<const int> members,
                                                        std::string name) override;

  std::unique_ptr<Work> barrier() override;
  std::unique_ptr<Work> broadcast(void* buf, std::size_t count, DataType type,
                                  int root) override;
  std::unique_ptr<Work> allreduce(const void* send, void* recv, std::size_t count,
                                  DataType type, ReduceOp op) override;
  std::unique_ptr<Work> allgather(const void* send, void* recv, std::size_t count,
                                  DataType type) override;
  std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t count,
                                       DataType type, ReduceOp op) override;
  std::unique_ptr<Work> alltoall(const void* send, void* recv, std::size_t count,
                                 DataType type) override;
  std::unique_ptr<Work> send(const void* buf, std::size_t count, DataType type, int peer,
                             int tag) override;
  std::unique_ptr<Work> recv(void* buf, std::size_t count, DataType type, int peer,
                             int tag) override;
  std::unique_ptr<Work> isend(const void* buf, std::size_t count, DataType type, int peer,
                              int tag) override;
  std::unique_ptr<Work> irecv(void* buf, std::size_t count, DataType type, int peer,
                              int tag) override;
  std::unique_ptr<Work> batch_isend_irecv(std::span<const P2POp> ops) override;
  std::unique_ptr<Work> alltoallv(const void* send, std::span<const std::size_t> send_counts,
                                  void* recv, std::span<const std::size_t> recv_counts,
                                  DataType type) override;
  std::unique_ptr<Work> allgatherv(const void* send, std::size_t count, void* recv,
                                   std::span<const std::size_t> recv_counts,
                                   DataType type) override;
  std::unique_ptr<Work> reduce(const void* send, void* recv, std::size_t count, DataType type,
                               ReduceOp op, int root) override;
  std::unique_ptr<Work> gather(const void* send, void* recv, std::size_t count, DataType type,
                               int root) override;
  std::unique_ptr<Work> scatter(const void* send, void* recv, std::size_t count, DataType type,
                                int root) override;
  COMMGRID_USING_TYPED_OVERLOADS;

 private:
  friend class MpiP2PWork;
  void check(int rc, const char* op) const;
  void check_tag(int tag, const char* op) const;
  /// Counts and displacements of a v-collective, checked to fit MPI's ints.
  void v_layout(std::span<const std::size_t> counts, const char* what, const char* op,
                std::vector<int>& out_counts, std::vector<int>& out_displs) const;
  void check_usable(const char* op) const;
  int checked_count(std::size_t count, const char* op) const;
  void check_peer(int peer, const char* op) const;
  void wait(MPI_Request& request, const char* op, MPI_Status* status = nullptr);
  std::unique_ptr<Communicator> adopt(MPI_Comm comm, std::string name);
  void group_of_members(std::span<const int> members, const char* op, MPI_Group& out) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  bool broken_ = false;  ///< set by a timeout; every later call throws
};

/// The MPI tag that create_group uses for a group name (exposed for tests): a hash of the
/// name's prefix before its last '#', in [0, tag_upper_bound].
int create_group_tag(std::string_view name, int tag_upper_bound) noexcept;

}  // namespace commgrid::mpi

namespace commgrid {

/// The world communicator of this job: a duplicate of MPI_COMM_WORLD named "world", the
/// MPI engine's world factory (as make_gloo_world and make_nccl_world are Gloo's and NCCL's).
/// Collective over MPI_COMM_WORLD. MPI must be initialized (see mpi::MpiEnvironment); throws
/// BackendError when it is not.
[[nodiscard]] std::unique_ptr<mpi::MpiCommunicator> make_mpi_world(
    std::chrono::milliseconds timeout = kDefaultTimeout);

}  // namespace commgrid
