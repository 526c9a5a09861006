#include "commgrid/config.hpp"

#include <sstream>

#include "commgrid/error.hpp"

namespace commgrid {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

std::string list_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + str(v[i]);
  return s + "]";
}

// Multiplies factors left to right; returns nullopt as soon as a partial product exceeds
// `limit` (all factors are >= 1 here, so the product only grows). Products up to
// kMaxWorldSize are reported exactly by the divisibility rules; larger ones are overflow.
std::optional<std::int64_t> checked_product(std::initializer_list<std::int64_t> factors,
                                            std::int64_t limit) {
  std::int64_t p = 1;
  for (std::int64_t f : factors) {
    if (f != 0 && p > limit / f) return std::nullopt;
    p *= f;
    if (p > limit) return std::nullopt;
  }
  return p;
}

void require_positive(const char* name, std::int64_t v) {
  if (v < 1) throw InvalidValueError(name, std::string(name) + " must be >= 1, got " + str(v));
}

}  // namespace

std::vector<Axis> parse_order(const std::string& order) {
  const std::string valid = "(valid: tp, cp, ep, dp, pp)";
  if (order.empty())
    throw OrderError("order",
                     "order is empty; expected tokens from tp, cp, ep, dp, pp joined by '-', "
                     "e.g. \"tp-cp-ep-dp-pp\"");
  std::vector<Axis> axes;
  std::size_t start = 0;
  for (int pos = 1;; ++pos) {
    std::size_t dash = order.find('-', start);
    std::string token = order.substr(start, dash == std::string::npos ? std::string::npos
                                                                      : dash - start);
    if (token.empty())
      throw OrderError("order", "order \"" + order + "\": empty token at position " + str(pos));
    std::optional<Axis> axis;
    for (Axis a : kAllAxes)
      if (token == axis_name(a)) axis = a;
    if (!axis)
      throw OrderError("order",
                       "order \"" + order + "\": unknown token \"" + token + "\" " + valid);
    for (Axis seen : axes)
      if (seen == *axis)
        throw OrderError("order",
                         "order \"" + order + "\": token \"" + token + "\" appears twice");
    axes.push_back(*axis);
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  return axes;
}

std::array<Axis, kNumAxes> ParallelConfig::resolved_order() const {
  std::vector<Axis> axes;
  if (compat == Compat::head) {
    // HEAD's dense order without its sixth axis (gtp_remat, folded into dp by Layout's grids).
    for (const std::string& t : head_order(false))
      for (Axis a : kAllAxes)
        if (t == axis_name(a)) axes.push_back(a);
  } else {
    axes = parse_order(order);
  }
  // Megatron appends the omitted axes in this sequence; their size is 1 (rule 10), so the
  // position changes no group, but it fixes the strides reported for them.
  for (Axis a : {Axis::tp, Axis::pp, Axis::dp, Axis::ep, Axis::cp}) {
    bool present = false;
    for (Axis b : axes) present = present || (a == b);
    if (!present) axes.push_back(a);
  }
  std::array<Axis, kNumAxes> out{};
  for (int i = 0; i < kNumAxes; ++i) out[i] = axes[i];
  return out;
}

namespace {
// W / (a*b*c), or 0 when a factor is not positive or the product overflows: callers on an
// invalid config get a harmless 0 instead of undefined behaviour.
std::int64_t quotient(std::int64_t w, std::int64_t a, std::int64_t b, std::int64_t c) noexcept {
  std::int64_t ab = 0, abc = 0;
  if (a < 1 || b < 1 || c < 1 || __builtin_mul_overflow(a, b, &ab) ||
      __builtin_mul_overflow(ab, c, &abc))
    return 0;
  return w / abc;
}
}  // namespace

std::int64_t ParallelConfig::dp() const noexcept {
  if (compat == Compat::head) {
    std::int64_t g = 0;
    if (gtp_remat < 1 || __builtin_mul_overflow(tp, gtp_remat, &g)) return 0;
    return quotient(layout_world_size(), g, pp, cp);
  }
  return quotient(world_size, tp, pp, cp);
}

std::int64_t ParallelConfig::expert_dp() const noexcept {
  if (compat == Compat::head) {
    std::int64_t g = 0;
    if (expert_gtp_remat < 1 || __builtin_mul_overflow(expert_tp(), expert_gtp_remat, &g))
      return 0;
    return quotient(layout_world_size(), g, ep, pp);
  }
  return quotient(world_size, expert_tp(), ep, pp);
}

const char* compat_name(Compat c) noexcept { return c == Compat::head ? "head" : "seed"; }

namespace {

constexpr std::array<const char*, 6> kHeadTokens = {"tp", "cp", "ep", "dp", "pp", "gtp_remat"};

// HEAD's order tokens as given (no injection): the seed's rules plus the gtp_remat token.
std::vector<std::string> parse_head_order(const std::string& order) {
  const std::string valid = "(valid: tp, cp, ep, dp, pp, gtp_remat)";
  if (order.empty())
    throw OrderError("order", "order is empty; expected tokens from tp, cp, ep, dp, pp, "
                              "gtp_remat joined by '-', e.g. \"tp-cp-ep-dp-pp\"");
  std::vector<std::string> out;
  std::size_t start = 0;
  for (int pos = 1;; ++pos) {
    const std::size_t dash = order.find('-', start);
    std::string token = order.substr(start, dash == std::string::npos ? std::string::npos
                                                                      : dash - start);
    if (token.empty())
      throw OrderError("order", "order \"" + order + "\": empty token at position " + str(pos));
    bool known = false;
    for (const char* t : kHeadTokens) known = known || token == t;
    if (!known)
      throw OrderError("order",
                       "order \"" + order + "\": unknown token \"" + token + "\" " + valid);
    for (const std::string& seen : out)
      if (seen == token)
        throw OrderError("order",
                         "order \"" + order + "\": token \"" + token + "\" appears twice");
    out.push_back(std::move(token));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  return out;
}

bool has_token(const std::vector<std::string>& tokens, std::string_view t) {
  for (const std::string& s : tokens)
    if (s == t) return true;
  return false;
}

void validate_head(const ParallelConfig& c);

}  // namespace

std::vector<std::string> ParallelConfig::head_order(bool expert) const {
  std::vector<std::string> tokens = parse_head_order(order);
  if (!has_token(tokens, "gtp_remat")) {
    // HEAD's _inject_gtp_remat_axis: after the anchor (ep on the expert grid, else tp), or
    // first when neither is there.
    const std::string anchor = expert && has_token(tokens, "ep") ? "ep" : "tp";
    std::size_t pos = 0;
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == anchor) pos = i + 1;
    tokens.insert(tokens.begin() + static_cast<std::ptrdiff_t>(pos), "gtp_remat");
  }
  // HEAD appends the omitted axes in its name_to_size sequence; they have size 1.
  for (const char* t : {"tp", "pp", "dp", "ep", "cp", "gtp_remat"})
    if (!has_token(tokens, t)) tokens.emplace_back(t);
  return tokens;
}

void ParallelConfig::validate() const {
  if (compat == Compat::head) return validate_head(*this);
  // The HEAD-only fields keep their defaults under seed.
  auto head_only = [&](const char* field, bool set, const std::string& value) {
    if (set)
      throw IncompatibleError(field, std::string(field) + " = " + value +
                                         " requires compat head (--compat head)");
  };
  head_only("gtp_remat", gtp_remat != 1, str(gtp_remat));
  head_only("expert_gtp_remat", expert_gtp_remat != 1, str(expert_gtp_remat));
  head_only("hybrid_context_parallel", hybrid_context_parallel, "true");
  head_only("all_gather_groups", all_gather_groups, "true");
  head_only("rank_offset", rank_offset != 0, str(rank_offset));
  head_only("local_world_size", local_world_size.has_value(),
            local_world_size ? str(*local_world_size) : "");
  const std::int64_t W = world_size;
  // Rule 1, and the addressable limit of rule 12 (checked first: every later rule
  // computes with W).
  if (W < 1)
    throw InvalidValueError("world_size", "world_size must be >= 1, got " + str(W));
  if (W > kMaxWorldSize)
    throw OverflowError("world_size", "world_size " + str(W) + " exceeds " +
                                          str(kMaxWorldSize) +
                                          ", the largest rank count MPI/NCCL can address");
  // Rule 2.
  require_positive("tp", tp);
  require_positive("pp", pp);
  require_positive("cp", cp);
  require_positive("ep", ep);
  require_positive("dist_opt_instances", dist_opt_instances);
  if (etp) require_positive("etp", *etp);
  if (vpp) require_positive("vpp", *vpp);
  // Rule 12 for the sizes no product bounds: the runtime reports vpp and the hcp level as
  // an int, like every rank.
  if (vpp && *vpp > kMaxWorldSize)
    throw OverflowError("vpp", "vpp = " + str(*vpp) + " exceeds " + str(kMaxWorldSize) +
                                   ", the largest virtual pipeline size");
  if (hcp.size() > static_cast<std::size_t>(kMaxWorldSize))
    throw OverflowError("hcp", "hcp has " + std::to_string(hcp.size()) + " levels, more than " +
                                   str(kMaxWorldSize));
  for (std::size_t i = 0; i < hcp.size(); ++i)
    if (hcp[i] < 1)
      throw InvalidValueError("hcp", "hcp[" + std::to_string(i) + "] must be >= 1, got " +
                                         str(hcp[i]));
  // Rule 3.
  const std::vector<Axis> tokens = parse_order(order);
  auto in_order = [&](Axis a) {
    for (Axis t : tokens)
      if (t == a) return true;
    return false;
  };
  // Rule 4 (with rule 12's checked product).
  const auto dense = checked_product({tp, pp, cp}, kMaxWorldSize);
  if (!dense)
    throw OverflowError("tp", "tp*pp*cp exceeds world_size " + str(W) + " (tp = " + str(tp) +
                                  ", pp = " + str(pp) + ", cp = " + str(cp) + ")");
  if (W % *dense != 0)
    throw DivisibilityError("world_size", "world_size " + str(W) +
                                              " is not divisible by tp*pp*cp = " + str(tp) +
                                              "*" + str(pp) + "*" + str(cp) + " = " +
                                              str(*dense));
  const std::int64_t dp_size = W / *dense;
  // The rules below run in Megatron-core's order (4, 5, 10 dense, 6, 10 expert, 7, 11, 8a,
  // 9, 8b), so that when several fail, the first reported is the one Megatron raises.
  const std::string dp_text = "dp = " + str(W) + "/(" + str(tp) + "*" + str(pp) + "*" +
                              str(cp) + ") = " + str(dp_size);
  // Rule 5.
  if (vpp && pp <= 1)
    throw IncompatibleError("vpp", "vpp = " + str(*vpp) + " requires pp > 1, got pp = " +
                                       str(pp));
  // Rule 10, dense grid: every axis the order omits has size 1. Megatron's generator looks
  // at the axes in the sequence tp, pp, dp, ep, cp (ep is 1 on the dense grid).
  auto omitted = [&](const char* token, const std::string& what) {
    throw OrderError("order", "order \"" + order + "\" omits \"" + token + "\", but " + what +
                                  "; add \"" + token + "\" to the order");
  };
  if (!in_order(Axis::tp) && tp != 1) omitted("tp", "tp = " + str(tp));
  if (!in_order(Axis::pp) && pp != 1) omitted("pp", "pp = " + str(pp));
  if (!in_order(Axis::dp) && dp_size != 1) omitted("dp", dp_text);
  if (!in_order(Axis::cp) && cp != 1) omitted("cp", "cp = " + str(cp));
  // Rule 6.
  const std::int64_t e = expert_tp();
  const std::string etp_note = etp ? "" : " (etp defaults to tp)";
  const auto expert = checked_product({e, ep, pp}, kMaxWorldSize);
  if (!expert)
    throw OverflowError("etp", "etp*ep*pp exceeds world_size " + str(W) + " (etp = " + str(e) +
                                   ", ep = " + str(ep) + ", pp = " + str(pp) + ")" + etp_note);
  if (W % *expert != 0)
    throw DivisibilityError("world_size", "world_size " + str(W) +
                                              " is not divisible by etp*ep*pp = " + str(e) +
                                              "*" + str(ep) + "*" + str(pp) + " = " +
                                              str(*expert) + etp_note);
  const std::int64_t edp_size = W / *expert;
  const std::string edp_text =
      "expert_dp = " + str(W) + "/(" + str(e) + "*" + str(ep) + "*" + str(pp) + ") = " +
      str(edp_size);
  // Rule 10, expert grid, same sequence (pp was checked above; cp is 1 here).
  if (!in_order(Axis::tp) && e != 1) omitted("tp", "etp = " + str(e));
  if (!in_order(Axis::dp) && edp_size != 1) omitted("dp", edp_text);
  if (!in_order(Axis::ep) && ep != 1) omitted("ep", "ep = " + str(ep));
  // Rule 7.
  if (tokens.back() != Axis::pp && pp != 1 && edp_size != dp_size)
    throw IncompatibleError("order", "order \"" + order + "\" does not end with pp and pp = " +
                                         str(pp) +
                                         ", so expert_dp must equal dp; got " + edp_text +
                                         ", " + dp_text);
  // Rule 11: the pp stride (product of the sizes of the axes before pp) must agree.
  if (pp != 1) {
    std::int64_t sd = 1, se = 1;
    std::string nd, ne;
    for (Axis a : tokens) {
      if (a == Axis::pp) break;
      const char* dn = axis_name(a).data();
      const char* en = a == Axis::tp ? "etp" : a == Axis::dp ? "expert_dp" : axis_name(a).data();
      std::int64_t ds = a == Axis::tp ? tp : a == Axis::cp ? cp : a == Axis::ep ? 1 : dp_size;
      std::int64_t es = a == Axis::tp ? e : a == Axis::cp ? 1 : a == Axis::ep ? ep : edp_size;
      if (a != Axis::ep) nd += (nd.empty() ? "" : "*") + std::string(dn, 2);
      if (a != Axis::cp) ne += (ne.empty() ? "" : "*") + std::string(en);
      sd *= ds;
      se *= es;
    }
    if (sd != se) {
      auto first = [&](std::int64_t s) {
        std::string t = "[";
        for (std::int64_t k = 0; k < pp && k < 4; ++k) t += (k ? "," : "") + str(k * s);
        return t + (pp > 4 ? ",...]" : "]");
      };
      auto label = [](std::int64_t s, const std::string& n) {
        return str(s) + (n.empty() ? "" : " = " + n);
      };
      throw IncompatibleError("order",
                              "order \"" + order +
                                  "\": pipeline groups differ between the dense and expert "
                                  "grids (pp stride " +
                                  label(sd, nd) + " vs " + label(se, ne) + "; first groups " +
                                  first(sd) + " vs " + first(se) + ")");
    }
  }
  // Rule 8a.
  const std::int64_t N = dist_opt_instances;
  if ((dp_size * cp) % N != 0)
    throw DivisibilityError("dist_opt_instances",
                            "dist_opt_instances = " + str(N) + " must divide dp*cp = " +
                                str(dp_size) + "*" + str(cp) + " = " + str(dp_size * cp));
  // Rule 9 (with rule 12's checked product).
  if (!hcp.empty()) {
    std::int64_t prod = 1;
    bool over = false;
    for (std::int64_t h : hcp) {
      if (prod > kMaxWorldSize / h) {
        over = true;
        break;
      }
      prod *= h;
    }
    if (over)
      throw IncompatibleError("hcp", "hcp sizes " + list_text(hcp) +
                                         " multiply to more than cp = " + str(cp));
    if (prod != cp)
      throw IncompatibleError("hcp", "hcp sizes " + list_text(hcp) + " multiply to " +
                                         str(prod) + ", but cp = " + str(cp));
  }
  // Rule 8b.
  if (edp_size % N != 0)
    throw DivisibilityError("dist_opt_instances",
                            "dist_opt_instances = " + str(N) + " must divide " + edp_text);
}

namespace {

// HEAD's initialize_model_parallel (and create_all_gather_groups) checks, in HEAD's order
// where it matters for the first reported error.
void validate_head(const ParallelConfig& c) {
  const std::int64_t W = c.world_size;
  if (W < 1) throw InvalidValueError("world_size", "world_size must be >= 1, got " + str(W));
  if (W > kMaxWorldSize)
    throw OverflowError("world_size", "world_size " + str(W) + " exceeds " +
                                          str(kMaxWorldSize) +
                                          ", the largest rank count MPI/NCCL can address");
  require_positive("tp", c.tp);
  require_positive("pp", c.pp);
  require_positive("cp", c.cp);
  require_positive("ep", c.ep);
  require_positive("dist_opt_instances", c.dist_opt_instances);
  require_positive("gtp_remat", c.gtp_remat);
  require_positive("expert_gtp_remat", c.expert_gtp_remat);
  if (c.etp) require_positive("etp", *c.etp);
  if (c.vpp) require_positive("vpp", *c.vpp);
  if (c.vpp && *c.vpp > kMaxWorldSize)
    throw OverflowError("vpp", "vpp = " + str(*c.vpp) + " exceeds " + str(kMaxWorldSize) +
                                   ", the largest virtual pipeline size");
  for (std::size_t i = 0; i < c.hcp.size(); ++i)
    if (c.hcp[i] < 1)
      throw InvalidValueError("hcp", "hcp[" + std::to_string(i) + "] must be >= 1, got " +
                                         str(c.hcp[i]));
  if (c.rank_offset < 0)
    throw InvalidValueError("rank_offset", "rank_offset must be >= 0, got " + str(c.rank_offset));
  if (c.local_world_size) {
    require_positive("local_world_size", *c.local_world_size);
    if (*c.local_world_size > W)
      throw InvalidValueError("local_world_size",
                              "local_world_size = " + str(*c.local_world_size) +
                                  " exceeds world_size " + str(W));
  }
  const std::int64_t L = c.layout_world_size();
  if (c.rank_offset > W - L)
    throw IncompatibleError("rank_offset", "rank_offset = " + str(c.rank_offset) + " + " +
                                               (c.local_world_size ? "local_world_size" : "world_size") +
                                               " = " + str(L) + " exceeds world_size " + str(W) +
                                               " (ranks must stay in [0, world_size))");
  const std::vector<std::string> tokens = parse_head_order(c.order);
  // HEAD finds "tp" inside "gtp_remat" and then fails its lookup of tp: an order without tp
  // is invalid even with tp = 1.
  if (!has_token(tokens, "tp"))
    throw OrderError("order", "order \"" + c.order +
                                  "\" has no \"tp\"; Megatron-core HEAD requires tp in the "
                                  "order (even with tp = 1); add \"tp\" to the order");
  const std::int64_t N = c.dist_opt_instances;
  if ((c.gtp_remat > 1 || c.expert_gtp_remat > 1) && N > 1)
    throw IncompatibleError("gtp_remat", "gtp_remat = " + str(c.gtp_remat) +
                                             " / expert_gtp_remat = " + str(c.expert_gtp_remat) +
                                             " with dist_opt_instances = " + str(N) +
                                             " is not supported by Megatron-core HEAD");
  const auto dense = checked_product({c.tp, c.pp, c.cp, c.gtp_remat}, kMaxWorldSize);
  if (!dense || L % *dense != 0)
    throw DivisibilityError("world_size",
                            "world_size " + str(L) + " is not divisible by tp*pp*cp*gtp_remat = " +
                                str(c.tp) + "*" + str(c.pp) + "*" + str(c.cp) + "*" +
                                str(c.gtp_remat) + (dense ? " = " + str(*dense) : ""));
  const std::int64_t dp = L / *dense;
  if (c.vpp && c.pp <= 1)
    throw IncompatibleError("vpp", "vpp = " + str(*c.vpp) + " requires pp > 1, got pp = " +
                                       str(c.pp));
  auto omitted = [&](const char* token, const std::string& what) {
    throw OrderError("order", "order \"" + c.order + "\" omits \"" + token + "\", but " + what +
                                  "; add \"" + token + "\" to the order");
  };
  if (!has_token(tokens, "pp") && c.pp != 1) omitted("pp", "pp = " + str(c.pp));
  if (!has_token(tokens, "dp") && dp != 1) omitted("dp", "dp = " + str(dp));
  if (!has_token(tokens, "cp") && c.cp != 1) omitted("cp", "cp = " + str(c.cp));
  const std::int64_t e = c.expert_tp();
  const auto expert = checked_product({e, c.ep, c.pp, c.expert_gtp_remat}, kMaxWorldSize);
  if (!expert || L % *expert != 0)
    throw DivisibilityError("world_size", "world_size " + str(L) +
                                              " is not divisible by etp*ep*pp*expert_gtp_remat = " +
                                              str(e) + "*" + str(c.ep) + "*" + str(c.pp) + "*" +
                                              str(c.expert_gtp_remat) +
                                              (expert ? " = " + str(*expert) : ""));
  const std::int64_t edp = L / *expert;
  if (!has_token(tokens, "dp") && edp != 1) omitted("dp", "expert_dp = " + str(edp));
  if (!has_token(tokens, "ep") && c.ep != 1) omitted("ep", "ep = " + str(c.ep));
  if (tokens.back() != "pp" && c.pp != 1 && edp != dp)
    throw IncompatibleError("order", "order \"" + c.order + "\" does not end with pp and pp = " +
                                         str(c.pp) + ", so expert_dp must equal dp; got expert_dp = " +
                                         str(edp) + ", dp = " + str(dp));
  if (c.pp != 1) {
    // The pp groups agree exactly when the pp strides of the two grids agree.
    auto pp_stride = [&](bool is_expert) {
      std::int64_t s = 1;
      for (const std::string& t : c.head_order(is_expert)) {
        if (t == "pp") break;
        if (t == "tp") s *= is_expert ? e : c.tp;
        if (t == "cp") s *= is_expert ? 1 : c.cp;
        if (t == "ep") s *= is_expert ? c.ep : 1;
        if (t == "dp") s *= is_expert ? edp : dp;
        if (t == "gtp_remat") s *= is_expert ? c.expert_gtp_remat : c.gtp_remat;
      }
      return s;
    };
    const std::int64_t sd = pp_stride(false), se = pp_stride(true);
    if (sd != se)
      throw IncompatibleError("order", "order \"" + c.order +
                                           "\": pipeline groups differ between the dense and "
                                           "expert grids (pp stride " +
                                           str(sd) + " vs " + str(se) + ")");
  }
  if ((dp * c.cp) % N != 0)
    throw DivisibilityError("dist_opt_instances",
                            "dist_opt_instances = " + str(N) + " must divide dp*cp = " +
                                str(dp) + "*" + str(c.cp) + " = " + str(dp * c.cp));
  if (c.hybrid_context_parallel && (dp * c.cp) % 2 != 0)
    throw IncompatibleError("hybrid_context_parallel",
                            "hybrid_context_parallel requires an even dp*cp (the dp_cp group "
                            "size), got " + str(dp) + "*" + str(c.cp) + " = " + str(dp * c.cp));
  if (!c.hcp.empty()) {
    std::int64_t prod = 1;
    for (std::int64_t h : c.hcp) {
      if (prod > kMaxWorldSize / h) {
        prod = -1;
        break;
      }
      prod *= h;
    }
    if (prod != c.cp)
      throw IncompatibleError("hcp", "hcp sizes " + list_text(c.hcp) + " multiply to " +
                                         (prod < 0 ? std::string("more than cp") : str(prod)) +
                                         ", but cp = " + str(c.cp));
  }
  if (edp % N != 0)
    throw DivisibilityError("dist_opt_instances", "dist_opt_instances = " + str(N) +
                                                      " must divide expert_dp = " + str(edp));
  if (c.all_gather_groups) {
    // create_all_gather_groups rebuilds the grids from the group sizes with dp taken as
    // dp*gtp_remat and the gtp_remat axis added again: L*gtp_remat ranks from rank 0.
    auto check_ag = [&](const char* which, std::int64_t g) {
      const auto span = checked_product({L, g}, kMaxWorldSize);
      if (!span || *span > W)
        throw IncompatibleError(
            "all_gather_groups",
            std::string("all_gather_groups: HEAD's create_all_gather_groups builds its ") + which +
                " grid over L*" + (which[0] == 'd' ? "gtp_remat" : "expert_gtp_remat") + " = " +
                str(L) + "*" + str(g) + " ranks, more than world_size " + str(W));
    };
    check_ag("dense", c.gtp_remat);
    if (c.ep > 1) check_ag("expert", c.expert_gtp_remat);
  }
}

}  // namespace

std::string ParallelConfig::canonical() const {
  std::ostringstream s;
  s << "world_size=" << world_size << " tp=" << tp << " pp=" << pp << " cp=" << cp
    << " ep=" << ep << " etp=" << (etp ? str(*etp) : "none") << " hcp=" << list_text(hcp)
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
