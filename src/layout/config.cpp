#include "commgrid/config.hpp"

#include <algorithm>
#include <sstream>

#include "commgrid/error.hpp"
#include "edition.hpp"

namespace commgrid {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

std::string list_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + str(v[i]);
  return s + "]";
}

bool contains(std::span<const Axis> axes, Axis a) {
  return std::find(axes.begin(), axes.end(), a) != axes.end();
}

// "tp, cp, ep, dp, pp": an edition's tokens, for messages.
std::string token_list(std::span<const Axis> tokens) {
  std::string s;
  for (std::size_t i = 0; i < tokens.size(); ++i)
    s += (i ? ", " : "") + std::string(axis_name(tokens[i]));
  return s;
}

std::vector<Axis> parse_tokens(const std::string& order, std::span<const Axis> valid) {
  if (order.empty())
    throw OrderError("order", "order is empty; expected tokens from " + token_list(valid) +
                                  " joined by '-', e.g. \"tp-cp-ep-dp-pp\"");
  std::vector<Axis> axes;
  std::size_t start = 0;
  for (int pos = 1;; ++pos) {
    const std::size_t dash = order.find('-', start);
    const std::string token =
        order.substr(start, dash == std::string::npos ? std::string::npos : dash - start);
    if (token.empty())
      throw OrderError("order", "order \"" + order + "\": empty token at position " + str(pos));
    std::optional<Axis> axis;
    for (Axis a : valid)
      if (token == axis_name(a)) axis = a;
    if (!axis)
      throw OrderError("order", "order \"" + order + "\": unknown token \"" + token +
                                    "\" (valid: " + token_list(valid) + ")");
    if (contains(axes, *axis))
      throw OrderError("order", "order \"" + order + "\": token \"" + token + "\" appears twice");
    axes.push_back(*axis);
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  return axes;
}

// Multiplies factors left to right; nullopt as soon as a partial product exceeds `limit`
// (every factor is >= 1 here, so the product only grows).
std::optional<std::int64_t> checked_product(std::span<const std::int64_t> factors,
                                            std::int64_t limit) {
  std::int64_t p = 1;
  for (std::int64_t f : factors) {
    if (f != 0 && p > limit / f) return std::nullopt;
    p *= f;
    if (p > limit) return std::nullopt;
  }
  return p;
}

// W / (product of the factors), or 0 when a factor is not positive or the product
// overflows: callers on an invalid config get a harmless 0 instead of undefined behaviour.
std::int64_t quotient(std::int64_t w, std::initializer_list<std::int64_t> factors) noexcept {
  std::int64_t p = 1;
  for (std::int64_t f : factors)
    if (f < 1 || __builtin_mul_overflow(p, f, &p)) return 0;
  return w / p;
}

// One grid's factors as the rules name them: "tp*pp*cp" and "2*1*1".
struct Factors {
  std::vector<std::string> names;
  std::vector<std::int64_t> values;
  [[nodiscard]] std::string name_text() const {
    std::string s;
    for (std::size_t i = 0; i < names.size(); ++i) s += (i ? "*" : "") + names[i];
    return s;
  }
  [[nodiscard]] std::string value_text() const {
    std::string s;
    for (std::size_t i = 0; i < values.size(); ++i) s += (i ? "*" : "") + str(values[i]);
    return s;
  }
  [[nodiscard]] std::string assignments() const {
    std::string s;
    for (std::size_t i = 0; i < names.size(); ++i)
      s += (i ? ", " : "") + names[i] + " = " + str(values[i]);
    return s;
  }
};

// The rules of the layout spec (§4), each written once; an edition runs them in its order.
// Derived sizes (dp, expert_dp) are set by the rule that establishes them, which every
// edition runs before the rules that use them.
class Checker {
 public:
  Checker(const ParallelConfig& c, const detail::Edition& e) : c_(c), e_(e) {}

  void run(detail::Rule rule) {
    using enum detail::Rule;
    switch (rule) {
      case head_options_unset: return head_options_unset_();
      case world_size: return world_size_();
      case positive_sizes: return positive_sizes_();
      case placement: return placement_();
      case order_tokens: tokens_ = parse_tokens(c_.order, e_.tokens); return;
      case order_has_tp: return order_has_tp_();
      case gtp_without_dist_opt: return gtp_without_dist_opt_();
      case dense_divides: dp_ = divides(dense_factors(), "tp", ""); return;
      case vpp_needs_pp: return vpp_needs_pp_();
      case dense_axes_in_order: return dense_axes_in_order_();
      case expert_divides: edp_ = divides(expert_factors(), "etp", etp_note()); return;
      case expert_axes_in_order: return expert_axes_in_order_();
      case pp_last: return pp_last_();
      case pp_groups_agree: return pp_groups_agree_();
      case dist_opt_divides_dp: return dist_opt_divides_dp_();
      case hybrid_even: return hybrid_even_();
      case hcp_product: return hcp_product_();
      case dist_opt_divides_edp: return dist_opt_divides_edp_();
      case all_gather_fits: return all_gather_fits_();
    }
  }

 private:
  [[nodiscard]] std::int64_t L() const { return c_.layout_world_size(); }
  // The laid-out ranks as messages name them.
  [[nodiscard]] std::string world_text() const {
    return std::string(c_.local_world_size ? "local_world_size " : "world_size ") + str(L());
  }
  [[nodiscard]] Factors dense_factors() const {
    Factors f{{"tp", "pp", "cp"}, {c_.tp, c_.pp, c_.cp}};
    if (e_.gtp_remat_axis) {
      f.names.emplace_back("gtp_remat");
      f.values.push_back(c_.gtp_remat);
    }
    return f;
  }
  [[nodiscard]] Factors expert_factors() const {
    Factors f{{"etp", "ep", "pp"}, {c_.expert_tp(), c_.ep, c_.pp}};
    if (e_.gtp_remat_axis) {
      f.names.emplace_back("expert_gtp_remat");
      f.values.push_back(c_.expert_gtp_remat);
    }
    return f;
  }
  [[nodiscard]] std::string etp_note() const { return c_.etp ? "" : " (etp defaults to tp)"; }
  [[nodiscard]] std::string dp_text() const {
    return "dp = " + str(L()) + "/(" + dense_factors().value_text() + ") = " + str(dp_);
  }
  [[nodiscard]] std::string edp_text() const {
    return "expert_dp = " + str(L()) + "/(" + expert_factors().value_text() + ") = " + str(edp_);
  }
  [[nodiscard]] bool in_order(Axis a) const { return contains(tokens_, a); }

  static void require_positive(const char* name, std::int64_t v) {
    if (v < 1) throw InvalidValueError(name, std::string(name) + " must be >= 1, got " + str(v));
  }

  void head_options_unset_() const {
    auto head_only = [](const char* field, bool set, const std::string& value) {
      if (set)
        throw IncompatibleError(field, std::string(field) + " = " + value +
                                           " requires compat head (Megatron-core HEAD)");
    };
    head_only("gtp_remat", c_.gtp_remat != 1, str(c_.gtp_remat));
    head_only("expert_gtp_remat", c_.expert_gtp_remat != 1, str(c_.expert_gtp_remat));
    head_only("hybrid_context_parallel", c_.hybrid_context_parallel, "true");
    head_only("all_gather_groups", c_.all_gather_groups, "true");
    head_only("rank_offset", c_.rank_offset != 0, str(c_.rank_offset));
    head_only("local_world_size", c_.local_world_size.has_value(),
              c_.local_world_size ? str(*c_.local_world_size) : "");
  }

  void world_size_() const {
    // Checked first: every later rule computes with it.
    const std::int64_t W = c_.world_size;
    if (W < 1) throw InvalidValueError("world_size", "world_size must be >= 1, got " + str(W));
    if (W > kMaxWorldSize)
      throw OverflowError("world_size", "world_size " + str(W) + " exceeds " + str(kMaxWorldSize) +
                                            ", the largest rank count MPI/NCCL can address");
  }

  void positive_sizes_() const {
    require_positive("tp", c_.tp);
    require_positive("pp", c_.pp);
    require_positive("cp", c_.cp);
    require_positive("ep", c_.ep);
    require_positive("dist_opt_instances", c_.dist_opt_instances);
    require_positive("gtp_remat", c_.gtp_remat);
    require_positive("expert_gtp_remat", c_.expert_gtp_remat);
    if (c_.etp) require_positive("etp", *c_.etp);
    if (c_.vpp) require_positive("vpp", *c_.vpp);
    // Rule 12 for the sizes no product bounds: the runtime reports vpp and the hcp level as
    // an int, like every rank.
    if (c_.vpp && *c_.vpp > kMaxWorldSize)
      throw OverflowError("vpp", "vpp = " + str(*c_.vpp) + " exceeds " + str(kMaxWorldSize) +
                                     ", the largest virtual pipeline size");
    if (c_.hcp.size() > static_cast<std::size_t>(kMaxWorldSize))
      throw OverflowError("hcp", "hcp has " + std::to_string(c_.hcp.size()) +
                                     " levels, more than " + str(kMaxWorldSize));
    for (std::size_t i = 0; i < c_.hcp.size(); ++i)
      if (c_.hcp[i] < 1)
        throw InvalidValueError(
            "hcp", "hcp[" + std::to_string(i) + "] must be >= 1, got " + str(c_.hcp[i]));
  }

  void placement_() const {
    const std::int64_t W = c_.world_size;
    if (c_.rank_offset < 0)
      throw InvalidValueError("rank_offset",
                              "rank_offset must be >= 0, got " + str(c_.rank_offset));
    if (c_.local_world_size) {
      require_positive("local_world_size", *c_.local_world_size);
      if (*c_.local_world_size > W)
        throw InvalidValueError(
            "local_world_size",
            "local_world_size = " + str(*c_.local_world_size) + " exceeds world_size " + str(W));
    }
    if (c_.rank_offset > W - L())
      throw IncompatibleError(
          "rank_offset", "rank_offset = " + str(c_.rank_offset) + " + " +
                             (c_.local_world_size ? "local_world_size" : "world_size") + " = " +
                             str(L()) + " exceeds world_size " + str(W) +
                             " (ranks must stay in [0, world_size))");
  }

  void order_has_tp_() const {
    // HEAD finds "tp" inside "gtp_remat" and then fails its lookup of tp: an order without
    // tp is invalid even with tp = 1.
    if (!in_order(Axis::tp))
      throw OrderError("order", "order \"" + c_.order +
                                    "\" has no \"tp\"; Megatron-core HEAD requires tp in the "
                                    "order (even with tp = 1); add \"tp\" to the order");
  }

  void gtp_without_dist_opt_() const {
    const std::int64_t N = c_.dist_opt_instances;
    if ((c_.gtp_remat > 1 || c_.expert_gtp_remat > 1) && N > 1)
      throw IncompatibleError("gtp_remat", "gtp_remat = " + str(c_.gtp_remat) +
                                               " / expert_gtp_remat = " + str(c_.expert_gtp_remat) +
                                               " with dist_opt_instances = " + str(N) +
                                               " is not supported by Megatron-core HEAD");
  }

  // Rules 4 and 6 (with rule 12's checked product): the grid's factors divide the laid-out
  // ranks. Returns the quotient (dp or expert_dp).
  [[nodiscard]] std::int64_t divides(const Factors& f, const char* overflow_param,
                                     const std::string& note) const {
    const auto product = checked_product(f.values, kMaxWorldSize);
    if (!product)
      throw OverflowError(overflow_param, f.name_text() + " exceeds " + world_text() + " (" +
                                              f.assignments() + ")" + note);
    if (L() % *product != 0)
      throw DivisibilityError(c_.local_world_size ? "local_world_size" : "world_size",
                              world_text() + " is not divisible by " + f.name_text() + " = " +
                                  f.value_text() + " = " + str(*product) + note);
    return L() / *product;
  }

  void vpp_needs_pp_() const {
    if (c_.vpp && c_.pp <= 1)
      throw IncompatibleError("vpp",
                              "vpp = " + str(*c_.vpp) + " requires pp > 1, got pp = " + str(c_.pp));
  }

  [[noreturn]] void omitted(const char* token, const std::string& what) const {
    throw OrderError("order", "order \"" + c_.order + "\" omits \"" + token + "\", but " + what +
                                  "; add \"" + token + "\" to the order");
  }

  // Rule 10: every axis the order omits has size 1. Megatron's generator looks at the axes
  // in the sequence tp, pp, dp, ep, cp (ep is 1 on the dense grid, cp on the expert grid).
  void dense_axes_in_order_() const {
    if (!in_order(Axis::tp) && c_.tp != 1) omitted("tp", "tp = " + str(c_.tp));
    if (!in_order(Axis::pp) && c_.pp != 1) omitted("pp", "pp = " + str(c_.pp));
    if (!in_order(Axis::dp) && dp_ != 1) omitted("dp", dp_text());
    if (!in_order(Axis::cp) && c_.cp != 1) omitted("cp", "cp = " + str(c_.cp));
  }
  void expert_axes_in_order_() const {
    if (!in_order(Axis::tp) && c_.expert_tp() != 1) omitted("tp", "etp = " + str(c_.expert_tp()));
    if (!in_order(Axis::dp) && edp_ != 1) omitted("dp", edp_text());
    if (!in_order(Axis::ep) && c_.ep != 1) omitted("ep", "ep = " + str(c_.ep));
  }

  // Rule 7, on the order as given.
  void pp_last_() const {
    if (tokens_.back() != Axis::pp && c_.pp != 1 && edp_ != dp_)
      throw IncompatibleError(
          "order", "order \"" + c_.order + "\" does not end with pp and pp = " + str(c_.pp) +
                       ", so expert_dp must equal dp; got " + edp_text() + ", " + dp_text());
  }

  // Rule 11: the pp groups of the two grids agree exactly when their pp strides (the
  // product of the sizes of the axes before pp in each grid's order) agree.
  void pp_groups_agree_() const {
    if (c_.pp == 1) return;
    struct Stride {
      std::int64_t value = 1;
      std::string names;
    };
    auto stride = [&](bool expert) {
      Stride s;
      for (Axis a : c_.grid_order(expert)) {
        if (a == Axis::pp) break;
        // Axes that do not exist on a grid (ep on the dense one, cp on the expert one).
        if (a == (expert ? Axis::cp : Axis::ep)) continue;
        std::string name(axis_name(a));
        std::int64_t size = 1;
        switch (a) {
          case Axis::tp:
            size = expert ? c_.expert_tp() : c_.tp;
            name = expert ? "etp" : "tp";
            break;
          case Axis::cp: size = c_.cp; break;
          case Axis::ep: size = c_.ep; break;
          case Axis::dp:
            size = expert ? edp_ : dp_;
            name = expert ? "expert_dp" : "dp";
            break;
          case Axis::pp: break;
          case Axis::gtp_remat:
            size = expert ? c_.expert_gtp_remat : c_.gtp_remat;
            name = expert ? "expert_gtp_remat" : "gtp_remat";
            break;
        }
        s.value *= size;
        s.names += (s.names.empty() ? "" : "*") + name;
      }
      return s;
    };
    const Stride d = stride(false), e = stride(true);
    if (d.value == e.value) return;
    auto first = [&](std::int64_t s) {
      std::string t = "[";
      for (std::int64_t k = 0; k < c_.pp && k < 4; ++k)
        t += (k ? "," : "") + str(c_.rank_offset + k * s);
      return t + (c_.pp > 4 ? ",...]" : "]");
    };
    auto label = [](const Stride& s) {
      return str(s.value) + (s.names.empty() ? "" : " = " + s.names);
    };
    throw IncompatibleError("order", "order \"" + c_.order +
                                         "\": pipeline groups differ between the dense and expert "
                                         "grids (pp stride " +
                                         label(d) + " vs " + label(e) + "; first groups " +
                                         first(d.value) + " vs " + first(e.value) + ")");
  }

  void dist_opt_divides_dp_() const {
    const std::int64_t N = c_.dist_opt_instances;
    if ((dp_ * c_.cp) % N != 0)
      throw DivisibilityError("dist_opt_instances", "dist_opt_instances = " + str(N) +
                                                        " must divide dp*cp = " + str(dp_) + "*" +
                                                        str(c_.cp) + " = " + str(dp_ * c_.cp));
  }

  void hybrid_even_() const {
    if (c_.hybrid_context_parallel && (dp_ * c_.cp) % 2 != 0)
      throw IncompatibleError("hybrid_context_parallel",
                              "hybrid_context_parallel requires an even dp*cp (the dp_cp group "
                              "size), got " +
                                  str(dp_) + "*" + str(c_.cp) + " = " + str(dp_ * c_.cp));
  }

  void hcp_product_() const {
    if (c_.hcp.empty()) return;
    const auto prod = checked_product(c_.hcp, kMaxWorldSize);
    if (!prod)
      throw IncompatibleError(
          "hcp", "hcp sizes " + list_text(c_.hcp) + " multiply to more than cp = " + str(c_.cp));
    if (*prod != c_.cp)
      throw IncompatibleError("hcp", "hcp sizes " + list_text(c_.hcp) + " multiply to " +
                                         str(*prod) + ", but cp = " + str(c_.cp));
  }

  void dist_opt_divides_edp_() const {
    const std::int64_t N = c_.dist_opt_instances;
    if (edp_ % N != 0)
      throw DivisibilityError("dist_opt_instances",
                              "dist_opt_instances = " + str(N) + " must divide " + edp_text());
  }

  void all_gather_fits_() const {
    if (!c_.all_gather_groups) return;
    // create_all_gather_groups rebuilds the grids from the group sizes with dp taken as
    // dp*gtp_remat and the gtp_remat axis added again: L*gtp_remat ranks from rank 0.
    auto check = [&](const char* which, const char* gtp_name, std::int64_t g) {
      const std::array<std::int64_t, 2> f{L(), g};
      const auto span = checked_product(f, kMaxWorldSize);
      if (!span || *span > c_.world_size)
        throw IncompatibleError(
            "all_gather_groups",
            std::string("all_gather_groups: HEAD's create_all_gather_groups builds its ") + which +
                " grid over L*" + gtp_name + " = " + str(L()) + "*" + str(g) +
                " ranks, more than world_size " + str(c_.world_size));
    };
    check("dense", "gtp_remat", c_.gtp_remat);
    if (c_.ep > 1) check("expert", "expert_gtp_remat", c_.expert_gtp_remat);
  }

  const ParallelConfig& c_;
  const detail::Edition& e_;
  std::vector<Axis> tokens_;
  std::int64_t dp_ = 0, edp_ = 0;
};

}  // namespace

std::vector<Axis> parse_order(const std::string& order, Compat compat) {
  return parse_tokens(order, detail::edition_of(compat).tokens);
}

std::array<Axis, kNumAxes> ParallelConfig::grid_order(bool expert) const {
  const detail::Edition& e = detail::edition_of(compat);
  std::vector<Axis> axes = parse_tokens(order, e.tokens);
  if (e.gtp_remat_axis && !contains(axes, Axis::gtp_remat)) {
    // HEAD's _inject_gtp_remat_axis: after the anchor (ep on the expert grid, else tp), or
    // first when neither is there.
    const Axis anchor = expert && contains(axes, Axis::ep) ? Axis::ep : Axis::tp;
    const auto it = std::find(axes.begin(), axes.end(), anchor);
    axes.insert(it == axes.end() ? axes.begin() : it + 1, Axis::gtp_remat);
  }
  // Megatron appends the omitted axes in this sequence; their size is 1 (rule 10), so the
  // position changes no group, but it fixes the strides reported for them.
  for (Axis a : {Axis::tp, Axis::pp, Axis::dp, Axis::ep, Axis::cp, Axis::gtp_remat})
    if (!contains(axes, a)) axes.push_back(a);
  std::array<Axis, kNumAxes> out{};
  std::copy(axes.begin(), axes.end(), out.begin());
  return out;
}

std::vector<std::string> ParallelConfig::head_order(bool expert) const {
  ParallelConfig h = *this;
  h.compat = Compat::head;
  std::vector<std::string> out;
  for (Axis a : h.grid_order(expert)) out.emplace_back(axis_name(a));
  return out;
}

std::int64_t ParallelConfig::dp() const noexcept {
  if (compat == Compat::head) return quotient(layout_world_size(), {tp, pp, cp, gtp_remat});
  return quotient(world_size, {tp, pp, cp});
}

std::int64_t ParallelConfig::expert_dp() const noexcept {
  if (compat == Compat::head)
    return quotient(layout_world_size(), {expert_tp(), ep, pp, expert_gtp_remat});
  return quotient(world_size, {expert_tp(), ep, pp});
}

const char* compat_name(Compat c) noexcept { return c == Compat::head ? "head" : "seed"; }

void ParallelConfig::validate() const {
  Checker check(*this, detail::edition_of(compat));
  for (detail::Rule r : detail::edition_of(compat).rules) check.run(r);
}

std::string ParallelConfig::canonical() const {
  std::ostringstream s;
  s << "world_size=" << world_size << " tp=" << tp << " pp=" << pp << " cp=" << cp << " ep=" << ep
    << " etp=" << (etp ? str(*etp) : "none") << " hcp=" << list_text(hcp)
    << " dist_opt_instances=" << dist_opt_instances << " vpp=" << (vpp ? str(*vpp) : "none")
    << " order=" << order;
  if (compat == Compat::head)
    s << " compat=head gtp_remat=" << gtp_remat << " expert_gtp_remat=" << expert_gtp_remat
      << " hybrid_context_parallel=" << hybrid_context_parallel
      << " all_gather_groups=" << all_gather_groups << " rank_offset=" << rank_offset
      << " local_world_size=" << (local_world_size ? str(*local_world_size) : "none");
  return s.str();
}

}  // namespace commgrid
