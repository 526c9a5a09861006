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
// rank 0; ratios are commgrid / raw.
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

// Runs the variants of one row `iterations` times, interleaved, and prints one line per
// variant: median per call, and its ratio to the first variant (commgrid's).
void row(MPI_Comm comm, const std::string& what, std::vector<Variant> variants, int iterations) {
  int me = 0;
  MPI_Comm_rank(comm, &me);
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
  if (me != 0) return;
  std::vector<double> medians;
  for (Variant& v : variants) {
    std::sort(v.seconds.begin(), v.seconds.end());
    medians.push_back(v.seconds[v.seconds.size() / 2]);
  }
  for (std::size_t j = 0; j < n; ++j)
    std::printf("| %s | %s | %.2f us | %s |\n", what.c_str(), variants[j].name.c_str(),
                medians[j] * 1e6,
                j == 0 ? "" : (std::to_string(medians[0] / medians[j]).substr(0, 4)).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace commgrid;
  mpi::MpiEnvironment env(&argc, &argv);
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200;
  auto world = make_mpi_world(std::chrono::minutes(5));
  MPI_Comm raw = world->native();  // the same communicator commgrid's world wraps
  const int me = world->rank(), size = world->size();
  if (me == 0) {
    std::printf("%d ranks, %d iterations, median of the slowest rank per call; ratio = "
                "commgrid / raw\n\n| op | call | time | ratio |\n|---|---|---:|---:|\n",
                size, iterations);
  }
  std::vector<int> mine;  // this rank's parity class, ascending
  for (int r = me % 2; r < size; r += 2) mine.push_back(r);
  MPI_Group world_group = MPI_GROUP_NULL;
  check(MPI_Comm_group(raw, &world_group), "MPI_Comm_group");

  row(raw, "split", {
      {"commgrid split", [&] { auto g = world->split(me % 2, me, "parity#0"); }, {}},
      {"MPI_Comm_split", [&] {
         MPI_Comm c = MPI_COMM_NULL;
         check(MPI_Comm_split(raw, me % 2, me, &c), "MPI_Comm_split");
         MPI_Comm_free(&c);
       }, {}}}, iterations);
  row(raw, "create_group", {
      {"commgrid create_group", [&] { auto g = world->create_group(mine, "parity#0"); }, {}},
      {"MPI_Comm_create_group", [&] {
         MPI_Group g = MPI_GROUP_NULL;
         check(MPI_Group_incl(world_group, static_cast<int>(mine.size()), mine.data(), &g), "MPI_Group_incl");
         MPI_Comm c = MPI_COMM_NULL;
         check(MPI_Comm_create_group(raw, g, 7, &c), "MPI_Comm_create_group");
         MPI_Group_free(&g);
         MPI_Comm_free(&c);
       }, {}}}, iterations);
  std::vector<int> evens;
  for (int r = 0; r < size; r += 2) evens.push_back(r);
  row(raw, "create_group_collective", {
      {"commgrid create_group_collective", [&] { auto g = world->create_group_collective(evens, "evens#0"); }, {}},
      {"MPI_Comm_create", [&] {
         MPI_Group g = MPI_GROUP_NULL;
         check(MPI_Group_incl(world_group, static_cast<int>(evens.size()), evens.data(), &g), "MPI_Group_incl");
         MPI_Comm c = MPI_COMM_NULL;
         check(MPI_Comm_create(raw, g, &c), "MPI_Comm_create");
         MPI_Group_free(&g);
         if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
       }, {}}}, iterations);

  const int kIters = iterations * 10;
  row(raw, "barrier", {
      {"commgrid barrier", [&] { world->barrier()->wait(); }, {}},
      {"MPI_Barrier", [&] { check(MPI_Barrier(raw), "MPI_Barrier"); }, {}},
      {"MPI_Ibarrier + MPI_Wait", [&] {
         MPI_Request r = MPI_REQUEST_NULL;
         check(MPI_Ibarrier(raw, &r), "MPI_Ibarrier");
         check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
       }, {}}}, kIters);
  for (const int count : {1, 256, 262144}) {  // 4 B, 1 KiB, 1 MiB of float32
    std::vector<float> in(static_cast<std::size_t>(count), 1.f), out(in.size());
    const std::string label = "allreduce " + std::to_string(count * 4) + " B";
    row(raw, label, {
        {"commgrid allreduce", [&] { world->allreduce(in.data(), out.data(), in.size(), DataType::float32, ReduceOp::sum)->wait(); }, {}},
        {"MPI_Allreduce", [&] { check(MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, raw), "MPI_Allreduce"); }, {}},
        {"MPI_Iallreduce + MPI_Wait", [&] {
           MPI_Request r = MPI_REQUEST_NULL;
           check(MPI_Iallreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, raw, &r), "MPI_Iallreduce");
           check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
         }, {}}}, count > 1024 ? iterations : kIters);
  }
  std::vector<float> b(256, 1.f);
  row(raw, "broadcast 1 KiB", {
      {"commgrid broadcast", [&] { world->broadcast(b.data(), b.size(), DataType::float32, 0)->wait(); }, {}},
      {"MPI_Bcast", [&] { check(MPI_Bcast(b.data(), 256, MPI_FLOAT, 0, raw), "MPI_Bcast"); }, {}},
      {"MPI_Ibcast + MPI_Wait", [&] {
         MPI_Request r = MPI_REQUEST_NULL;
         check(MPI_Ibcast(b.data(), 256, MPI_FLOAT, 0, raw, &r), "MPI_Ibcast");
         check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
       }, {}}}, kIters);
  MPI_Group_free(&world_group);
  world.reset();
  return 0;
}
