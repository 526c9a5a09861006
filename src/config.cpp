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
  std::vector<Axis> axes = parse_order(order);
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

std::int64_t ParallelConfig::dp() const noexcept { return quotient(world_size, tp, pp, cp); }

std::int64_t ParallelConfig::expert_dp() const noexcept {
  return quotient(world_size, expert_tp(), ep, pp);
}

void ParallelConfig::validate() const {
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

std::string ParallelConfig::canonical() const {
  std::ostringstream s;
  s << "world_size=" << world_size << " tp=" << tp << " pp=" << pp << " cp=" << cp
    << " ep=" << ep << " etp=" << (etp ? str(*etp) : "none") << " hcp=" << list_text(hcp)
    << " dist_opt_instances=" << dist_opt_instances << " vpp=" << (vpp ? str(*vpp) : "none")
    << " order=" << order;
  return s.str();
}

}  // namespace commgrid
