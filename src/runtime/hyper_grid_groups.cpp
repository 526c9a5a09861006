#include "commgrid/hyper_grid_groups.hpp"

#include <algorithm>
#include <optional>

#include "commgrid/error.hpp"

namespace commgrid {

Communicator* HyperGridGroups::create_group(Communicator& world,
                                            const std::vector<std::string>& dims,
                                            std::string_view view) {
  const std::string k = grid_.key(dims, view);
  if (groups_.count(k))
    throw ConfigError("dims", "dims: the groups over " + k + " were already created");
  if (world.size() != grid_.world_size())
    throw InvalidValueError("world_size",
                            "world_size: the grid is over " + std::to_string(grid_.world_size()) +
                                " ranks but the communicator has " + std::to_string(world.size()));
  const GroupList all = grid_.groups(dims, view);
  std::optional<std::int64_t> color;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (std::find(all[i].begin(), all[i].end(), world.rank()) != all[i].end())
      color = static_cast<std::int64_t>(i);
  std::unique_ptr<Communicator> c = world.split(
      color, world.rank(), "hyper:" + k + (color ? "#" + std::to_string(*color) : "#none"));
  auto& slot = groups_[k];
  slot = std::shared_ptr<Communicator>(std::move(c));
  return slot.get();
}

Communicator* HyperGridGroups::group(const std::vector<std::string>& dims,
                                     std::string_view view) const {
  const std::string k = grid_.key(dims, view);
  const auto it = groups_.find(k);
  if (it == groups_.end())
    throw ConfigError(
        "dims", "dims: the groups over " + k + " were never created; call create_group first");
  return it->second.get();
}

}  // namespace commgrid
