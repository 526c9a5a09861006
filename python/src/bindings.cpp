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
#include "commgrid/creation_order.hpp"
#include "commgrid/error.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/hyper_grid.hpp"
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
  throw OrderError("axis", "unknown axis \"" + name + "\" (valid: tp, cp, ep, dp, pp, gtp_remat)");
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
  if (c.compat == Compat::head) {  // as plan's JSON: the HEAD keys under head only
    d["compat"] = "head";
    d["gtp_remat"] = c.gtp_remat;
    d["expert_gtp_remat"] = c.expert_gtp_remat;
    d["hybrid_context_parallel"] = c.hybrid_context_parallel;
    d["all_gather_groups"] = c.all_gather_groups;
    d["rank_offset"] = c.rank_offset;
    d["local_world_size"] =
        c.local_world_size ? py::object(py::int_(*c.local_world_size)) : py::object(py::none());
  }
  return d;
}

Compat parse_compat(const std::string& name) {
  if (name == "seed") return Compat::seed;
  if (name == "head") return Compat::head;
  throw InvalidValueError("compat", "compat: expected \"seed\" or \"head\", got \"" + name + "\"");
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
    // The seed's five axes (gtp_remat then has size 1, last), or all six.
    std::array<std::int64_t, kNumAxes> s{};
    std::array<Axis, kNumAxes> o{};
    s[static_cast<int>(Axis::gtp_remat)] = 1;
    o[kNumAxes - 1] = Axis::gtp_remat;
    const std::size_t n = order.size();
    if (sizes.size() != n || (n != kSeedAxes.size() && n != kNumAxes))
      throw InvalidValueError("order", "grid_groups needs the five axes tp, cp, ep, dp, pp (or "
                                       "all six with gtp_remat) in sizes and order");
    for (const auto& [name, size] : sizes) s[static_cast<int>(parse_axis(name))] = size;
    bool seen[kNumAxes] = {};
    for (std::size_t i = 0; i < n; ++i) {
      o[i] = parse_axis(order[i]);
      if (seen[static_cast<int>(o[i])])
        throw OrderError("order", "axis \"" + order[i] + "\" appears twice in the grid order");
      seen[static_cast<int>(o[i])] = true;
    }
    if (n == kSeedAxes.size() && seen[static_cast<int>(Axis::gtp_remat)])
      throw InvalidValueError("order", "grid_groups: five axes given, one of them gtp_remat; "
                                       "give tp, cp, ep, dp, pp (or all six)");
    AxisSet set;
    for (const auto& name : masked) set = set.with(parse_axis(name));
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

  m.def("head_order", [](const std::string& order, bool expert) {
    ParallelConfig c;
    c.compat = Compat::head;
    c.order = order;
    return c.head_order(expert);
  }, py::arg("order"), py::arg("expert") = false,
        "Megatron-core HEAD's order tokens (validated): gtp_remat injected after tp (expert: "
        "after ep) unless given, then the omitted axes in HEAD's sequence.");

  m.def("named_grid_groups", [](const std::vector<std::int64_t>& shape,
                                const std::vector<std::string>& names,
                                const std::vector<std::string>& masked, std::int64_t rank_offset) {
    std::int64_t size = 1;
    for (std::int64_t v : shape) {
      if (v < 1) throw InvalidValueError("shape", "grid sizes must be >= 1, got " + std::to_string(v));
      if (size > kMaxWorldSize / v)
        throw OverflowError("world_size", "the product of the grid sizes exceeds " +
                                              std::to_string(kMaxWorldSize));
      size *= v;
    }
    if (rank_offset < 0 || rank_offset > kMaxWorldSize - size)
      throw InvalidValueError("rank_offset", "rank_offset must be in [0, " +
                                                 std::to_string(kMaxWorldSize - size) + "], got " +
                                                 std::to_string(rank_offset));
    const HyperGrid grid(shape, names, rank_offset + size, rank_offset);
    return groups_array(grid.groups(masked), "the grid");
  }, py::arg("shape"), py::arg("names"), py::arg("masked"), py::arg("rank_offset") = 0,
        "Every group of the masked dims of an N-dimensional grid (innermost dim first), each "
        "rank plus rank_offset: HEAD's RankGenerator.get_ranks.");

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
                       py::object position_embedding_ranks, const std::string& compat,
                       std::int64_t gtp_remat, std::int64_t expert_gtp_remat,
                       bool hybrid_context_parallel, bool all_gather_groups,
                       std::int64_t rank_offset, std::optional<std::int64_t> local_world_size) {
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
             c.compat = parse_compat(compat);
             c.gtp_remat = gtp_remat;
             c.expert_gtp_remat = expert_gtp_remat;
             c.hybrid_context_parallel = hybrid_context_parallel;
             c.all_gather_groups = all_gather_groups;
             c.rank_offset = rank_offset;
             c.local_world_size = local_world_size;
             EmbeddingPolicies policies{wrap_policy(embedding_ranks),
                                        wrap_policy(position_embedding_ranks)};
             return std::make_unique<Layout>(std::move(c), std::move(policies));
           }),
           py::arg("world_size"), py::arg("tp") = 1, py::arg("pp") = 1, py::arg("cp") = 1,
           py::arg("ep") = 1, py::arg("etp") = py::none(), py::arg("hcp") = py::none(),
           py::arg("dist_opt_instances") = 1, py::arg("vpp") = py::none(),
           py::arg("order") = std::string(kDefaultOrder), py::arg("embedding_ranks") = py::none(),
           py::arg("position_embedding_ranks") = py::none(), py::arg("compat") = "seed",
           py::arg("gtp_remat") = 1, py::arg("expert_gtp_remat") = 1,
           py::arg("hybrid_context_parallel") = false, py::arg("all_gather_groups") = false,
           py::arg("rank_offset") = 0, py::arg("local_world_size") = py::none())
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
      .def("level_name", [](const Layout& l, const std::string& k, int level) {
        return l.level_name(parse_kind(k), level);
      }, py::arg("kind"), py::arg("level") = 0,
           "The name of one level as reports print it (hybrid_dp_cp_<n>; else the kind).")
      .def("hybrid_sizes", &Layout::hybrid_sizes,
           "Under compat head: the size n of each hybrid_dp_cp level (empty otherwise).")
      .def("creation_order", [](const Layout& l, std::optional<std::vector<std::string>> kinds) {
        std::vector<GroupKind> ks;
        for (const std::string& k : kinds.value_or(std::vector<std::string>{})) ks.push_back(parse_kind(k));
        py::list out;
        for_each_creation(l, ks, [&](GroupKind k, int level, std::int64_t index,
                                     std::span<const Rank> members) {
          out.append(py::make_tuple(std::string(kind_name(k)), level, index, members_list(members)));
        });
        return out;
      }, py::arg("kinds") = py::none(),
           "The per-group strategy's creation calls in Megatron-core's order (the seed's, or "
           "HEAD's under compat head): (kind, level, index, members) tuples.")
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
          if (k == GroupKind::hybrid_dp_cp) {  // one key per level, as HEAD names them
            for (int lv = 0; lv < levels; ++lv)
              groups[py::str(l.level_name(k, lv))] =
                  rank ? rank_group(l, k, *rank, lv) : py::object(groups_list(l.groups(k, lv)));
            continue;
          }
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
