#include "cli_errors.hpp"
#include "verify_gloo.hpp"
#include "command.hpp"

#include <iostream>
#include <mutex>

#include "commgrid/gloo.hpp"
#include "commgrid/layout.hpp"
#include "commgrid/local_ranks.hpp"

namespace commgrid::cli {
namespace {

bool is_config_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const ConfigError&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

int run_verify_gloo(const LayoutFlags& layout, const VerifyOptions& options,
                    std::chrono::milliseconds timeout, std::optional<int> local_ranks) {
  GlooOptions gloo;
  gloo.timeout = timeout;
  if (local_ranks) {
    const ParallelConfig config = checked_verify_config(layout, options, *local_ranks);
    std::mutex mutex;
    std::optional<VerifyReport> report;
    LocalRunResult run = run_local_ranks_collect(*local_ranks, [&](Communicator& world) {
      VerifyReport r = run_verify(world, config, options);
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        report = std::move(r);
      }
    }, gloo);
    if (run.first_failed_rank >= 0) {
      print_error(run.first_failure);
      return is_config_error(run.errors[static_cast<size_t>(run.first_failed_rank)]) ? 2 : 1;
    }
    return print_verify_report(*report);
  }
  // One rank of a launched job (commgrid launch, torchrun, srun, ...): the launcher says
  // which, and launch stops the others when this one fails.
  const LaunchInfo info = read_launch_info();
  const ParallelConfig config = checked_verify_config(layout, options, info.size);
  auto world = make_gloo_world_from_env(gloo);
  VerifyReport report;
  try {
    report = run_verify(*world, config, options);
  } catch (const ConfigError& e) {  // a config mismatch: raised on every rank
    if (world->rank() == 0) print_error(e.what());
    return 2;
  } catch (const Error& e) {
    print_error("rank " + std::to_string(world->rank()) + ": " + e.what());  // one write: never cut mid-line
    return 1;
  }
  if (world->rank() == 0) return print_verify_report(report);
  return report.passed() ? 0 : 1;
}

}  // namespace commgrid::cli
