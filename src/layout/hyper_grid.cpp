#include "commgrid/hyper_grid.hpp"

#include <algorithm>
#include <iterator>
#include <set>

#include "commgrid/config.hpp"
#include "commgrid/error.hpp"
#include "commgrid/mixed_radix.hpp"

namespace commgrid {
namespace {

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string list_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Checks a shape / dim-name pair; returns the product. `what` names the grid in messages.
std::int64_t check_shape(const std::vector<std::int64_t>& shape,
                         const std::vector<std::string>& names, const std::string& param,
                         const std::string& what) {
  if (shape.size() != names.size())
    throw InvalidValueError(param, what + ": shape " + list_text(shape) + " has " +
                                       std::to_string(shape.size()) + " dims but dim_names has " +
                                       std::to_string(names.size()) + " (" + join(names) + ")");
  if (shape.empty()) throw InvalidValueError(param, what + ": no dims given");
  if (shape.size() > static_cast<std::size_t>(detail::kMaxDims))
    throw InvalidValueError(param, what + ": shape " + list_text(shape) + " has " +
                                       std::to_string(shape.size()) + " dims, more than " +
                                       std::to_string(detail::kMaxDims));
  std::int64_t size = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1)
      throw InvalidValueError(param, what + ": dim \"" + names[i] + "\" has size " +
                                         std::to_string(shape[i]) + "; sizes must be >= 1");
    if (size > kMaxWorldSize / shape[i])
      throw OverflowError(param, what + ": shape " + list_text(shape) + " has more than " +
                                     std::to_string(kMaxWorldSize) + " ranks");
    size *= shape[i];
    if (names[i].empty()) throw InvalidValueError(param, what + ": an empty dim name");
    for (std::size_t j = 0; j < i; ++j)
      if (names[j] == names[i])
        throw InvalidValueError(param, what + ": dim \"" + names[i] + "\" appears twice");
  }
  return size;
}

}  // namespace

HyperGrid::HyperGrid(std::vector<std::int64_t> shape, std::vector<std::string> dim_names,
                     std::int64_t world_size, std::int64_t rank_offset)
    : shape_(std::move(shape)), names_(std::move(dim_names)), world_size_(world_size),
      rank_offset_(rank_offset) {
  size_ = check_shape(shape_, names_, "shape", "grid");
  if (rank_offset_ < 0)
    throw InvalidValueError("rank_offset",
                            "rank_offset must be >= 0, got " + std::to_string(rank_offset_));
  if (world_size_ < 1 || size_ > world_size_ - rank_offset_)
    throw IncompatibleError("shape", "grid shape " + list_text(shape_) + " (" +
                                         std::to_string(size_) + " ranks) at rank offset " +
                                         std::to_string(rank_offset_) +
                                         " does not fit world_size " + std::to_string(world_size_));
  views_[""] = View{shape_, names_, {}};
}

void HyperGrid::register_view(const std::string& name, std::vector<std::int64_t> shape,
                              std::vector<std::string> dim_names,
                              std::vector<std::string> shared_dims) {
  const std::string what = "view \"" + name + "\"";
  if (name.empty()) throw ConfigError("view", "view: the name must not be empty");
  if (views_.count(name)) throw ConfigError("view", what + " is already registered");
  const std::int64_t size = check_shape(shape, dim_names, "view", what);
  if (size != size_)
    throw ConfigError("view", what + ": shape " + list_text(shape) + " has " +
                                  std::to_string(size) + " ranks, but the grid has " +
                                  std::to_string(size_));
  View v{std::move(shape), std::move(dim_names), std::move(shared_dims)};
  const View& base = views_.at("");
  for (std::size_t i = 0; i < v.shared.size(); ++i) {
    const std::string& d = v.shared[i];
    for (std::size_t j = 0; j < i; ++j)
      if (v.shared[j] == d)
        throw ConfigError("view", what + ": shared dim \"" + d + "\" appears twice");
    if (std::find(base.names.begin(), base.names.end(), d) == base.names.end())
      throw ConfigError("view", what + ": shared dim \"" + d + "\" is not a dim of the grid (" +
                                    join(base.names) + ")");
    if (std::find(v.names.begin(), v.names.end(), d) == v.names.end())
      throw ConfigError("view", what + ": shared dim \"" + d + "\" is not a dim of the view (" +
                                    join(v.names) + ")");
    if (!(enumerate(base, {d}) == enumerate(v, {d})))
      throw ConfigError("view", what + ": shared dim \"" + d +
                                    "\" gives different groups in the grid and the view");
  }
  if (v.shared.size() > 1 && !(enumerate(base, v.shared) == enumerate(v, v.shared)))
    throw ConfigError("view", what + ": shared dims " + join(v.shared, "-") +
                                  " give different groups in the grid and the view");
  views_[name] = std::move(v);
}

std::vector<std::string> HyperGrid::views() const {
  std::vector<std::string> out;
  for (const auto& [n, v] : views_)
    if (!n.empty()) out.push_back(n);
  return out;
}

const HyperGrid::View& HyperGrid::view_of(std::string_view name) const {
  const auto it = views_.find(name);
  if (it == views_.end())
    throw ConfigError("view", "view \"" + std::string(name) +
                                  "\" is not registered (registered: " + join(views()) + ")");
  return it->second;
}

detail::DimMask HyperGrid::mask(const View& v, const std::vector<std::string>& dims) const {
  std::set<std::string> seen;
  for (const std::string& d : dims) {
    if (std::find(v.names.begin(), v.names.end(), d) == v.names.end())
      throw ConfigError("dims", "dims: \"" + d + "\" is not a dim (" + join(v.names) + ")");
    if (!seen.insert(d).second) throw ConfigError("dims", "dims: \"" + d + "\" is listed twice");
  }
  if (dims.empty()) throw ConfigError("dims", "dims: no dims given");
  detail::DimMask m = 0;
  for (std::size_t i = 0; i < v.names.size(); ++i)
    if (seen.count(v.names[i])) m |= detail::DimMask{1} << i;
  return m;
}

GroupList HyperGrid::enumerate(const View& v, const std::vector<std::string>& dims) const {
  const detail::DimMask m = mask(v, dims);
  const detail::MixedRadix grid(v.shape, rank_offset_);
  const std::int64_t g = grid.group_size(m);
  GroupList out;
  grid.fill(
      m, 0,
      out.assign_uniform(static_cast<std::size_t>(grid.count() / g), static_cast<std::size_t>(g)));
  return out;
}

GroupList HyperGrid::groups(const std::vector<std::string>& dims, std::string_view view) const {
  return enumerate(view_of(view), dims);
}

std::optional<std::vector<Rank>> HyperGrid::group_of(const std::vector<std::string>& dims, Rank r,
                                                     std::string_view view) const {
  const View& v = view_of(view);
  const detail::DimMask m = mask(v, dims);  // checks the dims first
  if (!contains(r)) return std::nullopt;
  return detail::MixedRadix(v.shape, rank_offset_).group_of(m, r);
}

std::string HyperGrid::key(const std::vector<std::string>& dims, std::string_view view) const {
  const View& v = view_of(view);
  (void)enumerate(v, dims);  // checks the dims
  bool shared_only = !view.empty();
  for (const std::string& d : dims)
    shared_only = shared_only && std::find(v.shared.begin(), v.shared.end(), d) != v.shared.end();
  const View& k = view.empty() || shared_only ? views_.at("") : v;
  // Outermost first, as HEAD orders the dims of a key.
  std::vector<std::string> ordered;
  std::copy_if(k.names.rbegin(), k.names.rend(), std::back_inserter(ordered),
               [&](const std::string& name) {
                 return std::find(dims.begin(), dims.end(), name) != dims.end();
               });
  const std::string joined = join(ordered, "-");
  return view.empty() || shared_only ? joined : std::string(view) + ":" + joined;
}

}  // namespace commgrid
