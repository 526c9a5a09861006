#include "launch/child_env.hpp"

#include <unistd.h>

#include <string_view>
#include <utility>

namespace commgrid::cli {
namespace {

/// The variables launch sets for each process, commgrid's and torchrun's: an inherited
/// value of any of them (an outer launch, torchrun) is replaced, never passed on.
constexpr std::string_view kProcessVariables[] = {
    "COMMGRID_RANK", "COMMGRID_WORLD_SIZE", "COMMGRID_LOCAL_RANK", "COMMGRID_LOCAL_WORLD_SIZE",
    "COMMGRID_STORE", "COMMGRID_JOB_ID", "COMMGRID_TOKEN",
    // torchrun's (torch.distributed.run), so that env:// finds its world.
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    // --spares (docs/resilience.md).
    "COMMGRID_PROCESS", "COMMGRID_NUM_PROCESSES", "COMMGRID_SPARES", "COMMGRID_INCARNATION",
    "COMMGRID_STORE_SERVED",
    // Etcd's root password for granting the job's user (--store etcd://): launch's alone.
    "COMMGRID_ETCD_ROOT_PASSWORD"};

// Whether the job runs on this machine alone: one node whose rendezvous address is the
// loopback (a job of several nodes may keep the default address and rendezvous through an
// etcd store on the network).
bool on_loopback_alone(const JobSetup& job) {
  const std::string_view addr = job.master_addr;
  return job.nnodes == 1 && (addr.starts_with("127.") || addr == "localhost" || addr == "::1");
}

// A loopback address of its own for process p (127.1.0.1, 127.1.0.2, ...): the kernel's
// ephemeral ports are per address, and this Gloo opens a listening socket for each pair it
// connects, so the processes of a few dozen ranks on one address run out of ports.
std::string own_loopback(int p) {
  const unsigned q = static_cast<unsigned>(p) + 1;
  return "127." + std::to_string(1 + (q >> 16)) + "." + std::to_string((q >> 8) & 255U) + "." +
         std::to_string(q & 255U);
}

bool is_process_variable(std::string_view kv) {
  const std::string_view name = kv.substr(0, kv.find('='));
  for (std::string_view v : kProcessVariables)
    if (name == v) return true;
  return false;
}

}  // namespace

std::vector<std::string> child_environment(const LaunchSettings& s, int local, int incarnation,
                                           const std::string& store) {
  const JobSetup& job = s.job;
  const int r = s.process_of(local);
  const std::string world = std::to_string(s.world_size());
  std::vector<std::string> env;
  bool omp_threads = false, gloo_hostname = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    if (is_process_variable(kv) || (s.timeout_text && kv.starts_with("COMMGRID_TIMEOUT=")))
      continue;
    omp_threads = omp_threads || kv.starts_with("OMP_NUM_THREADS=");
    gloo_hostname = gloo_hostname || kv.starts_with("COMMGRID_GLOO_HOSTNAME=");
    env.emplace_back(kv);
  }
  std::vector<std::pair<std::string_view, std::string>> vars = {
      {"COMMGRID_RANK", std::to_string(r)},
      {"COMMGRID_WORLD_SIZE", world},
      {"COMMGRID_LOCAL_RANK", std::to_string(local)},
      {"COMMGRID_LOCAL_WORLD_SIZE", std::to_string(s.nproc)},
      {"COMMGRID_STORE", store},
      {"COMMGRID_JOB_ID", job.job_id},
      {"RANK", std::to_string(r)},
      {"WORLD_SIZE", world},
      {"LOCAL_RANK", std::to_string(local)},
      {"LOCAL_WORLD_SIZE", std::to_string(s.nproc)},
      {"GROUP_RANK", std::to_string(job.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(job.nnodes)},
      {"ROLE_RANK", std::to_string(r)},
      {"ROLE_WORLD_SIZE", world},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", job.master_addr},
      {"TORCHELASTIC_RUN_ID", job.job_id},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(incarnation)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(job.max_restarts)}};
  if (job.resilient) {
    // Processes, not ranks: a spare (process >= W) holds no rank until a decision gives it
    // one, so it gets no COMMGRID_RANK or RANK.
    if (r >= s.world_size())
      std::erase_if(vars, [](const auto& v) {
        return v.first == "COMMGRID_RANK" || v.first == "RANK" || v.first == "ROLE_RANK";
      });
    vars.insert(vars.end(), {{"COMMGRID_PROCESS", std::to_string(r)},
                             {"COMMGRID_NUM_PROCESSES", std::to_string(s.num_processes())},
                             {"COMMGRID_SPARES", std::to_string(job.spares)},
                             {"COMMGRID_INCARNATION", std::to_string(incarnation)},
                             {"COMMGRID_STORE_SERVED", "launch"}});
  }
  for (const auto& [name, value] : vars) env.push_back(std::string(name) + "=" + value);
  if (job.torch_port != 0) env.push_back("MASTER_PORT=" + std::to_string(job.torch_port));
  if (!job.token.empty()) env.push_back("COMMGRID_TOKEN=" + job.token);
  if (s.timeout_text) env.push_back("COMMGRID_TIMEOUT=" + *s.timeout_text);
  // As torchrun does: N ranks on one machine each starting a thread per core would
  // oversubscribe it N times over.
  if (!omp_threads && s.nproc > 1) env.emplace_back("OMP_NUM_THREADS=1");
  // A job on this machine's loopback: commgrid's Gloo ranks listen on an address each (the
  // user's own COMMGRID_GLOO_HOSTNAME wins).
  if (!gloo_hostname && on_loopback_alone(job))
    env.push_back("COMMGRID_GLOO_HOSTNAME=" + own_loopback(r));
  return env;
}

}  // namespace commgrid::cli
