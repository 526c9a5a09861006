// Deterministic synthetic data: every sample is a function of (seed, sample index), and
// the global batch of a step is sharded by data-parallel rank.
#pragma once

#include <cstdint>
#include <vector>

#include "layers.hpp"
#include "model_config.hpp"

namespace train_gpt {

/// The seq+1 tokens of sample `index`: an arithmetic progression modulo the vocabulary
/// with a start and a stride (1, 2 or 3) drawn from (seed, index), so that there is
/// something to learn: the next token is the last one plus the stride.
std::vector<int> sample_tokens(const ModelConfig& config, std::int64_t index);

/// One micro-batch on one rank: this rank's positions of b samples, in sequence-major rows.
struct MicroBatch {
  TokenRows rows;
  std::vector<int> tokens;  ///< input token of each row
  std::vector<int> labels;  ///< the next token of each row
};

/// The samples of data-parallel rank `dp_rank`: of each step's global batch of B samples,
/// rank r takes [r B/dp, (r+1) B/dp), cut into micro-batches of B/(dp M). The cp ranks of
/// one dp rank share the samples and differ in `positions`.
class DataLoader {
 public:
  DataLoader(const ModelConfig& config, int global_batch, int micro_batches, int dp_rank,
             int dp_size, std::vector<int> positions);
  /// Micro-batch m of step `step` (0-based).
  MicroBatch get(int step, int m) const;
  int samples_per_micro_batch() const { return b_; }
  int hidden() const { return config_.hidden; }

 private:
  ModelConfig config_;
  int global_batch_, b_, dp_rank_, dp_size_;
  std::vector<int> positions_;
};

}  // namespace train_gpt
