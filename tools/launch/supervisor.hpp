// The supervision of one launch's processes: starts each (its own process group, its
// output through pipes, the launcher's death its death), relays their output, reaps them,
// and decides the launch's end and exit code: the first failure stops the others (or, with
// --spares, the job goes on), --timeout bounds the job, a signal to launch stops every
// process. docs/launching.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launch/job_end.hpp"
#include "launch/launch_settings.hpp"
#include "launch/output_relay.hpp"
#include "launch/spare_keeper.hpp"

namespace commgrid::cli {

class Supervisor {
 public:
  explicit Supervisor(LaunchSettings settings);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  /// Runs the job to its end; returns launch's exit code (0 every process exited 0, or with
  /// --spares the job finished; 1 a failure; 2 bad usage; 124 --timeout; 128+N a signal).
  [[nodiscard]] int run();

 private:
  /// --store etcd:// with COMMGRID_ETCD_ROOT_PASSWORD and a token: creates the job's etcd user
  /// and role (grant_etcd_job; idempotent on every node), before any process starts.
  void grant_etcd_user() const;
  using Clock = std::chrono::steady_clock;

  /// One process of this launch.
  struct Child {
    int local = 0;        ///< its index on this node
    int process = 0;      ///< the job's process number (the rank, without spares)
    int incarnation = 0;  ///< 0, then one more for each restart (--max-restarts)
    pid_t pid = -1;
    bool running = false;
    bool stopped = false;  ///< by SIGSTOP/SIGTSTP/..., until continued
    int stop_signal = 0;
    int status = 0;  ///< its wait status once it ended
    /// Once it ended: its label and whether it held logical rank 0 then (its last lines
    /// are shown as what it was when it wrote them).
    std::optional<std::string> final_label;
    bool final_rank0 = false;
    Stream out, err;
  };

  [[nodiscard]] std::optional<int> start_all();
  [[nodiscard]] std::optional<std::string> start(int local);
  [[nodiscard]] std::optional<std::string> await_exec(Child& c, int exec_fd);
  void loop();
  void await_job_end();
  void relay(const std::vector<Stream*>& ready);
  void emit(Child& c, bool flush_partial);
  void on_signals();
  void reap(bool block);
  void on_failures(std::vector<Child*>& failed);
  void on_process_death(Child& c);
  void begin_stop();
  void tell_epoch_failed(std::int64_t epoch);
  void stop_all(int sig);
  [[nodiscard]] int finish();
  [[nodiscard]] int finish_resilient();

  [[nodiscard]] std::string who(const Child& c) const;
  [[nodiscard]] std::string label(const Child& c) const;
  [[nodiscard]] bool holds_rank0(const Child& c) const;
  [[nodiscard]] bool any_running() const;
  [[nodiscard]] bool every_process_exited(int code) const;
  [[nodiscard]] std::string running_list() const;
  [[nodiscard]] int wait_ms(int at_most) const;

  LaunchSettings s_;
  std::string store_uri_;
  std::unique_ptr<SpareKeeper> spares_;  ///< with --spares
  std::unique_ptr<JobEnd> end_;          ///< with --spares on several nodes
  std::optional<JobEnd::Verdict> end_verdict_;
  Fd signal_fd_;  ///< the read end of the signal self-pipe
  std::vector<Child> children_;
  int started_ = 0;
  std::optional<Clock::time_point> job_deadline_;
  bool timed_out_ = false;
  std::string still_running_;
  std::optional<std::string> failure_;
  std::vector<std::string> also_failed_;
  std::optional<Clock::time_point> settle_until_;  ///< after a first exit 2: see reap()
  bool stopping_ = false;
  Clock::time_point kill_at_{};
  int interrupted_ = 0;
};

}  // namespace commgrid::cli
