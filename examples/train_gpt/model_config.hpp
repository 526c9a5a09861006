// The sizes of the GPT, shared by the model, the data and the command line.
#pragma once

#include <cstdint>

namespace train_gpt {

/// Model sizes (the command line's defaults) and the seed every parameter and sample
/// derives from.
struct ModelConfig {
  int vocab = 64;
  int hidden = 32;
  int heads = 4;
  int seq = 32;
  int layers = 4;
  /// MLP width as a multiple of hidden (4, as GPT).
  int ffn_multiple = 4;
  std::uint64_t seed = 1234;
  /// Standard deviation of the weights at initialization.
  double init_std = 0.02;

  int ffn() const { return hidden * ffn_multiple; }
  int head_dim() const { return hidden / heads; }
};

}  // namespace train_gpt
