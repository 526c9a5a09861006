#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/mpi.hpp"
#include "deadline_watchdog.hpp"
#include "engine_int.hpp"
#include "fingerprint.hpp"
#include "reduce_util.hpp"

namespace commgrid {
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

// ---- bfloat16 and float16 reductions ------------------------------------------------
// MPI has no bfloat16 (nor, portably, float16), so 16-bit floats travel as 16-bit integers
// and are reduced by user ops that widen each pair to float32, reduce with the kernels every
// CPU backend shares (detail::combine: max and min keep NaN, so a NaN gradient is never
// hidden) and round back, as NCCL does at each step of a ring.

template <ReduceOp Op, bool Bf16>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    if constexpr (Bf16)
      b[i] = float_to_bf16(detail::combine<Op>(bf16_to_float(a[i]), bf16_to_float(b[i])));
    else b[i] = float_to_fp16(detail::combine<Op>(fp16_to_float(a[i]), fp16_to_float(b[i])));
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
        {&half_reduce<ReduceOp::sum, true>, &half_reduce<ReduceOp::max, true>,
         &half_reduce<ReduceOp::min, true>, &half_reduce<ReduceOp::prod, true>},
        {&half_reduce<ReduceOp::sum, false>, &half_reduce<ReduceOp::max, false>,
         &half_reduce<ReduceOp::min, false>, &half_reduce<ReduceOp::prod, false>}};
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

// Waiting on a request: MPI_Test in a loop. MPI progresses a nonblocking collective only
// inside MPI calls, so for the first kBusyWait of a wait, which covers every collective that
// is merely running, the loop tests back to back as MPI_Wait does (and, like MPI_Wait,
// leaves the core to others through MPI's own progress engine: Open MPI yields when idle
// once it runs oversubscribed). Only a wait that lasts longer (a late peer) sleeps between
// tests, with pauses growing from 10 us to 1 ms. (Sleeping from the 256th test on, and
// yielding before that, slowed a 1 MiB allreduce 3-15 fold against MPI_Iallreduce +
// MPI_Wait at 2 ranks.)
constexpr std::chrono::milliseconds kBusyWait{20};

class Backoff {
 public:
  void pause() {
    if (!sleeping_) {
      if (Clock::now() - start_ < kBusyWait) return;
      sleeping_ = true;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  Clock::time_point start_ = Clock::now();
  bool sleeping_ = false;
  std::chrono::microseconds sleep_{10};
};

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
// the caller's (MpiEnvironment's init_timeout). Past it this rank writes one line and exits
// 1; mpirun then ends the whole job with its own message. MPI_Abort is not allowed before
// MPI_Init returns, so this is the only way out.

// Past the bound: one line in one write (safe from the watchdog thread), then exit 1.
std::shared_ptr<void> end_stuck_init(std::chrono::milliseconds timeout) {
  char line[256];
  const int n = std::snprintf(line, sizeof(line),
                              "error: mpi MPI_Init_thread: did not complete within %.1f s (a "
                              "rank of the job did not start or is stopped); ending this "
                              "rank\n",
                              static_cast<double>(timeout.count()) / 1000.0);
  if (n > 0) [[maybe_unused]]
    auto w = ::write(2, line, static_cast<size_t>(n));
  std::_Exit(1);
}

}  // namespace

MpiEnvironment::MpiEnvironment(MpiThreadSupport required, std::chrono::milliseconds init_timeout) {
  init(nullptr, nullptr, required, init_timeout);
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv, MpiThreadSupport required,
                               std::chrono::milliseconds init_timeout) {
  init(argc, argv, required, init_timeout);
}

void MpiEnvironment::init(int* argc, char*** argv, MpiThreadSupport required,
                          std::chrono::milliseconds init_timeout) {
  if (init_timeout.count() <= 0)
    throw InvalidValueError("init_timeout", "mpi init: init_timeout must be > 0 ms, got " +
                                                std::to_string(init_timeout.count()));
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
      const std::chrono::milliseconds timeout = init_timeout;
      const detail::WatchedDeadline bound(Clock::now() + timeout,
                                          [timeout] { return end_stuck_init(timeout); });
      rc = MPI_Init_thread(argc, argv, static_cast<int>(required), &provided);
    }
    if (rc != MPI_SUCCESS) throw BackendError("mpi MPI_Init_thread: " + error_text(rc));
    owns_ = true;
    // We own MPI, so errors on the predefined communicators come back as codes too.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  }
  provided_ = static_cast<MpiThreadSupport>(provided);
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

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout)
    : Communicator(std::move(name), timeout), comm_(comm) {
  if (comm == MPI_COMM_NULL || comm == MPI_COMM_WORLD || comm == MPI_COMM_SELF)
    throw BackendError("mpi communicator " + this->name() +
                       ": needs an owned communicator, not MPI_COMM_NULL, MPI_COMM_WORLD or "
                       "MPI_COMM_SELF (use MpiCommunicator::duplicate)");
  int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm_, &rank_);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm_, &size_);
  if (rc == MPI_SUCCESS) tag_ub_ = tag_upper_bound(comm_);
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

int mpi_create_group_tag(std::string_view name, int tag_upper_bound) noexcept {
  const std::size_t hash_pos = name.rfind('#');
  const std::string_view prefix =
      hash_pos == std::string_view::npos ? name : name.substr(0, hash_pos);
  const std::uint64_t h = detail::fingerprint(prefix);
  const auto range = static_cast<std::uint64_t>(std::max(tag_upper_bound, 0)) + 1;
  return static_cast<int>(h % range);
}

void MpiCommunicator::check(int rc, const char* op) const {
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi " + std::string(op) + " on " + name() + ": " + error_text(rc));
}

void MpiCommunicator::check_usable(const char* op) const {
  if (broken_)
    throw BackendError("mpi " + std::string(op) + " on " + name() +
                       ": the communicator is unusable after an earlier timeout");
}

void MpiCommunicator::wait(MPI_Request& request, const char* op, MPI_Status* status) {
  const auto deadline = Clock::now() + timeout();
  for (Backoff backoff;; backoff.pause()) {
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
                         " (a rank of the group did not take part; MPI cannot tell which); the "
                         "communicator is unusable from now on");
    }
  }
}

std::unique_ptr<Communicator> MpiCommunicator::adopt(MPI_Comm comm, std::string name) {
  if (comm == MPI_COMM_NULL) return nullptr;
  auto child = std::make_unique<MpiCommunicator>(comm, std::move(name), timeout());
  child->set_collective_calls(collective_calls());  // a new group calls MPI as its parent
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
  std::vector<Rank> global(here.size());
  for (std::size_t i = 0; i < here.size(); ++i) global[i] = global_rank(here[i]);
  child->set_members(std::move(global));
  return child;
}

void MpiCommunicator::group_of_members(std::span<const Rank> members, const char* op,
                                       MPI_Group& out) const {
  const std::vector<int> ranks = detail::engine_ints(members);
  GroupGuard all;
  check(MPI_Comm_group(comm_, &all.group), op);
  check(MPI_Group_incl(all.group, static_cast<int>(ranks.size()), ranks.data(), &out), op);
}

namespace {
// Communicator creation has no nonblocking form in MPI, so a rank that never arrives would
// hang every other rank forever. The process-wide watchdog (one thread for every bound of
// every backend, not one per call) bounds the call by the communicator's timeout: past it,
// the job cannot continue (the other ranks are inside the same blocking call, and MPI cannot
// tell which rank is missing), so it prints one line naming the call and the group and
// aborts the whole job, which mpirun reports and ends.
detail::WatchedDeadline bound_creation(std::chrono::milliseconds timeout, std::string what) {
  return detail::WatchedDeadline(Clock::now() + timeout, [timeout, what = std::move(what)] {
    std::fprintf(stderr,
                 "error: %s: did not complete within %.1f s (a rank did not arrive; MPI cannot "
                 "tell which); aborting the job\n",
                 what.c_str(), static_cast<double>(timeout.count()) / 1000.0);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
    return std::shared_ptr<void>();
  });
}
}  // namespace

std::unique_ptr<Communicator> MpiCommunicator::do_split(std::optional<std::int64_t> color,
                                                        std::int64_t key, std::string name) {
  check_usable("split");
  MPI_Comm out = MPI_COMM_NULL;
  const auto bound = bound_creation(timeout(), "mpi split on " + this->name() + " for " + name);
  const int rc = MPI_Comm_split(comm_, color ? static_cast<int>(*color) : MPI_UNDEFINED,
                                static_cast<int>(key), &out);
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi split on " + this->name() + " for " + name + ": " + error_text(rc));
  return adopt(out, std::move(name));
}

std::unique_ptr<Communicator> MpiCommunicator::do_create_group(std::span<const Rank> members,
                                                               std::string name) {
  check_usable("create_group");
  GroupGuard group;
  group_of_members(members, "create_group", group.group);
  MPI_Comm out = MPI_COMM_NULL;
  const int tag = mpi_create_group_tag(name, tag_ub_);
  const auto bound =
      bound_creation(timeout(), "mpi create_group on " + this->name() + " for " + name);
  const int rc = MPI_Comm_create_group(comm_, group.group, tag, &out);
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi create_group on " + this->name() + " for " + name + ": " +
                       error_text(rc));
  return adopt(out, std::move(name));
}

std::unique_ptr<Communicator> MpiCommunicator::do_create_group_collective(
    std::span<const Rank> members, std::string name) {
  check_usable("create_group_collective");
  GroupGuard group;
  group_of_members(members, "create_group_collective", group.group);
  MPI_Comm out = MPI_COMM_NULL;
  const auto bound =
      bound_creation(timeout(), "mpi create_group_collective on " + this->name() + " for " + name);
  const int rc = MPI_Comm_create(comm_, group.group, &out);
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi create_group_collective on " + this->name() + " for " + name + ": " +
                       error_text(rc));
  return adopt(out, std::move(name));
}

// ---- collectives -----------------------------------------------------------------------
// Communicator checked every argument; counts fit MPI's ints (max_count()). Each collective
// is one MPI call in two forms: blocking (MpiCollectiveCalls::blocking) or nonblocking, polled
// until done or the timeout (the default).

namespace {
int as_int(std::size_t count) { return static_cast<int>(count); }
}  // namespace

void MpiCommunicator::set_collective_calls(MpiCollectiveCalls calls) {
  if (calls == MpiCollectiveCalls::nonblocking) {
    blocking_.reset();
    return;
  }
  if (blocking_) return;
  // Past the timeout nothing can end a blocking MPI call: one line naming it, then the job
  // ends (the other ranks are inside the same call, or gone).
  blocking_ = std::make_unique<detail::WatchedCalls>(
      timeout(), [group = name()](const std::string& op, std::chrono::milliseconds timeout) {
        std::fprintf(stderr,
                     "error: mpi %s on %s: did not complete within about %.1f s (blocking "
                     "collectives: a rank of the group did not take part; MPI cannot tell "
                     "which); aborting the job\n",
                     op.c_str(), group.c_str(), static_cast<double>(timeout.count()) / 1000.0);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::_Exit(1);
      });
}

MpiCollectiveCalls MpiCommunicator::collective_calls() const noexcept {
  return blocking_ ? MpiCollectiveCalls::blocking : MpiCollectiveCalls::nonblocking;
}

void MpiCommunicator::timeout_changed(std::chrono::milliseconds timeout) {
  if (blocking_) blocking_->set_timeout(timeout);
}

template <class Blocking, class Start>
void MpiCommunicator::collective(const char* op, Blocking&& blocking, Start&& start) {
  check_usable(op);
  if (blocking_) {
    const detail::WatchedCalls::Call call(*blocking_, op);
    check(blocking(), op);
    return;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  check(start(&req), op);
  wait(req, op);
}

std::unique_ptr<Work> MpiCommunicator::do_barrier() {
  collective(
      "barrier", [&] { return MPI_Barrier(comm_); },
      [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_broadcast(void* buf, std::size_t count, DataType type,
                                                    Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  collective(
      "broadcast", [&] { return MPI_Bcast(buf, n, t, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ibcast(buf, n, t, root, comm_, r); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_allreduce(const void* send, void* recv, std::size_t count,
                                                    DataType type, ReduceOp op) {
  const void* in = send == recv ? MPI_IN_PLACE : send;
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  const MPI_Op o = mpi_op(op, type);
  collective(
      "allreduce", [&] { return MPI_Allreduce(in, recv, n, t, o, comm_); },
      [&](MPI_Request* r) { return MPI_Iallreduce(in, recv, n, t, o, comm_, r); });
  if (op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_allgather(const void* send, void* recv, std::size_t count,
                                                    DataType type) {
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  collective(
      "allgather", [&] { return MPI_Allgather(send, n, t, recv, n, t, comm_); },
      [&](MPI_Request* r) { return MPI_Iallgather(send, n, t, recv, n, t, comm_, r); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_reduce_scatter(const void* send, void* recv,
                                                         std::size_t count, DataType type,
                                                         ReduceOp op) {
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  const MPI_Op o = mpi_op(op, type);
  collective(
      "reduce_scatter", [&] { return MPI_Reduce_scatter_block(send, recv, n, t, o, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, recv, n, t, o, comm_, r); });
  if (op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_alltoall(const void* send, void* recv, std::size_t count,
                                                   DataType type) {
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  collective(
      "alltoall", [&] { return MPI_Alltoall(send, n, t, recv, n, t, comm_); },
      [&](MPI_Request* r) { return MPI_Ialltoall(send, n, t, recv, n, t, comm_, r); });
  return std::make_unique<Work>();
}

void MpiCommunicator::v_layout(std::span<const std::size_t> counts, std::vector<int>& out_counts,
                               std::vector<int>& out_displs) {
  out_counts.resize(counts.size());
  out_displs.resize(counts.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    out_counts[i] = as_int(counts[i]);
    out_displs[i] = as_int(offset);  // the sum is within max_count() too
    offset += counts[i];
  }
}

std::unique_ptr<Work> MpiCommunicator::do_alltoallv(const void* send,
                                                    std::span<const std::size_t> send_counts,
                                                    void* recv,
                                                    std::span<const std::size_t> recv_counts,
                                                    DataType type) {
  std::vector<int> sc, sd, rc, rd;
  v_layout(send_counts, sc, sd);
  v_layout(recv_counts, rc, rd);
  const MPI_Datatype t = mpi_type(type);
  collective(
      "alltoallv",
      [&] {
        return MPI_Alltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_);
      },
      [&](MPI_Request* r) {
        return MPI_Ialltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_,
                              r);
      });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_allgatherv(const void* send, std::size_t count,
                                                     void* recv,
                                                     std::span<const std::size_t> recv_counts,
                                                     DataType type) {
  std::vector<int> rc, rd;
  v_layout(recv_counts, rc, rd);
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  collective(
      "allgatherv",
      [&] { return MPI_Allgatherv(send, n, t, recv, rc.data(), rd.data(), t, comm_); },
      [&](MPI_Request* r) {
        return MPI_Iallgatherv(send, n, t, recv, rc.data(), rd.data(), t, comm_, r);
      });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_reduce(const void* send, void* recv, std::size_t count,
                                                 DataType type, ReduceOp op, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const bool at_root = rank_ == root;
  const void* in = at_root && send == recv ? MPI_IN_PLACE : send;
  void* out = at_root ? recv : nullptr;
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  const MPI_Op o = mpi_op(op, type);
  collective(
      "reduce", [&] { return MPI_Reduce(in, out, n, t, o, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce(in, out, n, t, o, root, comm_, r); });
  if (at_root && op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_gather(const void* send, void* recv, std::size_t count,
                                                 DataType type, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  void* out = rank_ == root ? recv : nullptr;
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  collective(
      "gather", [&] { return MPI_Gather(send, n, t, out, n, t, root, comm_); },
      [&](MPI_Request* r) { return MPI_Igather(send, n, t, out, n, t, root, comm_, r); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_scatter(const void* send, void* recv, std::size_t count,
                                                  DataType type, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const void* in = rank_ == root ? send : nullptr;
  const int n = as_int(count);
  const MPI_Datatype t = mpi_type(type);
  collective(
      "scatter", [&] { return MPI_Scatter(in, n, t, recv, n, t, root, comm_); },
      [&](MPI_Request* r) { return MPI_Iscatter(in, n, t, recv, n, t, root, comm_, r); });
  return std::make_unique<Work>();
}

// ---- point to point -------------------------------------------------------------------

std::unique_ptr<Work> MpiCommunicator::do_send(const P2POp& o) {
  // One request waited for here: the blocking send costs what MPI_Isend + MPI_Wait costs.
  check_usable("send");
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Isend(o.buf, as_int(o.count), mpi_type(o.type), detail::engine_int(o.peer), o.tag,
                  comm_, &req),
        "send");
  wait(req, "send");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_recv(const P2POp& o) {
  check_usable("recv");
  const int n = as_int(o.count);
  MPI_Request req = MPI_REQUEST_NULL;
  const MPI_Datatype t = mpi_type(o.type);
  check(MPI_Irecv(o.buf, n, t, detail::engine_int(o.peer), o.tag, comm_, &req), "recv");
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
    broken_ = false;
    if (cancelled != 0)
      throw TimeoutError("mpi recv on " + name() + ": no message from rank " +
                         std::to_string(o.peer) + " with tag " + std::to_string(o.tag) +
                         " within " + std::to_string(timeout().count()) + " ms");
    status = cancel_status;  // the message arrived while we gave up: that is a success
  }
  int received = 0;
  check(MPI_Get_count(&status, t, &received), "recv");
  if (received != n)
    throw BackendError("mpi recv on " + name() + ": received " + std::to_string(received) +
                       " elements of " + std::string(datatype_name(o.type)) + " from rank " +
                       std::to_string(o.peer) + ", expected " + std::to_string(n));
  return std::make_unique<Work>();
}

namespace detail {

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
    for (Backoff backoff;; backoff.pause()) {
      if (test_all()) return;
      if (Clock::now() >= deadline_) time_out();
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

}  // namespace detail

std::unique_ptr<Work> MpiCommunicator::do_batch_isend_irecv(std::span<const P2POp> ops,
                                                            std::string_view op_name) {
  const std::string op(op_name);
  check_usable(op.c_str());
  const auto deadline = Clock::now() + timeout();
  std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    const int n = as_int(o.count);
    const int peer = detail::engine_int(o.peer);
    if (o.kind == P2POp::Kind::send)
      check(MPI_Isend(o.buf, n, mpi_type(o.type), peer, o.tag, comm_, &requests[i]), op.c_str());
    else check(MPI_Irecv(o.buf, n, mpi_type(o.type), peer, o.tag, comm_, &requests[i]), op.c_str());
  }
  return std::make_unique<detail::MpiP2PWork>(*this, op, std::vector<P2POp>(ops.begin(), ops.end()),
                                              std::move(requests), deadline);
}

std::unique_ptr<MpiCommunicator> make_mpi_world(const MpiOptions& options) {
  if (options.timeout.count() <= 0)
    throw InvalidValueError("timeout", "mpi world: timeout must be > 0 ms, got " +
                                           std::to_string(options.timeout.count()));
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0)
    throw BackendError("mpi world: MPI is not initialized; create an MpiEnvironment first");
  auto world = MpiCommunicator::duplicate(MPI_COMM_WORLD, "world", options.timeout);
  world->set_collective_calls(options.collective_calls);
  return world;
}

}  // namespace commgrid
