#include "data.hpp"

#include "tensor.hpp"

namespace train_gpt {

std::vector<int> sample_tokens(const ModelConfig& config, std::int64_t index) {
  const auto u = [&](std::uint64_t k) {
    return (hash_uniform(config.seed, "data", static_cast<std::uint64_t>(index) * 2 + k) + 1.0) /
           2.0;
  };
  const int start = static_cast<int>(u(0) * config.vocab) % config.vocab;
  const int stride = 1 + static_cast<int>(u(1) * 3) % 3;
  std::vector<int> t(static_cast<std::size_t>(config.seq + 1));
  for (int i = 0; i <= config.seq; ++i)
    t[static_cast<std::size_t>(i)] = (start + i * stride) % config.vocab;
  return t;
}

DataLoader::DataLoader(const ModelConfig& config, int global_batch, int micro_batches, int dp_rank,
                       int dp_size, std::vector<int> positions)
    : config_(config), global_batch_(global_batch), b_(global_batch / (dp_size * micro_batches)),
      dp_rank_(dp_rank), dp_size_(dp_size), positions_(std::move(positions)) {}

MicroBatch DataLoader::get(int step, int m) const {
  MicroBatch mb;
  mb.rows.samples = b_;
  mb.rows.positions = positions_;
  const int n = mb.rows.rows();
  mb.tokens.resize(static_cast<std::size_t>(n));
  mb.labels.resize(static_cast<std::size_t>(n));
  const std::int64_t first = static_cast<std::int64_t>(step) * global_batch_ +
                             static_cast<std::int64_t>(dp_rank_) * (global_batch_ / dp_size_) +
                             static_cast<std::int64_t>(m) * b_;
  for (int i = 0; i < b_; ++i) {
    const std::vector<int> t = sample_tokens(config_, first + i);
    for (std::size_t j = 0; j < positions_.size(); ++j) {
      const auto r = j * static_cast<std::size_t>(b_) + static_cast<std::size_t>(i);
      mb.tokens[r] = t[static_cast<std::size_t>(positions_[j])];
      mb.labels[r] = t[static_cast<std::size_t>(positions_[j]) + 1];
    }
  }
  return mb;
}

}  // namespace train_gpt
