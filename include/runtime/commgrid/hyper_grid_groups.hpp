// HyperGridGroups: a HyperGrid's groups created on a backend (Megatron-core HEAD's
// HyperCommGrid.create_pg / get_pg). The pure grid is commgrid/hyper_grid.hpp.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/hyper_grid.hpp"

namespace commgrid {

/// A HyperGrid's groups on a backend: each set of dims created once, collectively (every
/// rank of the world calls create_group with the same dims in the same order).
class HyperGridGroups {
 public:
  explicit HyperGridGroups(HyperGrid grid) : grid_(std::move(grid)) {}
  [[nodiscard]] const HyperGrid& grid() const noexcept { return grid_; }
  /// Creates the groups over dims (of a view) on `world`, whose size must be the grid's
  /// world size; returns this rank's group, or nullptr when the rank is outside the grid.
  /// Throws ConfigError ("dims") when these groups were already created (HEAD: KeyError).
  Communicator* create_group(Communicator& world, const std::vector<std::string>& dims,
                             std::string_view view = "");
  /// This rank's group over dims, or nullptr when outside the grid. Throws ConfigError
  /// ("dims") when the groups were never created.
  [[nodiscard]] Communicator* group(const std::vector<std::string>& dims,
                                    std::string_view view = "") const;

 private:
  HyperGrid grid_;
  std::map<std::string, std::shared_ptr<Communicator>, std::less<>> groups_;
};

}  // namespace commgrid
