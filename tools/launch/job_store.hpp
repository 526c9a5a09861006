// The job's store as `commgrid launch --spares` uses it: served by node 0's launcher (so
// that losing any rank loses no store), read and written by every launcher. Every key
// launch touches is written here, through the resilience layer's key functions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

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

  /// Whether the program said the job is finished (Recovery::mark_done); false when the
  /// store cannot be read.
  [[nodiscard]] bool done();
  /// Why the job cannot go on (Recovery::end_job), or nullopt (also when the store cannot
  /// be read).
  [[nodiscard]] std::optional<std::string> ended();

  /// What posting a death did.
  struct Posted {
    bool first = false;      ///< true: posted now; false: a decision had declared it dead
    std::int64_t epoch = 0;  ///< the current epoch: the last one decided
  };
  /// Posts the death of `process` in its `incarnation` with `why`, and the current epoch's
  /// failure (so that the survivors need not wait out a timeout for it). Throws
  /// commgrid::Error when the store fails.
  Posted post_death(std::int64_t process, int incarnation, const std::string& why);

 private:
  std::string uri_;
  std::string prefix_;  ///< the keys of recovery live under it
  std::shared_ptr<Store> store_;
  std::int64_t epoch_ = 0;
};

}  // namespace commgrid::cli
