// The launch environment, read in one place (launch_env.hpp). Each variable is parsed by
// one of the strict parsers below; nothing else in commgrid reads a launcher's variable.
#include "commgrid/launch_env.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

namespace commgrid {
namespace {

// ---- strict parsers ----------------------------------------------------------------------

// A value as it may be quoted in an error: the environment is the user's, but a value may
// hold anything; control characters are shown as '?' and a long one is cut.
std::string quoted(std::string_view text) {
  std::string out;
  for (const char c : text.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + out + (text.size() > 80 ? "...'" : "'");
}

// A whole decimal number in [min, max]: no sign but '-', no spaces, no trailing characters.
Rank whole(const char* name, const std::string& text, Rank min,
           Rank max = std::numeric_limits<Rank>::max()) {
  if (text.empty()) throw InvalidValueError(name, std::string(name) + " is set but empty");
  Rank value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range)
    throw InvalidValueError(name, std::string(name) + "=" + quoted(text) + " is out of range");
  if (ec != std::errc() || end != text.data() + text.size())
    throw InvalidValueError(
        name, std::string(name) + "=" + quoted(text) + " is not a whole decimal number");
  if (value < min)
    throw InvalidValueError(name,
                            std::string(name) + "=" + text + " must be >= " + std::to_string(min));
  if (value > max)
    throw InvalidValueError(name,
                            std::string(name) + "=" + text + " must be <= " + std::to_string(max));
  return value;
}

// A positive whole count (a size in bytes, a number of connections).
std::size_t positive_count(const char* name, const std::string& text) {
  std::size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value == 0)
    throw InvalidValueError(
        name, std::string(name) + "=" + quoted(text) + " is not a positive whole number");
  return value;
}

// Seconds, decimals allowed, > 0 and at most 10^9 (about 31 years), to the millisecond
// (at least 1 ms).
std::chrono::milliseconds seconds(const char* name, const std::string& text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
      !std::isfinite(value) || value <= 0 || value > 1e9)
    throw InvalidValueError(
        name, std::string(name) + "=" + quoted(text) + " is not a positive number of seconds");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(value * 1000.0)));
}

// A value that may not be empty.
std::string nonempty(const char* name, const std::string& text) {
  if (text.empty()) throw InvalidValueError(name, std::string(name) + " is set but empty");
  return text;
}

// A job id: a store key component and a file name part.
std::string job_id(const char* name, const std::string& text) {
  nonempty(name, text);
  for (const char c : text)
    if (c == '/' || c == ' ' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      throw InvalidValueError(
          name, "job id " + quoted(text) + " may not contain '/', spaces or newlines");
  return text;
}

// ---- the launchers ---------------------------------------------------------------------

// One launcher's variable names.
struct LauncherVars {
  Launcher kind;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// The documented order: the launcher closest to the process first (commgrid launch may run
// under srun, torchrun under srun, and srun sets PMI_* for MPI programs too).
constexpr LauncherVars kLaunchers[] = {
    {Launcher::commgrid_launch, "COMMGRID_RANK", "COMMGRID_WORLD_SIZE", "COMMGRID_LOCAL_RANK",
     "COMMGRID_LOCAL_WORLD_SIZE"},
    {Launcher::torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {Launcher::open_mpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::hydra, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
};

std::optional<LauncherRanks> read_launcher(const LauncherVars& v, const EnvLookup& lookup) {
  const auto rank_text = lookup(v.rank);
  if (!rank_text) return std::nullopt;
  const Rank rank = whole(v.rank, *rank_text, 0);
  const auto size_text = lookup(v.size);
  if (!size_text)
    throw ConfigError(v.size, std::string(v.rank) + " is set but " + v.size + " is not (" +
                                  launcher_name(v.kind) + ")");
  LauncherRanks s;
  s.launcher = v.kind;
  s.rank_variable = v.rank;
  s.size_variable = v.size;
  s.rank = rank;
  s.size = whole(v.size, *size_text, 1);
  if (s.rank >= s.size)
    throw RankOutOfRangeError(v.rank, std::string(v.rank) + "=" + std::to_string(s.rank) +
                                          " is not below " + v.size + "=" + std::to_string(s.size));
  if (auto lr = lookup(v.local_rank)) s.local_rank = whole(v.local_rank, *lr, 0);
  if (auto ls = lookup(v.local_size)) {
    // SLURM writes "2(x3)" or "2,1" for uneven nodes: a count per node is then not one
    // number.
    const bool uneven = v.kind == Launcher::slurm && !ls->empty() &&
                        ls->find_first_not_of("0123456789") != std::string::npos &&
                        ls->find_first_of("(,") != std::string::npos;
    if (!uneven) s.local_size = whole(v.local_size, *ls, 1);
  }
  if (s.local_size > 0 && s.local_rank >= s.local_size)
    throw RankOutOfRangeError(v.local_rank, std::string(v.local_rank) + "=" +
                                                std::to_string(s.local_rank) + " is not below " +
                                                v.local_size + "=" + std::to_string(s.local_size));
  return s;
}

// Whether `outer` (a later launcher) is consistent with `inner` (the one that gives the
// world): the same world, or the outer one counts nodes of a per-node inner launch.
bool agrees(const LauncherRanks& inner, const LauncherRanks& outer) {
  if (inner.rank == outer.rank && inner.size == outer.size) return true;
  if (inner.local_size <= 0 || inner.size % inner.local_size != 0) return false;
  return outer.size == inner.size / inner.local_size && outer.rank == inner.rank / inner.local_size;
}

// ---- the variables -----------------------------------------------------------------------

// Reads `name` with `parse` into `field` when it is set.
template <typename T, typename Parse>
void read(const EnvLookup& lookup, const char* name, std::optional<T>& field, Parse parse) {
  if (auto v = lookup(name)) field = parse(name, *v);
}

std::optional<SpareEnv> read_spares(const EnvLookup& lookup) {
  if (!lookup("COMMGRID_PROCESS")) return std::nullopt;
  auto required = [&](const char* name, Rank min) {
    auto v = lookup(name);
    if (!v)
      throw ConfigError(name, std::string(name) + " is not set (commgrid launch --spares sets it)");
    return whole(name, *v, min);
  };
  SpareEnv s;
  s.process = required("COMMGRID_PROCESS", 0);
  s.num_processes = required("COMMGRID_NUM_PROCESSES", 1);
  s.spares = required("COMMGRID_SPARES", 0);
  s.incarnation = required("COMMGRID_INCARNATION", 0);
  if (s.process >= s.num_processes)
    throw RankOutOfRangeError("COMMGRID_PROCESS", "COMMGRID_PROCESS=" + std::to_string(s.process) +
                                                      " is not below COMMGRID_NUM_PROCESSES=" +
                                                      std::to_string(s.num_processes));
  if (s.spares >= s.num_processes)
    throw InvalidValueError("COMMGRID_SPARES", "COMMGRID_SPARES=" + std::to_string(s.spares) +
                                                   " leaves no process of COMMGRID_NUM_PROCESSES=" +
                                                   std::to_string(s.num_processes) +
                                                   " for the world");
  return s;
}

std::optional<std::string> process_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace

std::string launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::none: return "no launcher";
    case Launcher::commgrid_launch: return "commgrid launch";
    case Launcher::torchrun: return "torchrun";
    case Launcher::slurm: return "SLURM";
    case Launcher::open_mpi: return "Open MPI";
    case Launcher::hydra: return "Hydra";
  }
  return "unknown launcher";
}

std::string LauncherRanks::describe() const {
  return launcher_name(launcher) + " says rank " + std::to_string(rank) + " of " +
         std::to_string(size) + " (" + rank_variable + ", " + size_variable + ")";
}

LaunchEnv read_launch_env(const EnvLookup& lookup) {
  LaunchEnv env;
  for (const auto& v : kLaunchers)
    if (auto s = read_launcher(v, lookup)) env.launchers.push_back(*s);
  read(lookup, "COMMGRID_STORE", env.store, nonempty);
  read(lookup, "COMMGRID_JOB_ID", env.job_id, job_id);
  read(lookup, "COMMGRID_TOKEN", env.token, nonempty);
  read(lookup, "COMMGRID_JOB_NONCE", env.nonce, nonempty);
  read(lookup, "COMMGRID_TIMEOUT", env.timeout, seconds);
  read(lookup, "COMMGRID_REDIS_PASSWORD", env.redis_password, nonempty);
  read(lookup, "COMMGRID_GLOO_HOSTNAME", env.gloo_hostname, nonempty);
  read(lookup, "COMMGRID_STORE_MAX_CONNECTIONS", env.store_max_connections, positive_count);
  read(lookup, "COMMGRID_STORE_MAX_BYTES", env.store_max_bytes, positive_count);
  if (auto served = lookup("COMMGRID_STORE_SERVED")) {
    if (*served != "launch")
      throw InvalidValueError("COMMGRID_STORE_SERVED", "COMMGRID_STORE_SERVED=" + quoted(*served) +
                                                           " is not 'launch' (commgrid launch "
                                                           "--spares sets it)");
    env.store_served_by_launcher = true;
  }
  env.spares = read_spares(lookup);
  read(lookup, "MASTER_ADDR", env.master_addr, nonempty);
  read(lookup, "MASTER_PORT", env.master_port,
       [](const char* n, const std::string& t) { return static_cast<int>(whole(n, t, 1, 65535)); });
  read(lookup, "TORCHELASTIC_RUN_ID", env.torchelastic_run_id, job_id);
  auto count_from = [](Rank min) {
    return [min](const char* n, const std::string& t) { return whole(n, t, min); };
  };
  read(lookup, "TORCHELASTIC_RESTART_COUNT", env.restart_count, count_from(0));
  read(lookup, "GROUP_WORLD_SIZE", env.group_world_size, count_from(1));
  read(lookup, "GROUP_RANK", env.group_rank, count_from(0));
  if (env.group_rank && env.group_world_size && *env.group_rank >= *env.group_world_size)
    throw RankOutOfRangeError("GROUP_RANK", "GROUP_RANK=" + std::to_string(*env.group_rank) +
                                                " is not below GROUP_WORLD_SIZE=" +
                                                std::to_string(*env.group_world_size));
  read(lookup, "SLURM_JOB_ID", env.slurm_job_id, job_id);
  if (auto step = lookup("SLURM_STEP_ID"); step && !step->empty())
    env.slurm_step_id = job_id("SLURM_STEP_ID", *step);
  read(lookup, "SLURM_NNODES", env.slurm_nnodes, count_from(1));
  if (!env.slurm_nnodes) read(lookup, "SLURM_JOB_NUM_NODES", env.slurm_nnodes, count_from(1));
  read(lookup, "PMIX_NAMESPACE", env.ompi_job, nonempty);
  if (!env.ompi_job) read(lookup, "OMPI_MCA_ess_base_jobid", env.ompi_job, nonempty);
  return env;
}

LaunchEnv read_launch_env() { return read_launch_env(process_env); }

std::optional<LauncherRanks> LaunchEnv::world() const {
  if (launchers.empty()) return std::nullopt;
  const LauncherRanks& inner = launchers.front();
  for (std::size_t i = 1; i < launchers.size(); ++i)
    if (!agrees(inner, launchers[i]))
      throw IncompatibleError(
          "launcher", "launchers disagree: " + inner.describe() + ", " + launchers[i].describe());
  return inner;
}

std::string LaunchEnv::effective_job_id() const {
  if (job_id) return *job_id;
  if (torchelastic_run_id) return "torchrun-" + *torchelastic_run_id;
  if (slurm_job_id) return "slurm-" + *slurm_job_id + (slurm_step_id ? "." + *slurm_step_id : "");
  return "default";
}

std::optional<std::string> LaunchEnv::store_uri() const {
  if (store) return *store;
  if (master_addr && master_port)
    return "tcp://" + *master_addr + ":" + std::to_string(*master_port);
  return std::nullopt;
}

std::string LaunchEnv::run_nonce() const {
  if (nonce) return *nonce;
  if (slurm_job_id) return "slurm " + *slurm_job_id + (slurm_step_id ? "." + *slurm_step_id : "");
  if (ompi_job) return "open-mpi " + *ompi_job;
  return "";
}

bool LaunchEnv::multi_node() const {
  if (group_world_size && *group_world_size > 1) return true;
  if (slurm_nnodes && *slurm_nnodes > 1) return true;
  for (const LauncherRanks& l : launchers)
    if (l.local_size > 0 && l.local_size < l.size) return true;
  return false;
}

std::string LaunchEnv::security_warning() const {
  if (!multi_node()) return "";
  Rank nodes = 2;
  if (group_world_size) nodes = *group_world_size;
  else if (slurm_nnodes) nodes = *slurm_nnodes;
  else if (!launchers.empty() && launchers.front().local_size > 0)
    nodes =
        (launchers.front().size + launchers.front().local_size - 1) / launchers.front().local_size;
  return unauthenticated_job_warning(nodes, token.has_value());
}

std::optional<SpareEnv> read_spare_env(const LaunchEnv& env) {
  if (!env.spares) return std::nullopt;
  if (!env.store)
    throw ConfigError("COMMGRID_STORE",
                      "COMMGRID_STORE is not set (commgrid launch --spares sets it)");
  return env.spares;
}

std::string unauthenticated_job_warning(Rank nodes, bool has_token) {
  if (nodes <= 1 || has_token) return "";
  return "warning: this job spans " + std::to_string(nodes) +
         " machines without COMMGRID_TOKEN: its tcp:// store hands the job secret to anyone "
         "who can connect to it, so any host that reaches the store's port can join the job; "
         "set the same COMMGRID_TOKEN (and COMMGRID_JOB_ID) on every machine "
         "(docs/security.md)";
}

}  // namespace commgrid
