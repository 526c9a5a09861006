// launch --spares's part in recovery: a process that dies does not stop the job; its death
// is posted to the job's store (the survivors need not wait out a timeout for it), and it
// is restarted as a spare while the --max-restarts budget lasts; and launch follows the
// epochs the processes agree on, to label their lines. docs/resilience.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "launch/epoch_view.hpp"
#include "launch/job_store.hpp"
#include "launch/launch_settings.hpp"

namespace commgrid::cli {

class SpareKeeper {
 public:
  SpareKeeper(const LaunchSettings& settings, std::unique_ptr<JobStore> store);

  [[nodiscard]] JobStore& store() noexcept { return *store_; }
  /// The epochs as launch last read them.
  [[nodiscard]] const EpochView& view() const noexcept { return view_; }
  /// Reads the decisions made since, so that view() is the job's current epoch (a process
  /// prints as the rank it holds only after the decision that gave it that rank was
  /// written). A store that cannot be read leaves the view as it was.
  void follow();
  /// Whether the program said the job is finished; false when the store cannot be read
  /// (and true from then on once it was seen).
  [[nodiscard]] bool done();
  /// Whether a process of this launch failed once the job was done (not a process a
  /// decision had declared dead already): the job's end did not go well here.
  [[nodiscard]] bool failed_after_done() const noexcept { return failed_after_done_; }
  /// Why the job cannot go on, once a process said so (Recovery::end_job).
  [[nodiscard]] std::optional<std::string> ended() { return store_->ended(); }

  /// What to do after a death.
  struct Verdict {
    std::string note;      ///< launch's line about it ("launch: note: ..."), no newline;
                           ///< empty once the job ended (its reason is said once, at the end)
    bool restart = false;  ///< start the process again, as a spare (its incarnation + 1)
    /// The epoch this death failed, when this call posted the failure (not when a decision
    /// had declared the process dead already, nor when the store could not be written).
    std::optional<std::int64_t> failed_epoch;
  };
  /// `process` (in `incarnation`), described as `who`, ended with wait status `status`;
  /// `stopping`: launch is stopping the job (no restart).
  [[nodiscard]] Verdict on_death(std::int64_t process, int incarnation, const std::string& who,
                                 int status, bool stopping);

 private:
  const LaunchSettings& settings_;
  std::unique_ptr<JobStore> store_;
  EpochView view_;
  int restarts_ = 0;
  bool done_seen_ = false;
  bool failed_after_done_ = false;
};

}  // namespace commgrid::cli
