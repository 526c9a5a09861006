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
  } catch (const ConfigError& e) { raise_config_error("ConfigError", e); } catch (const Error& e) {
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
      throw InvalidValueError(
          "kind", "the groups of " + what + " have different sizes; use groups() for lists");
  auto* owned = new GroupList(std::move(groups));
  py::capsule base(owned, [](void* p) { delete static_cast<GroupList*>(p); });
  const auto stride = static_cast<py::ssize_t>(sizeof(std::int64_t));
  return py::array_t<std::int64_t>({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(g)},
                                   {static_cast<py::ssize_t>(g) * stride, stride},
                                   owned->members().data(), base);
}

// An embedding policy written in Python. What it returns must be a sequence of ints; any
// other result is the policy's mistake, a PolicyError naming it (what it returns that is
// a list of ints the core checks further: members of the pp group, distinct, not empty).
// An exception the policy raises itself propagates unchanged.
EmbeddingPolicy wrap_policy(const py::object& fn, const char* name) {
  if (fn.is_none()) return {};
  if (!PyCallable_Check(fn.ptr()))
    throw PolicyError(name, std::string(name) +
                                ": expected a callable (pp group ranks -> ranks) or None, got " +
                                py::repr(fn).cast<std::string>());
  return [fn, name](std::span<const Rank> pp_group) {
    py::object result = fn(members_list(pp_group));
    try {
      if (py::isinstance<py::str>(result) || py::isinstance<py::bytes>(result))
        throw py::cast_error("a string");
      return result.cast<std::vector<Rank>>();
    } catch (const py::cast_error&) {
      std::string shown = py::repr(result).cast<std::string>();
      if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
      throw PolicyError(name, std::string(name) + ": the policy returned " + shown +
                                  " for pp group " +
                                  py::repr(members_list(pp_group)).cast<std::string>() +
                                  "; expected a list of ranks (ints)");
    }
  };
}

// Every bound object is checked before use: an instance whose construction raised (it is
// still reachable, e.g. from a traceback's frames) or that was made by __new__ alone has
// no C++ object behind it, and reading one would read uninitialized memory.
template <class T>
T& live(py::handle self, const char* what, const char* made_by) {
  if (!py::isinstance<T>(self))
    throw py::type_error(std::string(what) + " method called on " +
                         py::repr(py::type::handle_of(self)).cast<std::string>());
  auto* inst = reinterpret_cast<py::detail::instance*>(self.ptr());
  py::detail::value_and_holder vh =
      inst->get_value_and_holder(py::detail::get_type_info(typeid(T)));
  if (!vh || !vh.holder_constructed() || vh.value_ptr() == nullptr) {
    PyErr_SetString(error_class("StateError").ptr(),
                    (std::string(what) +
                     " is not initialized: its construction failed or never ran "
                     "(" +
                     made_by + ")")
                        .c_str());
    throw py::error_already_set();
  }
  return *vh.value_ptr<T>();
}

const Layout& L(py::handle self) {
  return live<Layout>(self, "Layout", "make one with commgrid.Layout(...)");
}

// Results as Python lists take about 36 bytes per rank (a list slot and an int object),
// numpy arrays 8; a result larger than the limit is refused before anything is built, as
// `commgrid plan` refuses with --max-output-mib. 0 means no limit.
constexpr std::int64_t kDefaultMaxOutputMiB = 1024;

void check_output(std::int64_t members, std::int64_t bytes_per_member, std::int64_t limit_mib,
                  const std::string& what, const std::string& instead) {
  if (limit_mib < 0)
    throw InvalidValueError("max_output_mib", "max_output_mib must be >= 0 (0: no limit), got " +
                                                  std::to_string(limit_mib));
  if (limit_mib == 0) return;
  const std::int64_t limit = limit_mib > (INT64_MAX >> 20) ? INT64_MAX : (limit_mib << 20);
  if (members > limit / bytes_per_member)
    throw OverflowError("max_output_mib",
                        what + " would hold " + std::to_string(members) + " ranks (about " +
                            std::to_string(members / (1 << 20) * bytes_per_member) +
                            " MiB), over the " + std::to_string(limit_mib) + " MiB limit; " +
                            instead + ", or raise the limit with max_output_mib=N (0: none)");
}

constexpr std::int64_t kListBytes = 36, kArrayBytes = 8;

// The number of members of r's group of the kind, without listing them (an upper bound
// for a custom embedding policy's groups, which differ in size).
std::int64_t own_group_members(const Layout& l, GroupKind k, int level) {
  const auto g = l.group_size(k, level);
  return g ? *g : l.num_members(k, level);
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

py::object rank_group(const Layout& layout, GroupKind k, Rank r, int level,
                      std::int64_t limit_mib) {
  layout.check_rank(r);
  check_output(own_group_members(layout, k, level), kListBytes, limit_mib,
               "rank " + std::to_string(r) + "'s " + layout.level_name(k, level) + " group",
               "ask for its size with group_size() instead");
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

  m.def(
      "kind_names",
      [] {
        std::vector<std::string> names;
        for (GroupKind k : all_kinds()) names.emplace_back(kind_name(k));
        return names;
      },
      "Every group kind name, in reference order.");
  m.attr("DEFAULT_ORDER") = kDefaultOrder;
  m.attr("MAX_WORLD_SIZE") = kMaxWorldSize;

  m.def(
      "hierarchical_split",
      [](const std::vector<Rank>& parent, const std::vector<std::int64_t>& sizes, int level) {
        std::int64_t product = 1;
        for (std::int64_t v : sizes) {
          if (v < 1)
            throw InvalidValueError("sizes",
                                    "hierarchical sizes must be >= 1, got " + std::to_string(v));
          product = v > kMaxWorldSize / product ? kMaxWorldSize + 1 : product * v;
        }
        if (product != static_cast<std::int64_t>(parent.size()))
          throw IncompatibleError("sizes", "hierarchical sizes multiply to " +
                                               std::to_string(product) + ", not to the " +
                                               std::to_string(parent.size()) + " ranks");
        if (level < 0 || level >= static_cast<int>(sizes.size()))
          throw InvalidValueError("level", "level must be in [0, " + std::to_string(sizes.size()) +
                                               "), got " + std::to_string(level));
        GroupList out;
        hierarchical_split(parent, sizes, level, out);
        return groups_list(out);
      },
      py::arg("parent"), py::arg("sizes"), py::arg("level"),
      "Level `level` of the hierarchical split of `parent` (Megatron's create_hierarchical_groups).");

  m.def(
      "resolve_order",
      [](const std::string& order) {
        ParallelConfig c;
        c.order = order;
        std::vector<std::string> out;
        for (Axis a : c.resolved_order()) out.emplace_back(axis_name(a));
        return out;
      },
      py::arg("order"),
      "The order's tokens (validated), then the omitted axes in Megatron's sequence.");

  m.def(
      "grid_groups",
      [](const std::map<std::string, std::int64_t>& sizes, const std::vector<std::string>& order,
         const std::vector<std::string>& masked) {
        // The seed's five axes (gtp_remat then has size 1, last), or all six.
        std::array<std::int64_t, kNumAxes> s{};
        std::array<Axis, kNumAxes> o{};
        s[static_cast<int>(Axis::gtp_remat)] = 1;
        o[kNumAxes - 1] = Axis::gtp_remat;
        const std::size_t n = order.size();
        if (sizes.size() != n || (n != kSeedAxes.size() && n != kNumAxes))
          throw InvalidValueError("order",
                                  "grid_groups needs the five axes tp, cp, ep, dp, pp (or "
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
          throw InvalidValueError("order",
                                  "grid_groups: five axes given, one of them gtp_remat; "
                                  "give tp, cp, ep, dp, pp (or all six)");
        AxisSet set;
        for (const auto& name : masked) set = set.with(parse_axis(name));
        std::int64_t world = 1;
        for (std::int64_t v : s) {
          if (v < 1)
            throw InvalidValueError("size", "grid sizes must be >= 1, got " + std::to_string(v));
          if (world > kMaxWorldSize / v)
            throw OverflowError("world_size", "the product of the grid sizes exceeds " +
                                                  std::to_string(kMaxWorldSize));
          world *= v;
        }
        const RankGrid grid(s, o);
        return groups_array(grid.groups(set), "the grid");
      },
      py::arg("sizes"), py::arg("order"), py::arg("masked"),
      "Every group of the masked axes of a grid (Megatron's generate_masked_orthogonal_rank_groups).");

  m.def(
      "head_order",
      [](const std::string& order, bool expert) {
        ParallelConfig c;
        c.compat = Compat::head;
        c.order = order;
        return c.head_order(expert);
      },
      py::arg("order"), py::arg("expert") = false,
      "Megatron-core HEAD's order tokens (validated): gtp_remat injected after tp (expert: "
      "after ep) unless given, then the omitted axes in HEAD's sequence.");

  m.def(
      "named_grid_groups",
      [](const std::vector<std::int64_t>& shape, const std::vector<std::string>& names,
         const std::vector<std::string>& masked, std::int64_t rank_offset) {
        std::int64_t size = 1;
        for (std::int64_t v : shape) {
          if (v < 1)
            throw InvalidValueError("shape", "grid sizes must be >= 1, got " + std::to_string(v));
          if (size > kMaxWorldSize / v)
            throw OverflowError("world_size", "the product of the grid sizes exceeds " +
                                                  std::to_string(kMaxWorldSize));
          size *= v;
        }
        if (rank_offset < 0 || rank_offset > kMaxWorldSize - size)
          throw InvalidValueError("rank_offset", "rank_offset must be in [0, " +
                                                     std::to_string(kMaxWorldSize - size) +
                                                     "], got " + std::to_string(rank_offset));
        const HyperGrid grid(shape, names, rank_offset + size, rank_offset);
        return groups_array(grid.groups(masked), "the grid");
      },
      py::arg("shape"), py::arg("names"), py::arg("masked"), py::arg("rank_offset") = 0,
      "Every group of the masked dims of an N-dimensional grid (innermost dim first), each "
      "rank plus rank_offset: HEAD's RankGenerator.get_ranks.");

  auto grid = [](py::handle self) -> HyperGrid& {
    return live<HyperGrid>(self, "HyperGrid", "make one with commgrid._commgrid.HyperGrid(...)");
  };
  py::class_<HyperGrid>(
      m, "HyperGrid",
      "The core's N-dimensional grid (HEAD's HyperCommGrid without process groups).")
      .def(py::init<std::vector<std::int64_t>, std::vector<std::string>, std::int64_t,
                    std::int64_t>(),
           py::arg("shape"), py::arg("dim_names"), py::arg("world_size"),
           py::arg("rank_offset") = 0)
      .def_property_readonly("size", [grid](py::handle s) { return grid(s).size(); })
      .def_property_readonly("rank_offset", [grid](py::handle s) { return grid(s).rank_offset(); })
      .def(
          "register_view",
          [grid](py::handle s, const std::string& name, std::vector<std::int64_t> shape,
                 std::vector<std::string> names, std::vector<std::string> shared) {
            grid(s).register_view(name, std::move(shape), std::move(names), std::move(shared));
          },
          py::arg("name"), py::arg("shape"), py::arg("dim_names"), py::arg("shared_dims"))
      .def(
          "groups",
          [grid](py::handle s, const std::vector<std::string>& dims, const std::string& view) {
            return groups_array(grid(s).groups(dims, view), "the grid");
          },
          py::arg("dims"), py::arg("view") = "",
          "Every group over dims (a set) of the view (\"\": the base grid), innermost dim fastest.")
      .def(
          "key",
          [grid](py::handle s, const std::vector<std::string>& dims, const std::string& view) {
            return grid(s).key(dims, view);
          },
          py::arg("dims"), py::arg("view") = "");

  auto ref = [](py::handle self) -> const GroupRef& {
    return live<GroupRef>(self, "GroupRef", "Layout.group_ref returns them");
  };
  py::class_<GroupRef>(m, "GroupRef", "One rank's group of one kind.")
      .def_property_readonly(
          "index", [ref](py::handle s) { return ref(s).index; },
          "index of the group in the kind's order")
      .def_property_readonly(
          "position", [ref](py::handle s) { return ref(s).position; },
          "index of the rank in members")
      .def_property_readonly(
          "comm_rank", [ref](py::handle s) { return ref(s).comm_rank; },
          "the rank's rank in a communicator of the group (sorted position)")
      .def_property_readonly("members",
                             [ref](py::handle s) { return members_list(ref(s).members); })
      .def("__repr__", [ref](py::handle s) {
        const GroupRef& g = ref(s);
        return "GroupRef(index=" + std::to_string(g.index) +
               ", position=" + std::to_string(g.position) +
               ", comm_rank=" + std::to_string(g.comm_rank) +
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
             EmbeddingPolicies policies{
                 wrap_policy(embedding_ranks, "embedding_ranks"),
                 wrap_policy(position_embedding_ranks, "position_embedding_ranks")};
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
      .def_property_readonly("world_size", [](py::handle s) { return L(s).world_size(); })
      .def_property_readonly("dp", [](py::handle s) { return L(s).dp(); })
      .def_property_readonly("expert_dp", [](py::handle s) { return L(s).expert_dp(); })
      .def_property_readonly(
          "config", [](py::handle s) { return config_dict(L(s)); },
          "the configuration, as plan's JSON has it")
      .def(
          "initialized",
          [](py::handle s) {
            if (!py::isinstance<Layout>(s)) return false;
            auto* inst = reinterpret_cast<py::detail::instance*>(s.ptr());
            auto vh = inst->get_value_and_holder(py::detail::get_type_info(typeid(Layout)));
            return static_cast<bool>(vh) && vh.holder_constructed();
          },
          "Whether a C++ layout stands behind this object (False when its construction failed).")
      .def(
          "kinds",
          [](py::handle s) {
            std::vector<std::string> names;
            for (GroupKind k : L(s).kinds()) names.emplace_back(kind_name(k));
            return names;
          },
          "The kinds this layout has, in reference order.")
      .def(
          "has_kind",
          [](py::handle s, const std::string& k) { return L(s).has_kind(parse_kind(k)); },
          py::arg("kind"))
      .def(
          "levels", [](py::handle s, const std::string& k) { return L(s).levels(parse_kind(k)); },
          py::arg("kind"))
      .def(
          "level_name",
          [](py::handle s, const std::string& k, int level) {
            return L(s).level_name(parse_kind(k), level);
          },
          py::arg("kind"), py::arg("level") = 0,
          "The name of one level as reports print it (hybrid_dp_cp_<n>; else the kind).")
      .def(
          "hybrid_sizes", [](py::handle s) { return L(s).hybrid_sizes(); },
          "Under compat head: the size n of each hybrid_dp_cp level (empty otherwise).")
      .def(
          "creation_order",
          [](py::handle s, std::optional<std::vector<std::string>> kinds) {
            const Layout& l = L(s);
            std::vector<GroupKind> ks;
            for (const std::string& k : kinds.value_or(std::vector<std::string>{}))
              ks.push_back(parse_kind(k));
            py::list out;
            for_each_creation(
                l, ks,
                [&](GroupKind k, int level, std::int64_t index, std::span<const Rank> members) {
                  out.append(py::make_tuple(std::string(kind_name(k)), level, index,
                                            members_list(members)));
                });
            return out;
          },
          py::arg("kinds") = py::none(),
          "The per-group strategy's creation calls in Megatron-core's order (the seed's, or "
          "HEAD's under compat head): (kind, level, index, members) tuples.")
      .def(
          "creation_aliases",
          [](py::handle s, std::optional<std::vector<std::string>> kinds) {
            std::vector<GroupKind> ks;
            for (const std::string& k : kinds.value_or(std::vector<std::string>{}))
              ks.push_back(parse_kind(k));
            std::vector<std::pair<std::string, std::string>> out;
            for (const CreationAlias& a : creation_aliases(L(s), ks))
              out.emplace_back(std::string(kind_name(a.kind)), std::string(kind_name(a.parent)));
            return out;
          },
          py::arg("kinds") = py::none(),
          "(kind, parent) pairs: kinds Megatron-core does not create because they are their "
          "parent's groups (intra_dp_cp with one dist-opt instance, ...).")
      .def(
          "num_groups",
          [](py::handle s, const std::string& k, int level) {
            return L(s).num_groups(parse_kind(k), level);
          },
          py::arg("kind"), py::arg("level") = 0)
      .def(
          "group_size",
          [](py::handle s, const std::string& k, int level) {
            return L(s).group_size(parse_kind(k), level);
          },
          py::arg("kind"), py::arg("level") = 0,
          "The size every group of the kind has, or None when they differ.")
      .def(
          "num_members",
          [](py::handle s, const std::string& k, int level) {
            return L(s).num_members(parse_kind(k), level);
          },
          py::arg("kind"), py::arg("level") = 0, "The members of all groups of the kind together.")
      .def(
          "groups_list",
          [](py::handle s, const std::string& k, int level, std::int64_t limit) {
            const Layout& l = L(s);
            const GroupKind kind = parse_kind(k);
            check_output(l.num_members(kind, level), kListBytes, limit, "groups(\"" + k + "\")",
                         "ask for one rank's group (group_of) instead");
            return groups_list(l.groups(kind, level));
          },
          py::arg("kind"), py::arg("level") = 0, py::arg("max_output_mib") = kDefaultMaxOutputMiB)
      .def(
          "groups_array",
          [](py::handle s, const std::string& k, int level, std::int64_t limit) {
            const Layout& l = L(s);
            const GroupKind kind = parse_kind(k);
            check_output(l.num_members(kind, level), kArrayBytes, limit, "array(\"" + k + "\")",
                         "ask for one rank's group (group_of) instead");
            return groups_array(l.groups(kind, level), "kind \"" + k + "\"");
          },
          py::arg("kind"), py::arg("level") = 0, py::arg("max_output_mib") = kDefaultMaxOutputMiB)
      .def(
          "group_members",
          [](py::handle s, const std::string& k, Rank r, int level, std::int64_t limit) {
            return rank_group(L(s), parse_kind(k), r, level, limit);
          },
          py::arg("kind"), py::arg("rank"), py::arg("level") = 0,
          py::arg("max_output_mib") = kDefaultMaxOutputMiB)
      .def(
          "group_ref",
          [](py::handle s, const std::string& k, Rank r, int level, std::int64_t limit) {
            const Layout& l = L(s);
            const GroupKind kind = parse_kind(k);
            l.check_rank(r);
            check_output(own_group_members(l, kind, level), kListBytes, limit,
                         "rank " + std::to_string(r) + "'s " + l.level_name(kind, level) + " group",
                         "ask for its size (group_size) instead");
            return l.group_of(kind, r, level);
          },
          py::arg("kind"), py::arg("rank"), py::arg("level") = 0,
          py::arg("max_output_mib") = kDefaultMaxOutputMiB)
      .def(
          "coordinates",
          [](py::handle s, Rank r) {
            const RankCoordinates c = L(s).coordinates(r);
            py::dict d;
            d["tp"] = c.tp;
            d["cp"] = c.cp;
            d["dp"] = c.dp;
            d["pp"] = c.pp;
            d["etp"] = c.etp;
            d["ep"] = c.ep;
            d["expert_dp"] = c.expert_dp;
            return d;
          },
          py::arg("rank"))
      .def(
          "to_dict",
          [](py::handle s, std::optional<Rank> rank, std::int64_t limit) {
            const Layout& l = L(s);
            // The whole document is refused before any of it is built.
            std::int64_t members = 0;
            if (rank) l.check_rank(*rank);
            for (GroupKind k : l.kinds())
              for (int lv = 0; lv < l.levels(k); ++lv) {
                const std::int64_t n = rank ? own_group_members(l, k, lv) : l.num_members(k, lv);
                members = n > INT64_MAX - members ? INT64_MAX : members + n;
              }
            check_output(
                members, kListBytes, limit,
                rank ? "to_dict(rank=" + std::to_string(*rank) + ")" : std::string("to_dict()"),
                rank ? "read single kinds with group_of" : "ask for one rank (to_dict(rank=R))");
            py::dict groups;
            auto one = [&](GroupKind k, int lv) {
              return rank ? rank_group(l, k, *rank, lv, 0)
                          : py::object(groups_list(l.groups(k, lv)));
            };
            for (GroupKind k : l.kinds()) {
              const int levels = l.levels(k);
              if (k == GroupKind::hybrid_dp_cp) {  // one key per level, as HEAD names them
                for (int lv = 0; lv < levels; ++lv)
                  groups[py::str(l.level_name(k, lv))] = one(k, lv);
                continue;
              }
              py::object value;
              if (k == GroupKind::hcp) {
                py::list per_level;
                for (int lv = 0; lv < levels; ++lv) per_level.append(one(k, lv));
                value = per_level;
              } else {
                value = one(k, 0);
              }
              groups[py::str(std::string(kind_name(k)))] = value;
            }
            py::dict doc;
            if (rank) doc["rank"] = *rank;
            else doc["config"] = config_dict(l);
            doc["groups"] = groups;
            return doc;
          },
          py::arg("rank") = py::none(), py::arg("max_output_mib") = kDefaultMaxOutputMiB,
          "The document of `commgrid plan --format json` (with a rank: `--rank R`).");
}
