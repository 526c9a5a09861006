#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "commgrid/mpi.hpp"

namespace commgrid::mpi {
namespace {

using Clock = std::chrono::steady_clock;

std::string error_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(buf, static_cast<std::size_t>(len));
}

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::float32: return MPI_FLOAT;
    case DataType::float64: return MPI_DOUBLE;
    case DataType::bfloat16: return MPI_UINT16_T;  // 16-bit storage; reduced by our own ops
    case DataType::int32: return MPI_INT32_T;
    case DataType::int64: return MPI_INT64_T;
  }
  COMMGRID_ENFORCE(false, "unknown DataType " + std::to_string(static_cast<int>(t)));
}

// ---- bfloat16 reductions ----------------------------------------------------------
// MPI has no bfloat16, so bfloat16 travels as 16-bit integers and is reduced by user ops
// that widen each pair to float32, reduce and round back (as NCCL does at each step of a
// ring). NaN propagates through max and min, so a NaN gradient is never hidden.

struct Sum { float operator()(float a, float b) const noexcept { return a + b; } };
struct Prod { float operator()(float a, float b) const noexcept { return a * b; } };
struct Max {
  float operator()(float a, float b) const noexcept {
    return std::isnan(a) || a > b ? a : b;
  }
};
struct Min {
  float operator()(float a, float b) const noexcept {
    return std::isnan(a) || a < b ? a : b;
  }
};

template <class F>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  const F f;
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(f(bf16_to_float(a[i]), bf16_to_float(b[i])));
}

std::mutex g_ops_mutex;
MPI_Op g_bf16_ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
bool g_bf16_ops_created = false;

// MPI deletes MPI_COMM_SELF's attributes at the start of MPI_Finalize: the standard hook
// for freeing library objects before MPI goes away, whoever owns MPI.
int free_bf16_ops(MPI_Comm, int, void*, void*) {
  std::lock_guard lock(g_ops_mutex);
  for (MPI_Op& op : g_bf16_ops)
    if (op != MPI_OP_NULL) MPI_Op_free(&op);
  g_bf16_ops_created = false;
  return MPI_SUCCESS;
}

MPI_Op bf16_op(ReduceOp op) {
  std::lock_guard lock(g_ops_mutex);
  if (!g_bf16_ops_created) {
    MPI_User_function* fns[4] = {&bf16_reduce<Sum>, &bf16_reduce<Max>, &bf16_reduce<Min>,
                                 &bf16_reduce<Prod>};
    for (int i = 0; i < 4; ++i) {
      int rc = MPI_Op_create(fns[i], /*commute=*/1, &g_bf16_ops[i]);
      if (rc != MPI_SUCCESS) throw BackendError("mpi MPI_Op_create for bfloat16: " + error_text(rc));
    }
    int keyval = MPI_KEYVAL_INVALID;
    int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_bf16_ops, &keyval, nullptr);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
    if (rc != MPI_SUCCESS)
      throw BackendError("mpi attribute on MPI_COMM_SELF for bfloat16 ops: " + error_text(rc));
    g_bf16_ops_created = true;
  }
  static_assert(static_cast<int>(ReduceOp::sum) == 0 && static_cast<int>(ReduceOp::max) == 1 &&
                static_cast<int>(ReduceOp::min) == 2 && static_cast<int>(ReduceOp::prod) == 3);
  return g_bf16_ops[static_cast<int>(op)];
}

MPI_Op mpi_op(ReduceOp op, DataType t) {
  if (t == DataType::bfloat16) return bf16_op(op);
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::prod: return MPI_PROD;
  }
  COMMGRID_ENFORCE(false, "unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

// Frees an MPI_Group on scope exit.
struct GroupGuard {
  MPI_Group group = MPI_GROUP_NULL;
  GroupGuard() = default;
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;
  ~GroupGuard() {
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  }
};

// Waiting on a request: MPI_Test in a loop. The first tests spin (a fast collective
// answers within microseconds); then the loop yields and sleeps with growing pauses up to
// 1 ms so that ranks oversubscribing a machine leave the cores to the ranks they wait for.
void pause(int iteration) {
  if (iteration < 16) return;
  if (iteration < 256) {
    std::this_thread::yield();
    return;
  }
  const int shift = std::min(iteration - 256, 7);  // 8 us ... 1 ms
  std::this_thread::sleep_for(std::chrono::microseconds(8 << shift));
}

int tag_upper_bound(MPI_Comm comm) {
  void* value = nullptr;
  int flag = 0;
  if (MPI_Comm_get_attr(comm, MPI_TAG_UB, &value, &flag) != MPI_SUCCESS || flag == 0)
    return 32767;  // the least upper bound the standard allows
  return *static_cast<int*>(value);
}

}  // namespace

// ---- MpiEnvironment ------------------------------------------------------------------

MpiEnvironment::MpiEnvironment(ThreadSupport required) { init(nullptr, nullptr, required); }

MpiEnvironment::MpiEnvironment(int* argc, char*** argv, ThreadSupport required) {
  init(argc, argv, required);
}

void MpiEnvironment::init(int* argc, char*** argv, ThreadSupport required) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized != 0)
    throw BackendError("mpi init: MPI was already finalized and cannot be initialized again");
  int provided = MPI_THREAD_SINGLE;
  if (initialized != 0) {
    MPI_Query_thread(&provided);
  } else {
    int rc = MPI_Init_thread(argc, argv, static_cast<int>(required), &provided);
    if (rc != MPI_SUCCESS) throw BackendError("mpi MPI_Init_thread: " + error_text(rc));
    owns_ = true;
    // We own MPI, so errors on the predefined communicators come back as codes too.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  }
  provided_ = static_cast<ThreadSupport>(provided);
  if (provided < static_cast<int>(required)) {
    if (owns_) MPI_Finalize();
    owns_ = false;
    throw BackendError("mpi init: thread support " + std::to_string(static_cast<int>(required)) +
                       " requested, MPI provides only " + std::to_string(provided));
  }
}

MpiEnvironment::~MpiEnvironment() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) MPI_Finalize();
}

void MpiEnvironment::abort(int code) noexcept {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort should not return; if it does, end this process anyway
}

// ---- MpiCommunicator ---------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name,
                                 std::chrono::milliseconds timeout)
    : Communicator(std::move(name), timeout), comm_(comm) {
  if (comm == MPI_COMM_NULL || comm == MPI_COMM_WORLD || comm == MPI_COMM_SELF)
    throw BackendError("mpi communicator " + this->name() +
                       ": needs an owned communicator, not MPI_COMM_NULL, MPI_COMM_WORLD or "
                       "MPI_COMM_SELF (use MpiCommunicator::duplicate)");
  int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm_, &rank_);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm_, &size_);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm_);  // the destructor will not run
    throw BackendError("mpi adopt on " + this->name() + ": " + error_text(rc));
  }
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0 && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::duplicate(MPI_Comm comm, std::string name,
                                                            std::chrono::milliseconds timeout) {
  MPI_Comm dup = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(comm, &dup);
  if (rc != MPI_SUCCESS) throw BackendError("mpi dup for " + name + ": " + error_text(rc));
  return std::make_unique<MpiCommunicator>(dup, std::move(name), timeout);
}

std::unique_ptr<MpiCommunicator> world(std::chrono::milliseconds timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0)
    throw BackendError("mpi world: MPI is not initialized; create an MpiEnvironment first");
  return MpiCommunicator::duplicate(MPI_COMM_WORLD, "world", timeout);
}

int create_group_tag(std::string_view name, int tag_upper_bound) noexcept {
  const std::size_t hash_pos = name.rfind('#');
  const std::string_view prefix = hash_pos == std::string_view::npos ? name : name.substr(0, hash_pos);
  std::uint64_t h = 14695981039346656037ULL;  // FNV-1a
  for (char c : prefix) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  const auto range = static_cast<std::uint64_t>(std::max(tag_upper_bound, 0)) + 1;
  return static_cast<int>(h % range);
}

void MpiCommunicator::check(int rc, const char* op) const {
  if (rc != MPI_SUCCESS) throw BackendError("mpi " + std::string(op) + " on " + name() + ": " + error_text(rc));
}

void MpiCommunicator::check_usable(const char* op) const {
  if (broken_)
    throw BackendError("mpi " + std::string(op) + " on " + name() +
                       ": the communicator is unusable after an earlier timeout");
}

int MpiCommunicator::checked_count(std::size_t count, const char* op) const {
  check_usable(op);
  if (count > static_cast<std::size_t>(INT_MAX))
    throw BackendError("mpi " + std::string(op) + " on " + name() + ": count " +
                       std::to_string(count) + " exceeds " + std::to_string(INT_MAX) +
                       ", the largest count of an MPI call");
  return static_cast<int>(count);
}

void MpiCommunicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size_)
    throw BackendError("mpi " + std::string(op) + " on " + name() + ": peer " +
                       std::to_string(peer) + " out of range [0, " + std::to_string(size_) + ")");
}

void MpiCommunicator::wait(MPI_Request& request, const char* op, MPI_Status* status) {
  const auto start = Clock::now();
  const auto deadline = start + timeout();
  for (int i = 0;; ++i) {
    int done = 0;
    check(MPI_Test(&request, &done, status != nullptr ? status : MPI_STATUS_IGNORE), op);
    if (done != 0) return;
    if (Clock::now() >= deadline) {
      // MPI cannot cancel a started collective or a send, so the request stays with MPI,
      // which may still use the caller's buffers; nothing on this communicator is safe now.
      broken_ = true;
      throw TimeoutError("mpi " + std::string(op) + " on " + name() + ": timed out after " +
                         std::to_string(timeout().count()) + " ms at rank " +
                         std::to_string(rank_) + " of " + std::to_string(size_) +
                         " (a rank of the group did not take part); the communicator is "
                         "unusable from now on");
    }
    pause(i);
  }
}

std::unique_ptr<Communicator> MpiCommunicator::adopt(MPI_Comm comm, std::string name) {
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(comm, std::move(name), timeout());
}

void MpiCommunicator::group_of_members(std::span<const int> members, const char* op,
                                       MPI_Group& out) const {
  if (members.empty())
    throw BackendError("mpi " + std::string(op) + " for a group of " + name() + ": no members");
  for (std::size_t i = 0; i < members.size(); ++i) {
    check_peer(members[i], op);
    if (i > 0 && members[i] <= members[i - 1])
      throw BackendError("mpi " + std::string(op) + " on " + name() +
                         ": members must be ascending and distinct, got " +
                         std::to_string(members[i - 1]) + " before " + std::to_string(members[i]));
  }
  GroupGuard all;
  check(MPI_Comm_group(comm_, &all.group), op);
  check(MPI_Group_incl(all.group, static_cast<int>(members.size()), members.data(), &out), op);
}

namespace {
// Communicator creation has no nonblocking form in MPI, so a rank that never arrives would
// hang every other rank forever. A watchdog thread bounds the call by the communicator's
// timeout: past it, the job cannot continue (the other ranks are inside the same blocking
// call), so it prints one line naming the call and the group and aborts the whole job,
// which mpirun reports and ends.
class CreationWatchdog {
 public:
  CreationWatchdog(std::chrono::milliseconds timeout, std::string what)
      : what_(std::move(what)), thread_([this, timeout] { watch(timeout); }) {}
  ~CreationWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  CreationWatchdog(const CreationWatchdog&) = delete;
  CreationWatchdog& operator=(const CreationWatchdog&) = delete;

 private:
  void watch(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, timeout, [this] { return done_; })) return;
    std::fprintf(stderr,
                 "error: %s: did not complete within %.1f s (a rank did not arrive); "
                 "aborting the job\n",
                 what_.c_str(), static_cast<double>(timeout.count()) / 1000.0);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it reads exist
};
}  // namespace

std::unique_ptr<Communicator> MpiCommunicator::split(std::optional<std::int64_t> color,
                                                     std::int64_t key, std::string name) {
  check_usable("split");
  if (color && (*color < 0 || *color > INT_MAX))
    throw BackendError("mpi split on " + this->name() + " for " + name + ": color " +
                       std::to_string(*color) + " out of range [0, " + std::to_string(INT_MAX) + "]");
  if (key < INT_MIN || key > INT_MAX)
    throw BackendError("mpi split on " + this->name() + " for " + name + ": key " +
                       std::to_string(key) + " does not fit an int");
  MPI_Comm out = MPI_COMM_NULL;
  const CreationWatchdog watchdog(timeout(), "mpi split on " + this->name() + " for " + name);
  const int rc = MPI_Comm_split(comm_, color ? static_cast<int>(*color) : MPI_UNDEFINED,
                                static_cast<int>(key), &out);
  count_creation();
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi split on " + this->name() + " for " + name + ": " + error_text(rc));
  return adopt(out, std::move(name));
}

std::unique_ptr<Communicator> MpiCommunicator::create_group(std::span<const int> members,
                                                            std::string name) {
  check_usable("create_group");
  GroupGuard group;
  group_of_members(members, "create_group", group.group);
  if (!std::binary_search(members.begin(), members.end(), rank_))
    throw BackendError("mpi create_group on " + this->name() + " for " + name + ": rank " +
                       std::to_string(rank_) + " is not a member; only members call it");
  MPI_Comm out = MPI_COMM_NULL;
  const int tag = create_group_tag(name, tag_upper_bound(comm_));
  const CreationWatchdog watchdog(timeout(), "mpi create_group on " + this->name() + " for " + name);
  const int rc = MPI_Comm_create_group(comm_, group.group, tag, &out);
  count_creation();
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi create_group on " + this->name() + " for " + name + ": " + error_text(rc));
  return adopt(out, std::move(name));
}

std::unique_ptr<Communicator> MpiCommunicator::create_group_collective(
    std::span<const int> members, std::string name) {
  check_usable("create_group_collective");
  GroupGuard group;
  group_of_members(members, "create_group_collective", group.group);
  MPI_Comm out = MPI_COMM_NULL;
  const CreationWatchdog watchdog(timeout(),
                                  "mpi create_group_collective on " + this->name() + " for " + name);
  const int rc = MPI_Comm_create(comm_, group.group, &out);
  count_creation();
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi create_group_collective on " + this->name() + " for " + name + ": " +
                       error_text(rc));
  return adopt(out, std::move(name));
}

namespace {
void check_buffer(const void* buf, std::size_t count, const char* what, const char* op,
                  const std::string& group) {
  if (buf == nullptr && count > 0)
    throw BackendError("mpi " + std::string(op) + " on " + group + ": " + what +
                       " buffer is null with count " + std::to_string(count));
}
void check_distinct(const void* send, const void* recv, std::size_t count, const char* op,
                    const std::string& group) {
  if (send == recv && count > 0)
    throw BackendError("mpi " + std::string(op) + " on " + group +
                       ": send and recv are the same buffer; only allreduce allows that");
}
}  // namespace

std::unique_ptr<Work> MpiCommunicator::barrier() {
  check_usable("barrier");
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm_, &req), "barrier");
  wait(req, "barrier");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::broadcast(void* buf, std::size_t count, DataType type,
                                                 int root) {
  const int n = checked_count(count, "broadcast");
  check_peer(root, "broadcast");
  check_buffer(buf, count, "the", "broadcast", name());
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Ibcast(buf, n, mpi_type(type), root, comm_, &req), "broadcast");
  wait(req, "broadcast");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::allreduce(const void* send, void* recv, std::size_t count,
                                                 DataType type, ReduceOp op) {
  const int n = checked_count(count, "allreduce");
  check_buffer(send, count, "send", "allreduce", name());
  check_buffer(recv, count, "recv", "allreduce", name());
  MPI_Request req = MPI_REQUEST_NULL;
  const void* in = send == recv ? MPI_IN_PLACE : send;
  check(MPI_Iallreduce(in, recv, n, mpi_type(type), mpi_op(op, type), comm_, &req), "allreduce");
  wait(req, "allreduce");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::allgather(const void* send, void* recv, std::size_t count,
                                                 DataType type) {
  const int n = checked_count(count, "allgather");
  check_buffer(send, count, "send", "allgather", name());
  check_buffer(recv, count, "recv", "allgather", name());
  check_distinct(send, recv, count, "allgather", name());
  MPI_Request req = MPI_REQUEST_NULL;
  const MPI_Datatype t = mpi_type(type);
  check(MPI_Iallgather(send, n, t, recv, n, t, comm_, &req), "allgather");
  wait(req, "allgather");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter(const void* send, void* recv,
                                                      std::size_t count, DataType type,
                                                      ReduceOp op) {
  const int n = checked_count(count, "reduce_scatter");
  check_buffer(send, count, "send", "reduce_scatter", name());
  check_buffer(recv, count, "recv", "reduce_scatter", name());
  check_distinct(send, recv, count, "reduce_scatter", name());
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(type), mpi_op(op, type), comm_, &req),
        "reduce_scatter");
  wait(req, "reduce_scatter");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::alltoall(const void* send, void* recv, std::size_t count,
                                                DataType type) {
  const int n = checked_count(count, "alltoall");
  check_buffer(send, count, "send", "alltoall", name());
  check_buffer(recv, count, "recv", "alltoall", name());
  check_distinct(send, recv, count, "alltoall", name());
  MPI_Request req = MPI_REQUEST_NULL;
  const MPI_Datatype t = mpi_type(type);
  check(MPI_Ialltoall(send, n, t, recv, n, t, comm_, &req), "alltoall");
  wait(req, "alltoall");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::send(const void* buf, std::size_t count, DataType type,
                                            int peer, int tag) {
  const int n = checked_count(count, "send");
  check_peer(peer, "send");
  check_buffer(buf, count, "the", "send", name());
  if (tag < 0 || tag > tag_upper_bound(comm_))
    throw BackendError("mpi send on " + name() + ": tag " + std::to_string(tag) +
                       " out of range [0, " + std::to_string(tag_upper_bound(comm_)) + "]");
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Isend(buf, n, mpi_type(type), peer, tag, comm_, &req), "send");
  wait(req, "send");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::recv(void* buf, std::size_t count, DataType type,
                                            int peer, int tag) {
  const int n = checked_count(count, "recv");
  check_peer(peer, "recv");
  check_buffer(buf, count, "the", "recv", name());
  if (tag < 0 || tag > tag_upper_bound(comm_))
    throw BackendError("mpi recv on " + name() + ": tag " + std::to_string(tag) +
                       " out of range [0, " + std::to_string(tag_upper_bound(comm_)) + "]");
  MPI_Request req = MPI_REQUEST_NULL;
  const MPI_Datatype t = mpi_type(type);
  check(MPI_Irecv(buf, n, t, peer, tag, comm_, &req), "recv");
  MPI_Status status;
  try {
    wait(req, "recv", &status);
  } catch (const TimeoutError&) {
    // Unlike a collective, a receive can be cancelled, which releases the buffer and
    // leaves the communicator usable.
    MPI_Cancel(&req);
    MPI_Status cancel_status;
    MPI_Wait(&req, &cancel_status);
    int cancelled = 0;
    MPI_Test_cancelled(&cancel_status, &cancelled);
    if (cancelled == 0) {  // the message arrived while we gave up: that is a success
      broken_ = false;
      status = cancel_status;
    } else {
      broken_ = false;
      throw TimeoutError("mpi recv on " + name() + ": no message from rank " +
                         std::to_string(peer) + " with tag " + std::to_string(tag) + " within " +
                         std::to_string(timeout().count()) + " ms");
    }
  }
  int received = 0;
  check(MPI_Get_count(&status, t, &received), "recv");
  if (received != n)
    throw BackendError("mpi recv on " + name() + ": received " + std::to_string(received) +
                       " elements of " + std::string(datatype_name(type)) + " from rank " +
                       std::to_string(peer) + ", expected " + std::to_string(n));
  return std::make_unique<Work>();
}

}  // namespace commgrid::mpi
