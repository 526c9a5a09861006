// Where this process stands in its job, from whichever launcher started it.
#include "commgrid/launch_info.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "commgrid/store.hpp"
#include "commgrid/world_plan.hpp"

namespace commgrid {
namespace {

// One launcher's variable names; local_size may be absent ("").
struct LauncherVars {
  Launcher kind;
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// The documented order: the launcher closest to the process first (commgrid launch may run
// under srun, torchrun under srun, and srun sets PMI_* for MPI programs too).
constexpr LauncherVars kLaunchers[] = {
    {Launcher::commgrid_launch, "commgrid launch", "COMMGRID_RANK", "COMMGRID_WORLD_SIZE",
     "COMMGRID_LOCAL_RANK", "COMMGRID_LOCAL_WORLD_SIZE"},
    {Launcher::torchrun, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::slurm, "SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
     "SLURM_NTASKS_PER_NODE"},
    {Launcher::open_mpi, "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::hydra, "Hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
};

std::optional<std::string> process_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int parse_int(const char* name, const std::string& text, int min) {
  if (text.empty()) throw InvalidValueError(name, std::string(name) + " is set but empty");
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw InvalidValueError(name,
                            std::string(name) + "='" + text + "' is not a whole decimal number");
  if (value < min)
    throw InvalidValueError(name,
                            std::string(name) + "=" + text + " must be >= " + std::to_string(min));
  return value;
}

// A launcher's world as its variables say; nullopt when its rank variable is unset.
struct Seen {
  const LauncherVars* vars;
  int rank, size, local_rank, local_size;
  [[nodiscard]] std::string describe() const {
    return std::string(vars->name) + " says rank " + std::to_string(rank) + " of " +
           std::to_string(size) + " (" + vars->rank + ", " + vars->size + ")";
  }
};

std::optional<Seen> read_launcher(const LauncherVars& v, const EnvLookup& lookup) {
  auto rank_text = lookup(v.rank);
  if (!rank_text) return std::nullopt;
  auto size_text = lookup(v.size);
  if (!size_text)
    throw ConfigError(v.size,
                      std::string(v.rank) + " is set but " + v.size + " is not (" + v.name + ")");
  Seen s{&v, parse_int(v.rank, *rank_text, 0), parse_int(v.size, *size_text, 1), 0, 0};
  if (s.rank >= s.size)
    throw RankOutOfRangeError(v.rank, std::string(v.rank) + "=" + std::to_string(s.rank) +
                                          " is not below " + v.size + "=" + std::to_string(s.size));
  if (auto lr = lookup(v.local_rank)) s.local_rank = parse_int(v.local_rank, *lr, 0);
  if (auto ls = lookup(v.local_size)) {
    // SLURM writes "2(x3)" for uneven nodes: a count per node is then not one number.
    if (std::string(v.local_size) != "SLURM_NTASKS_PER_NODE" ||
        ls->find_first_not_of("0123456789") == std::string::npos)
      s.local_size = parse_int(v.local_size, *ls, 1);
  }
  if (s.local_size > 0 && s.local_rank >= s.local_size)
    throw RankOutOfRangeError(v.local_rank, std::string(v.local_rank) + "=" +
                                                std::to_string(s.local_rank) + " is not below " +
                                                v.local_size + "=" + std::to_string(s.local_size));
  return s;
}

// Whether `outer` (a later launcher) is consistent with `inner` (the one that gives the
// world): the same world, or the outer one counts nodes of a per-node inner launch.
bool agrees(const Seen& inner, const Seen& outer) {
  if (inner.rank == outer.rank && inner.size == outer.size) return true;
  if (inner.local_size <= 0 || inner.size % inner.local_size != 0) return false;
  return outer.size == inner.size / inner.local_size && outer.rank == inner.rank / inner.local_size;
}

std::optional<std::string> nonempty(const EnvLookup& lookup, const char* name) {
  auto v = lookup(name);
  if (v && v->empty()) throw InvalidValueError(name, std::string(name) + " is set but empty");
  return v;
}

std::chrono::milliseconds parse_timeout(const std::string& t) {
  const char* begin = t.c_str();
  char* end = nullptr;
  const double seconds = std::strtod(begin, &end);
  if (t.empty() || end != begin + t.size() || !std::isfinite(seconds) || seconds <= 0 ||
      seconds > 1e9)
    throw InvalidValueError("COMMGRID_TIMEOUT",
                            "COMMGRID_TIMEOUT='" + t + "' is not a positive number of seconds");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000.0)));
}

}  // namespace

std::optional<std::chrono::milliseconds> read_launch_timeout(const EnvLookup& lookup) {
  if (auto t = lookup("COMMGRID_TIMEOUT")) return parse_timeout(*t);
  return std::nullopt;
}

std::optional<std::chrono::milliseconds> read_launch_timeout() {
  return read_launch_timeout(process_env);
}

bool launched(const EnvLookup& lookup) {
  for (const auto& v : kLaunchers)
    if (lookup(v.rank)) return true;
  return false;
}

bool launched() { return launched(process_env); }

namespace {
// The launcher that gives the world (the first of kLaunchers found), checked against every
// later one that is also present; nullopt when none is.
std::optional<Seen> innermost_launcher(const EnvLookup& lookup) {
  std::vector<Seen> seen;
  for (const auto& v : kLaunchers)
    if (auto s = read_launcher(v, lookup)) seen.push_back(*s);
  if (seen.empty()) return std::nullopt;
  const Seen& inner = seen.front();
  for (size_t i = 1; i < seen.size(); ++i)
    if (!agrees(inner, seen[i]))
      throw IncompatibleError(
          "launcher", "launchers disagree: " + inner.describe() + ", " + seen[i].describe());
  return inner;
}
}  // namespace

DetectedLauncher detect_launcher(const EnvLookup& lookup) {
  DetectedLauncher out;
  const std::optional<Seen> inner = innermost_launcher(lookup);
  out.store = lookup("COMMGRID_STORE").has_value() || lookup("MASTER_ADDR").has_value();
  if (!inner) return out;
  out.launcher = inner->vars->kind;
  out.rank = inner->rank;
  out.size = inner->size;
  out.variables = std::string(inner->vars->rank) + "=" + std::to_string(inner->rank) + ", " +
                  inner->vars->size + "=" + std::to_string(inner->size);
  return out;
}

DetectedLauncher detect_launcher() { return detect_launcher(process_env); }

LaunchInfo read_launch_info(const EnvLookup& lookup) {
  const std::optional<Seen> found = innermost_launcher(lookup);
  if (!found)
    throw ConfigError("launcher",
                      "no launcher found: none of COMMGRID_RANK (commgrid launch), RANK "
                      "(torchrun), SLURM_PROCID (srun), OMPI_COMM_WORLD_RANK (mpirun) or "
                      "PMI_RANK (Hydra) is set");
  const Seen& inner = *found;
  LaunchInfo out;
  out.launcher =
      std::string(inner.vars->name) + " (" + inner.vars->rank + ", " + inner.vars->size + ")";
  out.rank = inner.rank;
  out.size = inner.size;
  out.local_rank = inner.local_rank;
  out.local_size = inner.local_size;
  if (auto s = nonempty(lookup, "COMMGRID_STORE")) {
    out.store = *s;
  } else {
    auto addr = nonempty(lookup, "MASTER_ADDR");
    auto port = nonempty(lookup, "MASTER_PORT");
    if (!addr || !port)
      throw ConfigError("COMMGRID_STORE",
                        std::string("no rendezvous store: ") + inner.vars->name +
                            " started this process, but neither COMMGRID_STORE nor "
                            "MASTER_ADDR and MASTER_PORT are set");
    (void)parse_int("MASTER_PORT", *port, 1);
    out.store = "tcp://" + *addr + ":" + *port;
  }
  if (auto j = nonempty(lookup, "COMMGRID_JOB_ID")) out.job_id = *j;
  else if (auto t = nonempty(lookup, "TORCHELASTIC_RUN_ID")) out.job_id = "torchrun-" + *t;
  else if (auto sj = nonempty(lookup, "SLURM_JOB_ID")) {
    out.job_id = "slurm-" + *sj;
    if (auto step = lookup("SLURM_STEP_ID"); step && !step->empty()) out.job_id += "." + *step;
  } else out.job_id = "default";
  for (char c : out.job_id)
    if (c == '/' || c == '\n' || c == '\0' || c == ' ')
      throw InvalidValueError(
          "COMMGRID_JOB_ID", "job id '" + out.job_id + "' may not contain '/', spaces or newlines");
  if (auto t = lookup("COMMGRID_TOKEN")) {
    if (t->empty()) throw InvalidValueError("COMMGRID_TOKEN", "COMMGRID_TOKEN is set but empty");
    out.token = *t;
  }
  if (auto t = lookup("COMMGRID_TIMEOUT")) out.timeout = parse_timeout(*t);
  return out;
}

LaunchInfo read_launch_info() { return read_launch_info(process_env); }

std::shared_ptr<Store> open_launch_store(const LaunchInfo& info,
                                         std::chrono::milliseconds timeout) {
  StoreOptions so;
  so.job_id = info.job_id;
  so.token = info.token;
  so.timeout = timeout;
  // Under commgrid launch --spares the launcher serves the store (so that losing rank 0
  // loses no store).
  so.serve = info.rank == 0 && std::getenv("COMMGRID_STORE_SERVED") == nullptr;
  so.rank = info.rank;
  return open_store(info.store, so);
}

namespace {
std::string required(const char* name) {
  std::optional<std::string> v = process_env(name);
  if (!v)
    throw ConfigError(name, std::string(name) +
                                " is not set (commgrid launch sets COMMGRID_RANK, "
                                "COMMGRID_WORLD_SIZE and COMMGRID_STORE)");
  if (v->empty()) throw ConfigError(name, std::string(name) + " is set but empty");
  return *v;
}
}  // namespace

bool world_env_present() { return std::getenv("COMMGRID_RANK") != nullptr; }

WorldEnv read_world_env() {
  WorldEnv out;
  out.rank = parse_int("COMMGRID_RANK", required("COMMGRID_RANK"), 0);
  out.size = parse_int("COMMGRID_WORLD_SIZE", required("COMMGRID_WORLD_SIZE"), 1);
  if (out.rank >= out.size)
    throw RankOutOfRangeError("COMMGRID_RANK",
                              "COMMGRID_RANK=" + std::to_string(out.rank) +
                                  " is not below COMMGRID_WORLD_SIZE=" + std::to_string(out.size));
  out.store = required("COMMGRID_STORE");
  if (auto t = process_env("COMMGRID_TIMEOUT")) out.timeout = parse_timeout(*t);
  return out;
}

}  // namespace commgrid
