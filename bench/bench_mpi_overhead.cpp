// The MPI backend's own overhead, side by side with the raw MPI calls it wraps, in one run
// under mpirun: group creation (split, create_group, create_group_collective, each with the
// destruction of what it made) and small collectives (barrier, allreduce, broadcast), each
// against the blocking MPI call and the nonblocking one plus MPI_Wait. Not Google Benchmark:
// every rank must run the same number of iterations of a collective, so the loop is fixed.
//
//   mpirun --oversubscribe --allow-run-as-root -np 2 build/bench/bench_mpi_overhead [iterations]
//
// Each iteration runs every variant of one row in a rotating order after a barrier; the
// time of a call is this rank's, the row's figure the median over iterations of the slowest
// rank's time (a max-allreduce per iteration, outside the timed part). Prints one table on
// rank 0; ratio = commgrid / raw. Collectives are measured both ways commgrid can call MPI:
// the default (the nonblocking call, tested until done or the timeout) against
// MPI_Ixxx + MPI_Wait, and MpiCollectiveCalls::blocking against the blocking call.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "commgrid/mpi.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  std::fprintf(stderr, "error: %s failed (%d)\n", what, rc);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

struct Variant {
  std::string name;
  std::function<void()> call;
  std::vector<double> seconds;  // slowest rank's time per iteration
};

// Runs the variants of one row `iterations` times, interleaved, and returns each variant's
// median per call (the slowest rank's time of each iteration), the same on every rank.
std::vector<double> row(MPI_Comm comm, std::vector<Variant> variants, int iterations) {
  const auto n = variants.size();
  for (int it = 0; it < iterations; ++it) {
    for (std::size_t j = 0; j < n; ++j) {
      Variant& v = variants[(static_cast<std::size_t>(it) + j) % n];
      check(MPI_Barrier(comm), "MPI_Barrier");
      const auto t0 = Clock::now();
      v.call();
      double t = std::chrono::duration<double>(Clock::now() - t0).count();
      check(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce");
      v.seconds.push_back(t);
    }
  }
  std::vector<double> medians;
  for (Variant& v : variants) {
    std::sort(v.seconds.begin(), v.seconds.end());
    medians.push_back(v.seconds[v.seconds.size() / 2]);
  }
  return medians;
}

// One line of the table: commgrid's call against the raw call it makes.
void print(int me, const std::string& op, const std::string& ours, double ours_s,
           const std::string& raw, double raw_s) {
  if (me != 0) return;
  std::printf("| %s | %s | %.2f us | %s | %.2f us | %.2f |\n", op.c_str(), ours.c_str(),
              ours_s * 1e6, raw.c_str(), raw_s * 1e6, ours_s / raw_s);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace commgrid;
  MpiEnvironment env(&argc, &argv);
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200;
  auto world = make_mpi_world({.timeout = std::chrono::minutes(5)});
  MPI_Comm raw = world->native();  // the same communicator commgrid's world wraps
  const int me = static_cast<int>(world->rank()), size = static_cast<int>(world->size());
  // The same world once more, its collectives MPI's blocking calls.
  auto fast = make_mpi_world(
      {.timeout = std::chrono::minutes(5), .collective_calls = MpiCollectiveCalls::blocking});
  if (me == 0)
    std::printf(
        "%d ranks, %d iterations (x10 for the small collectives), median of the "
        "slowest rank per call\n\n| op | commgrid | time | raw MPI | time | ratio |\n"
        "|---|---|---:|---|---:|---:|\n",
        size, iterations);
  std::vector<int> mine;  // this rank's parity class, ascending
  for (int r = me % 2; r < size; r += 2) mine.push_back(r);
  const std::vector<Rank> mine_ranks(mine.begin(), mine.end());
  MPI_Group world_group = MPI_GROUP_NULL;
  check(MPI_Comm_group(raw, &world_group), "MPI_Comm_group");

  // Creation, each with the destruction of what it made.
  auto m = row(raw,
               {{"split", [&] { auto g = world->split(me % 2, me, "parity#0"); }, {}},
                {"MPI_Comm_split",
                 [&] {
                   MPI_Comm c = MPI_COMM_NULL;
                   check(MPI_Comm_split(raw, me % 2, me, &c), "MPI_Comm_split");
                   MPI_Comm_free(&c);
                 },
                 {}}},
               iterations);
  print(me, "split", "split", m[0], "MPI_Comm_split", m[1]);
  m = row(raw,
          {{"create_group", [&] { auto g = world->create_group(mine_ranks, "parity#0"); }, {}},
           {"MPI_Comm_create_group",
            [&] {
              MPI_Group g = MPI_GROUP_NULL;
              check(MPI_Group_incl(world_group, static_cast<int>(mine.size()), mine.data(), &g),
                    "MPI_Group_incl");
              MPI_Comm c = MPI_COMM_NULL;
              check(MPI_Comm_create_group(raw, g, 7, &c), "MPI_Comm_create_group");
              MPI_Group_free(&g);
              MPI_Comm_free(&c);
            },
            {}}},
          iterations);
  print(me, "create_group", "create_group", m[0], "MPI_Group_incl + MPI_Comm_create_group", m[1]);
  std::vector<int> evens;
  for (int r = 0; r < size; r += 2) evens.push_back(r);
  const std::vector<Rank> even_ranks(evens.begin(), evens.end());
  m = row(raw,
          {{"create_group_collective",
            [&] { auto g = world->create_group_collective(even_ranks, "evens#0"); },
            {}},
           {"MPI_Comm_create",
            [&] {
              MPI_Group g = MPI_GROUP_NULL;
              check(MPI_Group_incl(world_group, static_cast<int>(evens.size()), evens.data(), &g),
                    "MPI_Group_incl");
              MPI_Comm c = MPI_COMM_NULL;
              check(MPI_Comm_create(raw, g, &c), "MPI_Comm_create");
              MPI_Group_free(&g);
              if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
            },
            {}}},
          iterations);
  print(me, "create_group_collective", "create_group_collective", m[0],
        "MPI_Group_incl + MPI_Comm_create", m[1]);

  // Collectives: commgrid's default (nonblocking calls, tested) against MPI_Ixxx + MPI_Wait,
  // and commgrid with blocking calls against the blocking MPI call.
  const int small = iterations * 10;
  m = row(raw,
          {{"barrier", [&] { world->barrier()->wait(); }, {}},
           {"barrier (blocking)", [&] { fast->barrier()->wait(); }, {}},
           {"MPI_Ibarrier + MPI_Wait",
            [&] {
              MPI_Request r = MPI_REQUEST_NULL;
              check(MPI_Ibarrier(raw, &r), "MPI_Ibarrier");
              check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
            },
            {}},
           {"MPI_Barrier", [&] { check(MPI_Barrier(raw), "MPI_Barrier"); }, {}}},
          small);
  print(me, "barrier", "barrier", m[0], "MPI_Ibarrier + MPI_Wait", m[2]);
  print(me, "barrier", "barrier, blocking calls", m[1], "MPI_Barrier", m[3]);
  for (const int count : {1, 256, 262144}) {  // 4 B, 1 KiB, 1 MiB of float32
    std::vector<float> in(static_cast<std::size_t>(count), 1.f), out(in.size());
    const std::string label = "allreduce " + std::string(count == 1     ? "4 B"
                                                         : count == 256 ? "1 KiB"
                                                                        : "1 MiB");
    m = row(raw,
            {{"allreduce",
              [&] {
                world->allreduce(in.data(), out.data(), in.size(), DataType::float32, ReduceOp::sum)
                    ->wait();
              },
              {}},
             {"allreduce (blocking)",
              [&] {
                fast->allreduce(in.data(), out.data(), in.size(), DataType::float32, ReduceOp::sum)
                    ->wait();
              },
              {}},
             {"MPI_Iallreduce + MPI_Wait",
              [&] {
                MPI_Request r = MPI_REQUEST_NULL;
                check(MPI_Iallreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, raw, &r),
                      "MPI_Iallreduce");
                check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
              },
              {}},
             {"MPI_Allreduce",
              [&] {
                check(MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, raw),
                      "MPI_Allreduce");
              },
              {}}},
            count > 1024 ? iterations : small);
    print(me, label, "allreduce", m[0], "MPI_Iallreduce + MPI_Wait", m[2]);
    print(me, label, "allreduce, blocking calls", m[1], "MPI_Allreduce", m[3]);
  }
  std::vector<float> b(256, 1.f), g(256 * static_cast<std::size_t>(size));
  m = row(
      raw,
      {{"broadcast",
        [&] { world->broadcast(b.data(), b.size(), DataType::float32, 0)->wait(); },
        {}},
       {"broadcast (blocking)",
        [&] { fast->broadcast(b.data(), b.size(), DataType::float32, 0)->wait(); },
        {}},
       {"MPI_Ibcast + MPI_Wait",
        [&] {
          MPI_Request r = MPI_REQUEST_NULL;
          check(MPI_Ibcast(b.data(), 256, MPI_FLOAT, 0, raw, &r), "MPI_Ibcast");
          check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
        },
        {}},
       {"MPI_Bcast", [&] { check(MPI_Bcast(b.data(), 256, MPI_FLOAT, 0, raw), "MPI_Bcast"); }, {}}},
      small);
  print(me, "broadcast 1 KiB", "broadcast", m[0], "MPI_Ibcast + MPI_Wait", m[2]);
  print(me, "broadcast 1 KiB", "broadcast, blocking calls", m[1], "MPI_Bcast", m[3]);
  m = row(raw,
          {{"allgather",
            [&] { world->allgather(b.data(), g.data(), b.size(), DataType::float32)->wait(); },
            {}},
           {"allgather (blocking)",
            [&] { fast->allgather(b.data(), g.data(), b.size(), DataType::float32)->wait(); },
            {}},
           {"MPI_Iallgather + MPI_Wait",
            [&] {
              MPI_Request r = MPI_REQUEST_NULL;
              check(MPI_Iallgather(b.data(), 256, MPI_FLOAT, g.data(), 256, MPI_FLOAT, raw, &r),
                    "MPI_Iallgather");
              check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
            },
            {}},
           {"MPI_Allgather",
            [&] {
              check(MPI_Allgather(b.data(), 256, MPI_FLOAT, g.data(), 256, MPI_FLOAT, raw),
                    "MPI_Allgather");
            },
            {}}},
          small);
  print(me, "allgather 1 KiB", "allgather", m[0], "MPI_Iallgather + MPI_Wait", m[2]);
  print(me, "allgather 1 KiB", "allgather, blocking calls", m[1], "MPI_Allgather", m[3]);
  MPI_Group_free(&world_group);
  fast.reset();
  world.reset();
  return 0;
}
