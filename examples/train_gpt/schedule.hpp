// Pipeline schedules: the order of forward and backward passes on one stage, and the
// executor that runs them, moving activations and their gradients over pp by batched
// point-to-point.
#pragma once

#include <vector>

#include "data.hpp"
#include "model.hpp"
#include "parallel.hpp"

namespace train_gpt {

/// One step of a stage's schedule: forward or backward of micro-batch `micro_batch` on
/// virtual stage (model chunk) `vstage`.
struct ScheduleOp {
  bool forward = true;
  int vstage = 0;
  int micro_batch = 0;
  bool operator==(const ScheduleOp&) const = default;
};

/// The 1F1B schedule of stage `stage` of `pp` (vpp = 1): pp - stage - 1 warm-up forwards,
/// then one forward and one backward alternately, then the remaining backwards. With
/// vpp > 1, Megatron's interleaved 1F1B over pp * vpp model chunks, micro-batches taken in
/// groups of pp per chunk (micro_batches must be a multiple of pp).
std::vector<ScheduleOp> pipeline_schedule(int pp, int stage, int vpp, int micro_batches);

/// Runs one training step's forward and backward passes of every micro-batch through
/// this rank's chunks in the order of pipeline_schedule, receiving each chunk's input
/// from the previous stage and sending its output to the next (and gradients the other
/// way) with batch_isend_irecv over pp. Returns the sum of the cross-entropy over this
/// rank's tokens (last stage; 0 elsewhere). Gradients accumulate in the parameters,
/// scaled by loss_scale per token.
double run_pipeline(GptModel& model, const ModelParallel& mp, const DataLoader& data, int step,
                    int micro_batches, int vpp, double loss_scale);

}  // namespace train_gpt
