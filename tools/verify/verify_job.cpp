#include "verify/verify_job.hpp"

#include <algorithm>
#include <iostream>
#include <mutex>

#include "commgrid/error.hpp"
#include "commgrid/hyper_grid_groups.hpp"
#include "commgrid/local_ranks.hpp"
#include "plan/plan_job.hpp"

namespace commgrid::cli {

int run_verify_job(const std::string& path, std::optional<int> local,
                   std::chrono::milliseconds timeout) {
  const Job job = read_job(path);
  if (job.world_size > 1024)
    throw ConfigError("job", "job.world_size: " + std::to_string(job.world_size) +
                                 " rank-threads are more than verify --job runs (1024)");
  if (local && *local != job.world_size)
    throw InvalidValueError("local", "local: --local " + std::to_string(*local) +
                                         " differs from the job's world_size " +
                                         std::to_string(job.world_size));
  // Failures per (module, group set), gathered from every rank.
  std::mutex mu;
  std::vector<std::vector<std::string>> failures(job.modules.size());
  for (std::size_t m = 0; m < job.modules.size(); ++m)
    failures[m].resize(job.modules[m].groups.size());
  GlooOptions options;
  options.timeout = timeout;
  run_local_ranks(
      static_cast<int>(job.world_size),
      [&](Communicator& world) {
        for (std::size_t m = 0; m < job.modules.size(); ++m) {
          HyperGridGroups groups(job.modules[m].grid);
          for (std::size_t s = 0; s < job.modules[m].groups.size(); ++s) {
            const auto& dims = job.modules[m].groups[s];
            Communicator* c = groups.create_group(world, dims);
            const auto want = groups.grid().group_of(dims, world.rank());
            std::string failure;
            if ((c != nullptr) != want.has_value()) {
              failure = "rank " + std::to_string(world.rank()) +
                        (c ? " got a group outside the module" : " got no group");
            } else if (c) {
              std::vector<std::int64_t> got(want->size());
              std::int64_t mine = world.rank();
              c->allgather(&mine, got.data(), 1, DataType::int64)->wait();
              std::vector<std::int64_t> sorted(want->begin(), want->end());
              std::sort(sorted.begin(), sorted.end());
              if (got != sorted)
                failure = "rank " + std::to_string(world.rank()) + ": allgather gave other members";
            }
            if (!failure.empty()) {
              const std::lock_guard<std::mutex> lock(mu);
              if (failures[m][s].empty()) failures[m][s] = failure;
            }
          }
        }
      },
      options);
  bool ok = true;
  for (std::size_t m = 0; m < job.modules.size(); ++m) {
    const JobModule& mod = job.modules[m];
    for (std::size_t s = 0; s < mod.groups.size(); ++s) {
      const std::string key = mod.grid.key(mod.groups[s]);
      const std::size_t n = mod.grid.groups(mod.groups[s]).size();
      std::cout << mod.name << " " << key << ": " << n << " groups "
                << (failures[m][s].empty() ? "ok" : "FAILED: " + failures[m][s]) << "\n";
      ok = ok && failures[m][s].empty();
    }
  }
  std::cout << (ok ? "verified " : "verify failed: ") << job.modules.size() << " modules on "
            << job.world_size << " ranks\n"
            << std::flush;
  return ok ? 0 : 1;
}

}  // namespace commgrid::cli
