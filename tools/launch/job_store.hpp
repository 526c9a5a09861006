// The job's store as `commgrid launch --spares` uses it: served by node 0's launcher (so
// that losing any rank loses no store), read and written by every launcher. Every key
// launch touches is here: recovery's through the resilience layer's key functions, and
// launch's own (how the launchers of a multi-node job end together, docs/launching.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commgrid/resilience_keys.hpp"
#include "commgrid/store.hpp"
#include "launch/launch_settings.hpp"

namespace commgrid::cli {

class JobStore {
 public:
  /// Serves the tcp:// store at `uri` (node 0) or connects to it (the other nodes).
  /// Throws what open_store throws.
  JobStore(const std::string& uri, const LaunchSettings& settings);

  /// The URI the processes get (COMMGRID_STORE).
  [[nodiscard]] const std::string& uri() const noexcept { return uri_; }

  /// Whether the program said the job is finished (Recovery::mark_done). Throws
  /// commgrid::Error when the store fails.
  [[nodiscard]] bool done();
  /// Why the job cannot go on (Recovery::end_job), or nullopt (also when the store cannot
  /// be read).
  [[nodiscard]] std::optional<std::string> ended();

  /// The decisions that started the epochs after `epoch`, in order (empty while there is
  /// none). Throws commgrid::Error when the store fails or a decision is malformed.
  [[nodiscard]] std::vector<DecisionRecord> decisions_after(std::int64_t epoch);

  /// What posting a death did.
  struct Posted {
    bool first = false;      ///< true: posted now; false: a decision had declared it dead
    std::int64_t epoch = 0;  ///< the current epoch: the last one decided
  };
  /// Posts the death of `process` in its `incarnation` with `why`, and the current epoch's
  /// failure (so that the survivors need not wait out a timeout for it). Throws
  /// commgrid::Error when the store fails.
  Posted post_death(std::int64_t process, int incarnation, const std::string& why);

  // ---- launch's own keys: the end of a multi-node job ------------------------------
  // Each throws commgrid::Error when the store fails.

  /// Node `node`'s processes have all ended ("launch/node/<k>/idle").
  void post_idle(int node);
  [[nodiscard]] bool idle(int node);
  /// Node 0 says every node is idle or gone: the job is over ("launch/over").
  void post_over();
  [[nodiscard]] bool over();
  /// Node `node`'s launcher has seen the end and leaves ("launch/node/<k>/exit").
  void post_exit(int node);
  [[nodiscard]] bool exited(int node);
  /// Node `node`'s launcher is alive: its beat number `n` ("launch/node/<k>/beat/<n>").
  void post_beat(int node, std::int64_t n);
  /// The highest beat of `node` numbered after `from` with every beat before it present;
  /// `from` when there is none yet.
  [[nodiscard]] std::int64_t latest_beat(int node, std::int64_t from);

 private:
  void set_once(const std::string& key, const std::string& value);

  std::string uri_;
  std::string prefix_;  ///< the keys of recovery live under it
  std::shared_ptr<Store> store_;
  std::int64_t epoch_ = 0;
};

}  // namespace commgrid::cli
