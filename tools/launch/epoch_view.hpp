// What launch --spares knows of the job's epochs: which process holds which logical rank
// now, as each epoch's decision in the store says (launch reads them, it takes part in no
// agreement), and from it the label of a process's lines: "rank 3" in epoch 0, "rank 3,
// epoch 2" after a regroup, "spare 1" for the second spare before it takes a rank, "process
// 2, spare" for a restarted process (or one a shrink left without a rank), "process 2,
// dead" for one declared dead that still writes. docs/launching.md, "Output".
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace commgrid::cli {

class EpochView {
 public:
  /// Epoch 0: logical rank r on process r < world_size, the spares after them.
  EpochView(std::int64_t world_size, std::int64_t num_processes);

  /// Adopts the decision that starts epoch `epoch` (the current one + 1): the processes it
  /// declares dead, those it takes back as spares (process, incarnation), and the process of
  /// each logical rank of the new epoch (empty: the decision ends the job, no rank moves).
  /// Throws commgrid::Error for an epoch out of turn or a process outside the job.
  void adopt(std::int64_t epoch, std::span<const std::int64_t> dead,
             std::span<const std::pair<std::int64_t, int>> revived,
             std::span<const std::int64_t> process_of);

  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  /// The logical rank `process` holds now, nullopt for a spare or a dead process.
  [[nodiscard]] std::optional<std::int64_t> logical_rank(std::int64_t process) const;
  /// The label of incarnation `incarnation` of `process` (see above), without brackets.
  [[nodiscard]] std::string label(std::int64_t process, int incarnation) const;

 private:
  std::int64_t world0_;  ///< epoch 0's world: spare k is process world0_ + k
  std::int64_t epoch_ = 0;
  std::vector<std::int64_t> rank_of_;   ///< per process: its logical rank, or -1
  std::vector<int> known_incarnation_;  ///< per process: as the decisions know it
  std::vector<int> dead_incarnation_;   ///< per process: the incarnation declared dead, or -1
};

}  // namespace commgrid::cli
