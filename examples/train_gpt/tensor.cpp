#include "tensor.hpp"

#include <cmath>

namespace train_gpt {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

double hash_uniform(std::uint64_t seed, std::string_view name, std::uint64_t index) {
  const std::uint64_t h = splitmix64(splitmix64(seed ^ fnv1a(name)) ^ splitmix64(index));
  // 53 random bits -> [0, 1) -> [-1, 1).
  return static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0;
}

Param make_param(std::string name, std::int64_t global_rows, std::int64_t global_cols,
                 std::int64_t row_offset, std::int64_t col_offset, std::int64_t rows,
                 std::int64_t cols, Init init, std::uint64_t seed) {
  Param p;
  p.name = std::move(name);
  p.global_rows = global_rows;
  p.global_cols = global_cols;
  p.row_offset = row_offset;
  p.col_offset = col_offset;
  p.value.resize(rows, cols);
  // Uniform on [-a, a] has standard deviation a / sqrt(3).
  const double a = init.std * std::sqrt(3.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const auto global =
          static_cast<std::uint64_t>((row_offset + i) * global_cols + col_offset + j);
      p.value(i, j) = init.std > 0 ? a * hash_uniform(seed, p.name, global) : init.constant;
    }
  p.grad = Mat::Zero(rows, cols);
  return p;
}

}  // namespace train_gpt
