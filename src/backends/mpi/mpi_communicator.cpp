#include <unistd.h>

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
#include <vector>

#include "commgrid/mpi.hpp"
#include "reduce_util.hpp"

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
    case DataType::float16: return MPI_UINT16_T;  // likewise
    case DataType::int8: return MPI_INT8_T;
    case DataType::uint8: return MPI_UINT8_T;
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

template <class F, bool Bf16>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  const F f;
  for (int i = 0; i < *len; ++i) {
    if constexpr (Bf16)
      b[i] = float_to_bf16(f(bf16_to_float(a[i]), bf16_to_float(b[i])));
    else
      b[i] = float_to_fp16(f(fp16_to_float(a[i]), fp16_to_float(b[i])));
  }
}

std::mutex g_ops_mutex;
// [0]: bfloat16, [1]: float16; by ReduceOp sum, max, min, prod.
MPI_Op g_half_ops[2][4] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                           {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
bool g_half_ops_created = false;

// MPI deletes MPI_COMM_SELF's attributes at the start of MPI_Finalize: the standard hook
// for freeing library objects before MPI goes away, whoever owns MPI.
int free_half_ops(MPI_Comm, int, void*, void*) {
  std::lock_guard lock(g_ops_mutex);
  for (auto& row : g_half_ops)
    for (MPI_Op& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  g_half_ops_created = false;
  return MPI_SUCCESS;
}

MPI_Op half_op(ReduceOp op, DataType t) {
  std::lock_guard lock(g_ops_mutex);
  if (!g_half_ops_created) {
    MPI_User_function* fns[2][4] = {
        {&half_reduce<Sum, true>, &half_reduce<Max, true>, &half_reduce<Min, true>,
         &half_reduce<Prod, true>},
        {&half_reduce<Sum, false>, &half_reduce<Max, false>, &half_reduce<Min, false>,
         &half_reduce<Prod, false>}};
    for (int k = 0; k < 2; ++k)
      for (int i = 0; i < 4; ++i) {
        int rc = MPI_Op_create(fns[k][i], /*commute=*/1, &g_half_ops[k][i]);
        if (rc != MPI_SUCCESS)
          throw BackendError("mpi MPI_Op_create for 16-bit floats: " + error_text(rc));
      }
    int keyval = MPI_KEYVAL_INVALID;
    int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_half_ops, &keyval, nullptr);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
    if (rc != MPI_SUCCESS)
      throw BackendError("mpi attribute on MPI_COMM_SELF for 16-bit float ops: " + error_text(rc));
    g_half_ops_created = true;
  }
  static_assert(static_cast<int>(ReduceOp::sum) == 0 && static_cast<int>(ReduceOp::max) == 1 &&
                static_cast<int>(ReduceOp::min) == 2 && static_cast<int>(ReduceOp::prod) == 3);
  return g_half_ops[t == DataType::bfloat16 ? 0 : 1][static_cast<int>(detail::engine_op(op))];
}

// The MPI op for `op`; avg runs as a sum that the caller divides (detail::divide_by).
MPI_Op mpi_op(ReduceOp op, DataType t) {
  if (detail::is_half(t)) return half_op(op, t);
  switch (detail::engine_op(op)) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::prod: return MPI_PROD;
    case ReduceOp::avg: break;
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

namespace {
// MPI_Init blocks until every rank of the job has started it; a rank that never does (it
// failed to start, or was stopped) would hang the others, and mpirun, forever. The bound is
// COMMGRID_TIMEOUT when set, else the default timeout. Past it this rank writes one line and
// exits 1; mpirun then ends the whole job with its own message. MPI_Abort is not allowed
// before MPI_Init returns, so this is the only way out.
std::chrono::milliseconds init_timeout() {
  const char* t = std::getenv("COMMGRID_TIMEOUT");
  if (t == nullptr) return kDefaultTimeout;
  char* end = nullptr;
  const double seconds = std::strtod(t, &end);
  if (*t == '\0' || *end != '\0' || !(seconds > 0) || seconds > 1e9)
    throw InvalidValueError("COMMGRID_TIMEOUT", std::string("COMMGRID_TIMEOUT='") + t +
                                                    "' is not a positive number of seconds");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000.0)));
}

class InitWatchdog {
 public:
  explicit InitWatchdog(std::chrono::milliseconds timeout)
      : thread_([this, timeout] { watch(timeout); }) {}
  ~InitWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  InitWatchdog(const InitWatchdog&) = delete;
  InitWatchdog& operator=(const InitWatchdog&) = delete;

 private:
  void watch(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, timeout, [this] { return done_; })) return;
    char line[256];
    const int n = std::snprintf(line, sizeof(line),
                                "error: mpi MPI_Init_thread: did not complete within %.1f s (a "
                                "rank of the job did not start or is stopped); ending this "
                                "rank\n",
                                static_cast<double>(timeout.count()) / 1000.0);
    if (n > 0) [[maybe_unused]] auto w = ::write(2, line, static_cast<size_t>(n));  // one write
    std::_Exit(1);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it reads exist
};
}  // namespace

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
    int rc = MPI_SUCCESS;
    {
      const InitWatchdog watchdog(init_timeout());
      rc = MPI_Init_thread(argc, argv, static_cast<int>(required), &provided);
    }
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
  auto child = std::make_unique<MpiCommunicator>(comm, std::move(name), timeout());
  // The child's members as global ranks: its ranks translated into this communicator's
  // ranks (a local computation), then through this communicator's own members.
  GroupGuard mine, theirs;
  check(MPI_Comm_group(comm_, &mine.group), "split");
  check(MPI_Comm_group(comm, &theirs.group), "split");
  std::vector<int> child_ranks(static_cast<std::size_t>(child->size_)), here(child_ranks.size());
  for (std::size_t i = 0; i < child_ranks.size(); ++i) child_ranks[i] = static_cast<int>(i);
  check(MPI_Group_translate_ranks(theirs.group, child->size_, child_ranks.data(), mine.group,
                                  here.data()),
        "split");
  std::vector<std::int64_t> global(here.size());
  for (std::size_t i = 0; i < here.size(); ++i) global[i] = global_rank(here[i]);
  child->set_members(std::move(global));
  return child;
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
  if (op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
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
  if (op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
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

// ---- point to point, variable and rooted collectives -------------------------------

namespace commgrid::mpi {

void MpiCommunicator::check_tag(int tag, const char* op) const {
  if (tag < 0 || tag > tag_upper_bound(comm_))
    throw InvalidValueError("tag", "mpi " + std::string(op) + " on " + name() + ": tag " +
                                       std::to_string(tag) + " out of range [0, " +
                                       std::to_string(tag_upper_bound(comm_)) + "]");
}

void MpiCommunicator::v_layout(std::span<const std::size_t> counts, const char* what,
                               const char* op, std::vector<int>& out_counts,
                               std::vector<int>& out_displs) const {
  if (counts.size() != static_cast<std::size_t>(size_))
    throw InvalidValueError(what, "mpi " + std::string(op) + " on " + name() + ": " + what +
                                      " has " + std::to_string(counts.size()) +
                                      " entries, needs one per rank (" + std::to_string(size_) + ")");
  out_counts.resize(counts.size());
  out_displs.resize(counts.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    out_counts[i] = checked_count(counts[i], op);
    out_displs[i] = checked_count(offset, op);  // MPI's displacements are ints too
    offset += counts[i];
  }
}

/// The Work of isend, irecv and batch_isend_irecv: MPI requests tested against one deadline.
class MpiP2PWork final : public Work {
 public:
  MpiP2PWork(MpiCommunicator& comm, std::string op, std::vector<P2POp> ops,
             std::vector<MPI_Request> requests, Clock::time_point deadline)
      : comm_(comm), op_(std::move(op)), ops_(std::move(ops)), requests_(std::move(requests)),
        deadline_(deadline) {}
  ~MpiP2PWork() override {
    if (waited_) return;
    try {
      wait();
    } catch (...) {
      // A destructor cannot report; wait() is where errors are seen.
    }
  }

  void wait() override {
    waited_ = true;
    for (int iteration = 0;; ++iteration) {
      if (test_all()) return;
      if (Clock::now() >= deadline_) time_out();
      pause(iteration);
    }
  }

  [[nodiscard]] bool done() const override { return const_cast<MpiP2PWork*>(this)->test_all(); }

 private:
  // Tests every open request; a completed receive must carry exactly its count.
  bool test_all() {
    bool all = true;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status status;
      comm_.check(MPI_Test(&requests_[i], &flag, &status), op_.c_str());
      if (flag == 0) {
        all = false;
        continue;
      }
      const P2POp& o = ops_[i];
      if (o.kind == P2POp::Kind::recv) {
        int received = 0;
        comm_.check(MPI_Get_count(&status, mpi_type(o.type), &received), op_.c_str());
        if (static_cast<std::size_t>(received) != o.count)
          throw BackendError("mpi " + op_ + " on " + comm_.name() + ": received " +
                             std::to_string(received) + " elements of " +
                             std::string(datatype_name(o.type)) + " from " + who(o) +
                             ", expected " + std::to_string(o.count));
      }
    }
    return all;
  }

  std::string who(const P2POp& o) const {
    return "rank " + std::to_string(o.peer) + " (global " +
           std::to_string(comm_.global_rank(o.peer)) + "), tag " + std::to_string(o.tag);
  }

  [[noreturn]] void time_out() {
    std::string pending;
    bool open_send = false;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      const P2POp& o = ops_[i];
      pending += std::string(pending.empty() ? "" : "; ") +
                 (o.kind == P2POp::Kind::send ? "send to " : "receive from ") + who(o);
      if (o.kind == P2POp::Kind::recv) {
        // A receive can be cancelled, which gives its buffer back.
        MPI_Cancel(&requests_[i]);
        MPI_Wait(&requests_[i], MPI_STATUS_IGNORE);
      } else {
        open_send = true;
      }
    }
    // A send that was never matched stays with MPI, which may still read its buffer.
    if (open_send) comm_.broken_ = true;
    throw TimeoutError("mpi " + op_ + " on " + comm_.name() + ": timed out after " +
                       std::to_string(comm_.timeout().count()) + " ms waiting for " + pending +
                       (open_send ? "; the communicator is unusable from now on" : ""));
  }

  MpiCommunicator& comm_;
  std::string op_;
  std::vector<P2POp> ops_;
  std::vector<MPI_Request> requests_;
  Clock::time_point deadline_;
  bool waited_ = false;
};

std::unique_ptr<Work> MpiCommunicator::isend(const void* buf, std::size_t count, DataType type,
                                             int peer, int tag) {
  const P2POp op = P2POp::send(buf, count, type, peer, tag);
  return batch_isend_irecv(std::span<const P2POp>(&op, 1));
}

std::unique_ptr<Work> MpiCommunicator::irecv(void* buf, std::size_t count, DataType type,
                                             int peer, int tag) {
  const P2POp op = P2POp::recv(buf, count, type, peer, tag);
  return batch_isend_irecv(std::span<const P2POp>(&op, 1));
}

std::unique_ptr<Work> MpiCommunicator::batch_isend_irecv(std::span<const P2POp> ops) {
  const char* op = ops.size() == 1 ? (ops[0].kind == P2POp::Kind::send ? "isend" : "irecv")
                                   : "batch_isend_irecv";
  check_usable(op);
  for (const P2POp& o : ops) {
    (void)checked_count(o.count, op);
    check_peer(o.peer, op);
    check_tag(o.tag, op);
    check_buffer(o.buf, o.count, "the", op, name());
  }
  const auto deadline = Clock::now() + timeout();
  std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    const int n = static_cast<int>(o.count);
    if (o.kind == P2POp::Kind::send)
      check(MPI_Isend(o.buf, n, mpi_type(o.type), o.peer, o.tag, comm_, &requests[i]), op);
    else
      check(MPI_Irecv(o.buf, n, mpi_type(o.type), o.peer, o.tag, comm_, &requests[i]), op);
  }
  return std::make_unique<MpiP2PWork>(*this, op, std::vector<P2POp>(ops.begin(), ops.end()),
                                      std::move(requests), deadline);
}

std::unique_ptr<Work> MpiCommunicator::alltoallv(const void* send,
                                                 std::span<const std::size_t> send_counts,
                                                 void* recv,
                                                 std::span<const std::size_t> recv_counts,
                                                 DataType type) {
  check_usable("alltoallv");
  std::vector<int> sc, sd, rc, rd;
  v_layout(send_counts, "send_counts", "alltoallv", sc, sd);
  v_layout(recv_counts, "recv_counts", "alltoallv", rc, rd);
  const auto send_total = static_cast<std::size_t>(sd.back()) + send_counts.back();
  const auto recv_total = static_cast<std::size_t>(rd.back()) + recv_counts.back();
  check_buffer(send, send_total, "send", "alltoallv", name());
  check_buffer(recv, recv_total, "recv", "alltoallv", name());
  check_distinct(send, recv, send_total + recv_total, "alltoallv", name());
  MPI_Request req = MPI_REQUEST_NULL;
  const MPI_Datatype t = mpi_type(type);
  check(MPI_Ialltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_, &req),
        "alltoallv");
  wait(req, "alltoallv");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::allgatherv(const void* send, std::size_t count, void* recv,
                                                  std::span<const std::size_t> recv_counts,
                                                  DataType type) {
  const int n = checked_count(count, "allgatherv");
  std::vector<int> rc, rd;
  v_layout(recv_counts, "recv_counts", "allgatherv", rc, rd);
  if (recv_counts[static_cast<std::size_t>(rank_)] != count)
    throw InvalidValueError("count", "mpi allgatherv on " + name() + ": rank " +
                                         std::to_string(rank_) + " sends " + std::to_string(count) +
                                         " elements but recv_counts[" + std::to_string(rank_) +
                                         "] is " + std::to_string(recv_counts[static_cast<std::size_t>(rank_)]));
  const auto recv_total = static_cast<std::size_t>(rd.back()) + recv_counts.back();
  check_buffer(send, count, "send", "allgatherv", name());
  check_buffer(recv, recv_total, "recv", "allgatherv", name());
  check_distinct(send, recv, count, "allgatherv", name());
  MPI_Request req = MPI_REQUEST_NULL;
  const MPI_Datatype t = mpi_type(type);
  check(MPI_Iallgatherv(send, n, t, recv, rc.data(), rd.data(), t, comm_, &req), "allgatherv");
  wait(req, "allgatherv");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::reduce(const void* send, void* recv, std::size_t count,
                                              DataType type, ReduceOp op, int root) {
  const int n = checked_count(count, "reduce");
  check_peer(root, "reduce");
  check_buffer(send, count, "send", "reduce", name());
  const bool at_root = rank_ == root;
  if (at_root) check_buffer(recv, count, "recv", "reduce", name());
  MPI_Request req = MPI_REQUEST_NULL;
  const void* in = at_root && send == recv ? MPI_IN_PLACE : send;
  check(MPI_Ireduce(in, at_root ? recv : nullptr, n, mpi_type(type), mpi_op(op, type), root, comm_,
                    &req),
        "reduce");
  wait(req, "reduce");
  if (at_root && op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::gather(const void* send, void* recv, std::size_t count,
                                              DataType type, int root) {
  const int n = checked_count(count, "gather");
  check_peer(root, "gather");
  check_buffer(send, count, "send", "gather", name());
  const bool at_root = rank_ == root;
  if (at_root) {
    check_buffer(recv, count, "recv", "gather", name());
    check_distinct(send, recv, count, "gather", name());
  }
  MPI_Request req = MPI_REQUEST_NULL;
  const MPI_Datatype t = mpi_type(type);
  check(MPI_Igather(send, n, t, at_root ? recv : nullptr, n, t, root, comm_, &req), "gather");
  wait(req, "gather");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::scatter(const void* send, void* recv, std::size_t count,
                                               DataType type, int root) {
  const int n = checked_count(count, "scatter");
  check_peer(root, "scatter");
  check_buffer(recv, count, "recv", "scatter", name());
  const bool at_root = rank_ == root;
  if (at_root) {
    check_buffer(send, count, "send", "scatter", name());
    check_distinct(send, recv, count, "scatter", name());
  }
  MPI_Request req = MPI_REQUEST_NULL;
  const MPI_Datatype t = mpi_type(type);
  check(MPI_Iscatter(at_root ? send : nullptr, n, t, recv, n, t, root, comm_, &req), "scatter");
  wait(req, "scatter");
  return std::make_unique<Work>();
}

}  // namespace commgrid::mpi

namespace commgrid {

std::unique_ptr<mpi::MpiCommunicator> make_mpi_world(std::chrono::milliseconds timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0)
    throw BackendError("mpi world: MPI is not initialized; create an MpiEnvironment first");
  return mpi::MpiCommunicator::duplicate(MPI_COMM_WORLD, "world", timeout);
}

}  // namespace commgrid
