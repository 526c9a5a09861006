// HyperGrid: Megatron-core HEAD's HyperCommGrid. An N-dimensional grid of named dims over
// a span of ranks [rank_offset, rank_offset + size), groups over any set of dims, and
// registered views (other factorizations of the same ranks).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/mixed_radix.hpp"

namespace commgrid {

/// The pure layout of a HyperCommGrid. Dims are innermost first (dim_names[0] has stride
/// 1), like the order of initialize_model_parallel; a group over a set of dims enumerates
/// exactly as Megatron-core's RankGenerator does for the same shape and order.
class HyperGrid {
 public:
  /// Throws InvalidValueError ("shape", "dim_names", "rank_offset") for mismatched lengths,
  /// sizes < 1, repeated or empty names, a negative offset, and IncompatibleError
  /// ("shape") when the grid does not fit [rank_offset, world_size); at most 16 dims.
  HyperGrid(std::vector<std::int64_t> shape, std::vector<std::string> dim_names,
            std::int64_t world_size, std::int64_t rank_offset = 0);

  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  [[nodiscard]] std::int64_t rank_offset() const noexcept { return rank_offset_; }
  [[nodiscard]] std::int64_t world_size() const noexcept { return world_size_; }
  [[nodiscard]] const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  [[nodiscard]] const std::vector<std::string>& dim_names() const noexcept { return names_; }
  /// Whether rank r lies in [rank_offset, rank_offset + size).
  [[nodiscard]] bool contains(Rank r) const noexcept {
    return r >= rank_offset_ && r < rank_offset_ + size_;
  }

  /// Registers another factorization of the same ranks. Every shared dim must be in both
  /// and give the same groups in both (each alone and all together). Throws ConfigError
  /// ("view") naming the problem.
  void register_view(const std::string& name, std::vector<std::int64_t> shape,
                     std::vector<std::string> dim_names, std::vector<std::string> shared_dims = {});
  /// Registered view names (the base view "" excluded).
  [[nodiscard]] std::vector<std::string> views() const;

  /// Every group over `dims` (in any order; a set) of the view ("" = the base grid).
  /// Throws ConfigError ("dims") for an unknown or repeated dim, ("view") an unknown view.
  [[nodiscard]] GroupList groups(const std::vector<std::string>& dims,
                                 std::string_view view = "") const;
  /// r's group over dims, or nullopt when r is outside the grid. O(group size).
  [[nodiscard]] std::optional<std::vector<Rank>> group_of(const std::vector<std::string>& dims,
                                                          Rank r, std::string_view view = "") const;
  /// The key a group set is stored under: dims joined by '-' outermost first, as HEAD
  /// (a view's groups over shared dims only are the base grid's, under the base key).
  [[nodiscard]] std::string key(const std::vector<std::string>& dims,
                                std::string_view view = "") const;

 private:
  struct View {
    std::vector<std::int64_t> shape;
    std::vector<std::string> names;
    std::vector<std::string> shared;
  };
  [[nodiscard]] const View& view_of(std::string_view name) const;
  /// Checks dims (known, not repeated, not empty) and returns them as a mask of v's dims.
  [[nodiscard]] detail::DimMask mask(const View& v, const std::vector<std::string>& dims) const;
  [[nodiscard]] GroupList enumerate(const View& v, const std::vector<std::string>& dims) const;

  std::vector<std::int64_t> shape_;
  std::vector<std::string> names_;
  std::int64_t world_size_ = 1, rank_offset_ = 0, size_ = 1;
  std::map<std::string, View, std::less<>> views_;  ///< "" is the base grid
};

}  // namespace commgrid
