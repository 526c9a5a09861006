// A program for the resilience tests, run under `commgrid launch --spares`: a thin user of
// the resilient driver over a tp 2 layout whose every step allreduces (step + 1) *
// (rank + 1) over dp; each rank keeps the sums as its state (a StateProvider), replicated
// across its dp group. Asked to, one process dies (SIGKILL) or stops itself (SIGSTOP) at a
// chosen step; the driver detects it, agrees, regroups with a spare, rolls back to the last
// snapshot every survivor holds, the spare fetches its state from a dp replica, and at the
// end every rank prints its sums. "killlaunch P K": process P SIGKILLs
// its launcher at step K (on node 0, the store dies with it):
//   resilience_worker STEPS [kill P K]... [stop P K] [killrec P E] [killlaunch P K]
//   resilience_worker STEPS ... [stopfor P K MS]   (P stops at step K, is continued after MS ms)
//   resilience_worker continue PID   (waits for epoch 1's decision, then SIGCONTs PID)
//   resilience_worker continue-after PID MS
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/gloo.hpp"
#include "commgrid/resilient_driver.hpp"

namespace {

using namespace commgrid;
using namespace std::chrono_literals;

struct Fault {
  std::int64_t process = -1;
  int step = -1;
  int signal = SIGKILL;
  bool in_recovery = false;  // "killrec P E": dies right after adopting epoch E's decision
  bool launcher = false;     // "killlaunch P K": SIGKILLs its launcher, not itself
  long long stop_ms = -1;    // "stopfor P K MS": continued after MS ms, not after epoch 1
  bool fired = false;        // each fault happens once (a rollback runs its step again)
};

// This process's parent when it is `commgrid launch` (argv[1] "launch"), else nothing: a
// parent that died already is not mistaken for the process that adopted this one.
std::optional<pid_t> launch_parent() {
  const pid_t parent = ::getppid();
  std::ifstream in("/proc/" + std::to_string(parent) + "/cmdline", std::ios::binary);
  std::string exe, sub;
  if (parent > 1 && std::getline(in, exe, '\0') && std::getline(in, sub, '\0') && sub == "launch")
    return parent;
  return std::nullopt;
}

// The worker's state: one sum per finished step, equal on the members of a dp group.
class Sums final : public StateProvider {
 public:
  std::vector<double> sums;
  StateBytes save() override {
    StateBytes out(sums.size() * sizeof(double));
    if (!out.empty()) std::memcpy(out.data(), sums.data(), out.size());  // no step done: none
    return out;
  }
  void load(std::span<const std::byte> bytes) override {
    sums.resize(bytes.size() / sizeof(double));
    if (!bytes.empty()) std::memcpy(sums.data(), bytes.data(), bytes.size());
  }
};

int run(int argc, char** argv) {
  const auto launch = read_spare_launch();
  if (!launch) {
    std::cerr << "error: run under commgrid launch --spares\n";
    return 2;
  }
  if (argc == 4 && std::string(argv[1]) == "continue-after") {
    // The helper of a process stopped for a while: SIGCONTs it after MS milliseconds.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(argv[3])));
    ::kill(static_cast<pid_t>(std::atoll(argv[2])), SIGCONT);
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "continue") {
    // The helper of a stopped process: once the others decided epoch 1, wake it.
    StoreOptions so;
    so.job_id = launch->job_id;
    so.token = launch->token;
    auto store = open_store(launch->store, so);
    const std::vector<std::string> keys{epoch_decision_key(kResiliencePrefix, 1)};
    while (!store->wait_for(keys, 1s).empty()) {}
    ::kill(static_cast<pid_t>(std::atoll(argv[2])), SIGCONT);
    return 0;
  }
  const int steps = argc > 1 ? std::atoi(argv[1]) : 4;
  std::vector<Fault> faults;
  for (int i = 2; i + 2 < argc; i += 3) {
    Fault f;
    f.signal =
        std::string(argv[i]) == "stop" || std::string(argv[i]) == "stopfor" ? SIGSTOP : SIGKILL;
    f.in_recovery = std::string(argv[i]) == "killrec";
    f.launcher = std::string(argv[i]) == "killlaunch";
    f.process = std::atoll(argv[i + 1]);
    f.step = std::atoi(argv[i + 2]);
    if (std::string(argv[i]) == "stopfor" && i + 3 < argc) {  // "stopfor P K MS"
      f.stop_ms = std::atoll(argv[i + 3]);
      ++i;
    }
    faults.push_back(f);
  }
  ResilientOptions options;
  options.layout.world_size = launch->world_size();
  options.layout.tp = 2;
  options.shrink = false;
  Recovery* rec = nullptr;
  const std::string token = launch->token;
  options.factory = [&](const std::string& prefix, Rank rank, Rank size) {
    GlooOptions o;
    o.timeout = rec->options().timeout;
    o.prefix = prefix;
    o.token = effective_token(*rec->store(), token);
    o.store = rec->store();
    o.rank = rank;
    o.size = size;
    return make_gloo_world(o);
  };
  auto driver = make_resilient_driver(*launch, options);
  rec = &driver->recovery();
  // With killlaunch, every process says it is up, and the launcher is killed only once all
  // are (the test's order of events: no process is still starting when the store dies).
  const auto up_key = [](std::int64_t p) { return "resilience-test/up/" + std::to_string(p); };
  const bool kills_launch =
      std::any_of(faults.begin(), faults.end(), [](const Fault& f) { return f.launcher; });
  if (kills_launch && launch->incarnation == 0)
    rec->store()->set(up_key(launch->process), std::span<const char>("1", 1));

  Sums state;
  EpochContext epoch;
  ResilientCallbacks callbacks;
  callbacks.start_epoch = [&](const EpochContext& ctx) { epoch = ctx; };
  callbacks.stop_epoch = [&] { epoch = EpochContext{}; };
  // The "killrec" fault: a process that dies during the recovery, right after adopting
  // the decision, before the new world exists.
  callbacks.decided = [&](const EpochDecision& d) {
    for (const Fault& f : faults)
      if (f.in_recovery && f.process == launch->process && f.step == d.epoch &&
          launch->incarnation == 0)
        ::raise(SIGKILL);
  };
  // Faults at the start of a step, before its snapshot.
  callbacks.begin_step = [&](std::int64_t step) {
    for (Fault& f : faults)
      if (!f.in_recovery && !f.fired && f.process == launch->process && f.step == step &&
          launch->incarnation == 0) {
        f.fired = true;
        // A second failure is only survivable with a spare: when none is left, wait for a
        // restarted process to register for the next epoch first (the test's order of
        // events, not the runtime's).
        for (int wait = 0; rec->map().spares_left() == 0 && wait < 600; ++wait) {
          bool registered = false;
          for (std::int64_t p = 0; p < rec->map().num_processes(); ++p)
            registered =
                registered ||
                (rec->map().role(p) == ProcessRole::dead &&
                 rec->store()->has(epoch_alive_key(kResiliencePrefix, rec->epoch() + 1, p)));
          if (registered) break;
          std::this_thread::sleep_for(100ms);
        }
        if (f.launcher) {
          // Its launcher's death ends this process too (launch's PR_SET_PDEATHSIG): a
          // process left waiting here is one that outlived its launcher.
          const auto parent = launch_parent();
          if (!parent)
            throw ConfigError("killlaunch", "killlaunch: the parent is not commgrid launch");
          std::vector<std::string> all;
          for (std::int64_t p = 0; p < launch->num_processes; ++p) all.push_back(up_key(p));
          if (!rec->store()->wait_for(all, 4 * rec->options().timeout).empty())
            throw TimeoutError("killlaunch: not every process came up");
          ::kill(*parent, SIGKILL);
          // Until that death kills this process: stepping on could finish the job first
          // (the launcher takes a while to die), its peers wait for it at this step.
          for (;;) ::pause();
        }
        if (f.signal == SIGSTOP) {
          // A helper wakes it once the others have declared it dead.
          if (::fork() == 0) {
            const std::string self = argv[0], pid = std::to_string(::getppid());
            const std::string ms = std::to_string(f.stop_ms);
            if (f.stop_ms >= 0)
              ::execl(self.c_str(), self.c_str(), "continue-after", pid.c_str(), ms.c_str(),
                      static_cast<char*>(nullptr));
            else
              ::execl(self.c_str(), self.c_str(), "continue", pid.c_str(),
                      static_cast<char*>(nullptr));
            ::_exit(127);
          }
        }
        ::raise(f.signal);
      }
  };
  callbacks.step = [&](std::int64_t step) {
    const auto r = static_cast<double>(epoch.rank);
    double v = static_cast<double>(step + 1) * (r + 1);
    epoch.groups->group(GroupKind::dp).allreduce(std::span<double>(&v, 1), ReduceOp::sum)->wait();
    epoch.world->barrier()->wait();
    state.sums.push_back(v);
  };
  const std::optional<Rank> rank = driver->run(steps, state, callbacks);
  if (!rank) return 0;  // the job finished without needing this spare
  std::string line =
      "rank " + std::to_string(*rank) + " epoch " + std::to_string(rec->epoch()) + " sums";
  for (double v : state.sums) line += " " + std::to_string(static_cast<long long>(v));
  std::cout << line + "\n" << std::flush;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const RecoveryError&) {
    return 1;  // the job's end: commgrid launch says why, once
  } catch (const std::exception& e) {
    // One write, as launch_worker's: a process stopped right after cannot leave half a line.
    std::cerr << ("error: " + std::string(e.what()) + "\n") << std::flush;
    return 1;
  }
}
