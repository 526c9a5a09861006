// How the launchers of a multi-node `launch --spares` job end together. Node 0's launcher
// serves the store: it serves it until the job ends, whatever becomes of its own processes,
// that is until every node's processes have ended (each launcher posts it) or a node's
// launcher stopped beating (its host is gone). Every other launcher stays, once its own
// processes have ended, until the job is done or node 0 says it is over, so that each exits
// with the job's outcome. docs/launching.md, "Several nodes".
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launch/job_store.hpp"
#include "launch/launch_settings.hpp"

namespace commgrid::cli {

class JobEnd {
 public:
  /// On a node other than 0, starts beating (a thread posting a beat every period).
  JobEnd(JobStore& store, const LaunchSettings& settings);
  ~JobEnd();
  JobEnd(const JobEnd&) = delete;
  JobEnd& operator=(const JobEnd&) = delete;

  /// How this launcher may leave.
  struct Verdict {
    bool done = false;    ///< the program said the job finished (Recovery::mark_done)
    std::string problem;  ///< why the job ended otherwise (a lost node, a failed store)
  };

  /// This node's processes have all ended: says so to node 0.
  void local_idle();
  /// One look at the job (a few store reads, never a wait): the verdict once this launcher
  /// may leave; nullopt while the job goes on. Call it every few hundred milliseconds.
  [[nodiscard]] std::optional<Verdict> check();

  /// The beat period and how long node 0 waits for a beat before it calls a node lost.
  [[nodiscard]] std::chrono::milliseconds beat_period() const noexcept { return period_; }
  [[nodiscard]] std::chrono::milliseconds lost_after() const noexcept { return lost_after_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Node {
    bool idle = false, lost = false, exited = false;
    std::int64_t beat = 0;
    Clock::time_point heard{};
  };

  void beat_loop();
  std::optional<Verdict> check_as_node0();
  std::optional<Verdict> check_as_other();

  JobStore& store_;
  int node_ = 0, nnodes_ = 1;
  std::chrono::milliseconds period_, lost_after_;
  std::vector<Node> nodes_;                      ///< node 0's view of the others
  bool watching_ = false;                        ///< node 0: idle, watching the others
  std::optional<Clock::time_point> acks_until_;  ///< node 0: over posted, awaiting acks
  std::string lost_text_;
  bool done_seen_ = false;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread beats_;
};

}  // namespace commgrid::cli
