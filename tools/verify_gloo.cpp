#include "verify_gloo.hpp"

#include <iostream>
#include <mutex>

#include "commgrid/gloo.hpp"
#include "commgrid/layout.hpp"
#include "commgrid/local_ranks.hpp"

namespace commgrid::cli {
namespace {

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// Bad input is found before any communication: the same on every rank.
ParallelConfig checked_config(const LayoutFlags& layout, const VerifyOptions& options, int size) {
  ParallelConfig config = to_config(layout, size);
  const Layout l(config);
  for (GroupKind k : options.kinds)
    if (!l.has_kind(k)) (void)l.num_groups(k);  // throws, saying why the kind is absent
  return config;
}

int print_report(const VerifyReport& report) {
  std::cout << format_verify_report(report) << std::flush;
  for (const KindVerdict& v : report.kinds)
    if (!v.passed) std::cerr << "error: verify failed: " << v.label << ": " << v.failure << "\n";
  return report.passed() ? 0 : 1;
}

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
    const ParallelConfig config = checked_config(layout, options, *local_ranks);
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
      std::cerr << "error: " << one_line(run.first_failure) << "\n";
      return is_config_error(run.errors[static_cast<size_t>(run.first_failed_rank)]) ? 2 : 1;
    }
    return print_report(*report);
  }
  // One rank of a launched job: COMMGRID_* says which, and launch stops the others when
  // this one fails.
  const WorldEnv env = read_world_env();
  const ParallelConfig config = checked_config(layout, options, env.size);
  auto world = make_gloo_world_from_env(gloo);
  VerifyReport report;
  try {
    report = run_verify(*world, config, options);
  } catch (const ConfigError& e) {  // a config mismatch: raised on every rank
    if (world->rank() == 0) std::cerr << "error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "error: rank " << world->rank() << ": " << one_line(e.what()) << std::endl;
    return 1;
  }
  if (world->rank() == 0) return print_report(report);
  return report.passed() ? 0 : 1;
}

}  // namespace commgrid::cli
