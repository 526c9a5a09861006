// The MPI backend's shared internals: MPI's error texts, commgrid's element types and
// reductions as MPI's, and the backoff of a wait on a request. Private to the backend.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

#include "commgrid/communicator.hpp"

namespace commgrid::mpi_backend {

using Clock = std::chrono::steady_clock;

/// MPI's text for the error code `rc`.
std::string error_text(int rc);

/// The MPI datatype of `t`; bfloat16 and float16 travel as 16-bit integers.
MPI_Datatype mpi_type(DataType t);

// The MPI op for `op`; avg runs as a sum that the caller divides (detail::divide_by).
MPI_Op mpi_op(ReduceOp op, DataType t);

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

// Counts are checked against max_count() by the Communicator contract: they fit MPI's ints.
inline int as_int(std::size_t count) { return static_cast<int>(count); }

}  // namespace commgrid::mpi_backend
