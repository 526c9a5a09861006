// Matrices and parameters of train_gpt: float64 Eigen matrices, and parameters that know
// where their shard sits in the full tensor so that every sharding starts from one model.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace train_gpt {

/// Activations and weights: float64, row-major so that a block of rows is contiguous (the
/// unit that sequence and context parallelism split and gather).
using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The elements of a matrix as a span, for communication.
inline std::span<double> elements(Mat& m) { return {m.data(), static_cast<std::size_t>(m.size())}; }
inline std::span<const double> elements(const Mat& m) {
  return {m.data(), static_cast<std::size_t>(m.size())};
}

/// A number in [-1, 1) that depends only on (seed, name, index): the same on every rank
/// and for every sharding.
double hash_uniform(std::uint64_t seed, std::string_view name, std::uint64_t index);

/// Which gradient-reduction path a parameter takes. Dense parameters are reduced over the
/// dense data-parallel groups; expert parameters (issue 11's MoE) over the expert ones.
enum class ParamDomain : std::uint8_t { dense, expert };

/// One parameter shard: a [rows x cols] block at (row_offset, col_offset) of a full
/// [global_rows x global_cols] tensor named `name`.
struct Param {
  std::string name;
  std::int64_t global_rows = 0, global_cols = 0;
  std::int64_t row_offset = 0, col_offset = 0;
  Mat value, grad;
  ParamDomain domain = ParamDomain::dense;
  /// Replicated on every tp rank (layer norms, row-parallel biases, the position
  /// embedding): counted in the gradient norm on tp rank 0 only, as Megatron's
  /// param_is_not_tensor_parallel_duplicate.
  bool tp_duplicate = false;
  /// With sequence parallelism each tp rank sees only part of the sequence, so the
  /// gradient of a replicated parameter is partial and must be summed over tp.
  bool sequence_parallel = false;
  /// The tied word embedding's copy on the last pipeline stage: kept equal to the first
  /// stage's copy by the embd gradient sum, and not counted twice in the gradient norm.
  bool shared_embedding_copy = false;
  /// The word embedding (either copy), whose gradient is summed over embd.
  bool word_embedding = false;
  /// The position embedding, whose gradient is summed over pos_embd.
  bool position_embedding = false;
};

/// How a parameter starts: uniform with a standard deviation, or a constant.
struct Init {
  double std = 0.0;
  double constant = 0.0;
  static Init normal(double std) { return {std, 0.0}; }
  static Init fill(double c) { return {0.0, c}; }
};

/// A shard of `rows x cols` at (row_offset, col_offset) of the full tensor, initialized
/// from (seed, name, global element index), with a zero gradient.
Param make_param(std::string name, std::int64_t global_rows, std::int64_t global_cols,
                 std::int64_t row_offset, std::int64_t col_offset, std::int64_t rows,
                 std::int64_t cols, Init init, std::uint64_t seed);

}  // namespace train_gpt
