// _commgrid: the binding-only module behind the `commgrid` Python package. It converts
// arguments and results and maps errors; every group comes from the C++ layout core.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commgrid/config.hpp"
#include "commgrid/error.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/layout.hpp"
#include "commgrid/rank_grid.hpp"

namespace py = pybind11;

namespace commgrid::python {
namespace {

// The Python exception classes live in commgrid/errors.py (so that ConfigError can be a
// ValueError and carry `parameter`); the translator raises the most specific one.
py::object error_class(const char* name) {
  return py::module_::import("commgrid.errors").attr(name);
}

void raise_config_error(const char* cls, const ConfigError& e) {
  py::object type = error_class(cls);
  py::object value = type(e.what());
  value.attr("parameter") = e.parameter();
  PyErr_SetObject(type.ptr(), value.ptr());
}

void translate_errors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const InvalidValueError& e) {
    raise_config_error("InvalidValueError", e);
  } catch (const OrderError& e) {
    raise_config_error("OrderError", e);
  } catch (const DivisibilityError& e) {
    raise_config_error("DivisibilityError", e);
  } catch (const IncompatibleError& e) {
    raise_config_error("IncompatibleError", e);
  } catch (const OverflowError& e) {
    raise_config_error("OverflowError", e);
  } catch (const PolicyError& e) {
    raise_config_error("PolicyError", e);
  } catch (const RankOutOfRangeError& e) {
    raise_config_error("RankOutOfRangeError", e);
  } catch (const UnknownKindError& e) {
    raise_config_error("UnknownKindError", e);
  } catch (const ConfigError& e) {
    raise_config_error("ConfigError", e);
  } catch (const Error& e) {
    PyErr_SetString(error_class("Error").ptr(), e.what());
  }
}

Axis parse_axis(const std::string& name) {
  for (Axis a : kAllAxes)
    if (axis_name(a) == name) return a;
  throw OrderError("axis", "unknown axis \"" + name + "\" (valid: tp, cp, ep, dp, pp)");
}

py::list members_list(std::span<const Rank> members) {
  py::list out(members.size());
  for (std::size_t i = 0; i < members.size(); ++i)
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(members[i]));
  return out;
}

py::list groups_list(const GroupList& groups) {
  py::list out(groups.size());
  for (std::size_t i = 0; i < groups.size(); ++i)
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), members_list(groups[i]).release().ptr());
  return out;
}

// A 2-D int64 array over the list's own buffer: the list moves into a capsule that the
// array keeps alive, so nothing is copied.
py::array_t<std::int64_t> groups_array(GroupList&& groups, const std::string& what) {
  const std::size_t n = groups.size();
  const std::size_t g = n == 0 ? 0 : groups[0].size();
  for (std::size_t i = 1; i < n; ++i)
    if (groups[i].size() != g)
      throw InvalidValueError("kind", "the groups of " + what +
                                          " have different sizes; use groups() for lists");
  auto* owned = new GroupList(std::move(groups));
  py::capsule base(owned, [](void* p) { delete static_cast<GroupList*>(p); });
  const auto stride = static_cast<py::ssize_t>(sizeof(std::int64_t));
  return py::array_t<std::int64_t>({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(g)},
                                   {static_cast<py::ssize_t>(g) * stride, stride},
                                   owned->members().data(), base);
}

EmbeddingPolicy wrap_policy(const py::object& fn) {
  if (fn.is_none()) return {};
  return [fn](std::span<const Rank> pp_group) {
    py::object result = fn(members_list(pp_group));
    return result.cast<std::vector<Rank>>();
  };
}

py::dict config_dict(const Layout& layout) {
  const ParallelConfig& c = layout.config();
  py::dict d;
  d["world_size"] = c.world_size;
  d["tp"] = c.tp;
  d["pp"] = c.pp;
  d["cp"] = c.cp;
  d["ep"] = c.ep;
  d["etp"] = c.expert_tp();
  d["dp"] = layout.dp();
  d["expert_dp"] = layout.expert_dp();
  d["dist_opt_instances"] = c.dist_opt_instances;
  d["hcp"] = c.hcp;
  d["vpp"] = c.vpp ? py::object(py::int_(*c.vpp)) : py::object(py::none());
  d["order"] = c.order;
  return d;
}

py::object rank_group(const Layout& layout, GroupKind k, Rank r, int level) {
  auto g = layout.group_of(k, r, level);
  return g ? py::object(members_list(g->members)) : py::object(py::none());
}

}  // namespace
}  // namespace commgrid::python

PYBIND11_MODULE(_commgrid, m) {
  using namespace commgrid;
  using namespace commgrid::python;
  m.doc() = "commgrid's C++ layout core (binding only; use the commgrid package)";
  py::register_exception_translator(&translate_errors);

  m.def("kind_names", [] {
    std::vector<std::string> names;
    for (GroupKind k : all_kinds()) names.emplace_back(kind_name(k));
    return names;
  }, "Every group kind name, in reference order.");
  m.attr("DEFAULT_ORDER") = kDefaultOrder;
  m.attr("MAX_WORLD_SIZE") = kMaxWorldSize;

  m.def("resolve_order", [](const std::string& order) {
    ParallelConfig c;
    c.order = order;
    std::vector<std::string> out;
    for (Axis a : c.resolved_order()) out.emplace_back(axis_name(a));
    return out;
  }, py::arg("order"),
        "The order's tokens (validated), then the omitted axes in Megatron's sequence.");

  m.def("grid_groups", [](const std::map<std::string, std::int64_t>& sizes,
                          const std::vector<std::string>& order,
                          const std::vector<std::string>& masked) {
    std::array<std::int64_t, kNumAxes> s{};
    std::array<Axis, kNumAxes> o{};
    if (sizes.size() != kNumAxes || order.size() != kNumAxes)
      throw InvalidValueError("order", "grid_groups needs all five axes in sizes and order");
    for (const auto& [name, size] : sizes) s[static_cast<int>(parse_axis(name))] = size;
    bool seen[kNumAxes] = {};
    for (std::size_t i = 0; i < order.size(); ++i) {
      o[i] = parse_axis(order[i]);
      if (seen[static_cast<int>(o[i])])
        throw OrderError("order", "axis \"" + order[i] + "\" appears twice in the grid order");
      seen[static_cast<int>(o[i])] = true;
    }
    // AxisSet is built from an initializer list: collect the distinct masked axes first.
    bool has[kNumAxes] = {};
    for (const auto& name : masked) has[static_cast<int>(parse_axis(name))] = true;
    std::vector<Axis> axes;
    for (Axis a : kAllAxes)
      if (has[static_cast<int>(a)]) axes.push_back(a);
    AxisSet set;
    switch (axes.size()) {
      case 0: break;
      case 1: set = {axes[0]}; break;
      case 2: set = {axes[0], axes[1]}; break;
      case 3: set = {axes[0], axes[1], axes[2]}; break;
      case 4: set = {axes[0], axes[1], axes[2], axes[3]}; break;
      default: set = {axes[0], axes[1], axes[2], axes[3], axes[4]}; break;
    }
    std::int64_t world = 1;
    for (std::int64_t v : s) {
      if (v < 1) throw InvalidValueError("size", "grid sizes must be >= 1, got " + std::to_string(v));
      if (world > kMaxWorldSize / v)
        throw OverflowError("world_size", "the product of the grid sizes exceeds " +
                                              std::to_string(kMaxWorldSize));
      world *= v;
    }
    const RankGrid grid(s, o);
    return groups_array(grid.groups(set), "the grid");
  }, py::arg("sizes"), py::arg("order"), py::arg("masked"),
        "Every group of the masked axes of a grid (Megatron's generate_masked_orthogonal_rank_groups).");

  py::class_<GroupRef>(m, "GroupRef", "One rank's group of one kind.")
      .def_readonly("index", &GroupRef::index, "index of the group in the kind's order")
      .def_readonly("position", &GroupRef::position, "index of the rank in members")
      .def_readonly("comm_rank", &GroupRef::comm_rank,
                    "the rank's rank in a communicator of the group (sorted position)")
      .def_property_readonly("members", [](const GroupRef& g) { return members_list(g.members); })
      .def("__repr__", [](const GroupRef& g) {
        return "GroupRef(index=" + std::to_string(g.index) + ", position=" +
               std::to_string(g.position) + ", comm_rank=" + std::to_string(g.comm_rank) +
               ", members=" + py::repr(members_list(g.members)).cast<std::string>() + ")";
      });

  py::class_<Layout>(m, "Layout", "Every group of a validated configuration (C++ core).")
      .def(py::init([](std::int64_t world_size, std::int64_t tp, std::int64_t pp, std::int64_t cp,
                       std::int64_t ep, std::optional<std::int64_t> etp,
                       std::optional<std::vector<std::int64_t>> hcp,
                       std::int64_t dist_opt_instances, std::optional<std::int64_t> vpp,
                       std::string order, py::object embedding_ranks,
                       py::object position_embedding_ranks) {
             ParallelConfig c;
             c.world_size = world_size;
             c.tp = tp;
             c.pp = pp;
             c.cp = cp;
             c.ep = ep;
             c.etp = etp;
             c.hcp = hcp.value_or(std::vector<std::int64_t>{});
             c.dist_opt_instances = dist_opt_instances;
             c.vpp = vpp;
             c.order = std::move(order);
             EmbeddingPolicies policies{wrap_policy(embedding_ranks),
                                        wrap_policy(position_embedding_ranks)};
             return std::make_unique<Layout>(std::move(c), std::move(policies));
           }),
           py::arg("world_size"), py::arg("tp") = 1, py::arg("pp") = 1, py::arg("cp") = 1,
           py::arg("ep") = 1, py::arg("etp") = py::none(), py::arg("hcp") = py::none(),
           py::arg("dist_opt_instances") = 1, py::arg("vpp") = py::none(),
           py::arg("order") = std::string(kDefaultOrder), py::arg("embedding_ranks") = py::none(),
           py::arg("position_embedding_ranks") = py::none())
      .def_property_readonly("world_size", &Layout::world_size)
      .def_property_readonly("dp", &Layout::dp)
      .def_property_readonly("expert_dp", &Layout::expert_dp)
      .def_property_readonly("config", &config_dict, "the configuration, as plan's JSON has it")
      .def("kinds", [](const Layout& l) {
        std::vector<std::string> names;
        for (GroupKind k : l.kinds()) names.emplace_back(kind_name(k));
        return names;
      }, "The kinds this layout has, in reference order.")
      .def("has_kind", [](const Layout& l, const std::string& k) { return l.has_kind(parse_kind(k)); },
           py::arg("kind"))
      .def("levels", [](const Layout& l, const std::string& k) { return l.levels(parse_kind(k)); },
           py::arg("kind"))
      .def("num_groups", [](const Layout& l, const std::string& k, int level) {
        return l.num_groups(parse_kind(k), level);
      }, py::arg("kind"), py::arg("level") = 0)
      .def("groups_list", [](const Layout& l, const std::string& k, int level) {
        return groups_list(l.groups(parse_kind(k), level));
      }, py::arg("kind"), py::arg("level") = 0)
      .def("groups_array", [](const Layout& l, const std::string& k, int level) {
        return groups_array(l.groups(parse_kind(k), level), "kind \"" + k + "\"");
      }, py::arg("kind"), py::arg("level") = 0)
      .def("group_members", [](const Layout& l, const std::string& k, Rank r, int level) {
        return rank_group(l, parse_kind(k), r, level);
      }, py::arg("kind"), py::arg("rank"), py::arg("level") = 0)
      .def("group_ref", [](const Layout& l, const std::string& k, Rank r, int level) {
        return l.group_of(parse_kind(k), r, level);
      }, py::arg("kind"), py::arg("rank"), py::arg("level") = 0)
      .def("coordinates", [](const Layout& l, Rank r) {
        const RankCoordinates c = l.coordinates(r);
        py::dict d;
        d["tp"] = c.tp; d["cp"] = c.cp; d["dp"] = c.dp; d["pp"] = c.pp;
        d["etp"] = c.etp; d["ep"] = c.ep; d["expert_dp"] = c.expert_dp;
        return d;
      }, py::arg("rank"))
      .def("to_dict", [](const Layout& l, std::optional<Rank> rank) {
        py::dict groups;
        for (GroupKind k : l.kinds()) {
          const int levels = l.levels(k);
          py::object value;
          if (k == GroupKind::hcp) {
            py::list per_level;
            for (int lv = 0; lv < levels; ++lv)
              per_level.append(rank ? rank_group(l, k, *rank, lv) : py::object(groups_list(l.groups(k, lv))));
            value = per_level;
          } else {
            value = rank ? rank_group(l, k, *rank, 0) : py::object(groups_list(l.groups(k)));
          }
          groups[py::str(std::string(kind_name(k)))] = value;
        }
        py::dict doc;
        if (rank) doc["rank"] = *rank; else doc["config"] = config_dict(l);
        doc["groups"] = groups;
        return doc;
      }, py::arg("rank") = py::none(),
           "The document of `commgrid plan --format json` (with a rank: `--rank R`).");
}
