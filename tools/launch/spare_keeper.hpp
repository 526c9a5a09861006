// launch --spares's part in recovery: a process that dies does not stop the job; its death
// is posted to the job's store (the survivors need not wait out a timeout for it), and it
// is restarted as a spare while the --max-restarts budget lasts. docs/resilience.md.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "launch/job_store.hpp"
#include "launch/launch_settings.hpp"

namespace commgrid::cli {

class SpareKeeper {
 public:
  SpareKeeper(const LaunchSettings& settings, std::unique_ptr<JobStore> store);

  [[nodiscard]] JobStore& store() noexcept { return *store_; }
  /// Whether the program said the job is finished.
  [[nodiscard]] bool done() { return store_->done(); }
  /// Why the job cannot go on, once a process said so (Recovery::end_job).
  [[nodiscard]] std::optional<std::string> ended() { return store_->ended(); }

  /// What to do after a death.
  struct Verdict {
    std::string note;      ///< launch's line about it ("launch: note: ..."), no newline;
                           ///< empty once the job ended (its reason is said once, at the end)
    bool restart = false;  ///< start the process again, as a spare (its incarnation + 1)
  };
  /// `process` (in `incarnation`), described as `who`, ended with wait status `status`;
  /// `stopping`: launch is stopping the job (no restart).
  [[nodiscard]] Verdict on_death(std::int64_t process, int incarnation, const std::string& who,
                                 int status, bool stopping);

 private:
  const LaunchSettings& settings_;
  std::unique_ptr<JobStore> store_;
  int restarts_ = 0;
};

}  // namespace commgrid::cli
