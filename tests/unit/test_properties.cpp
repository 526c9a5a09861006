// Property tests over hundreds of random valid configs: every kind partitions the ranks it
// covers, has the catalogue's sizes, and the closed-form query equals the enumeration.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {
namespace {

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> d;
  for (std::int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

template <class T>
T pick(std::mt19937& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
}

// A random config that may or may not be valid (rules 7, 10 and 11 reject some orders).
ParallelConfig random_config(std::mt19937& rng) {
  const std::vector<std::int64_t> small = {1, 1, 2, 2, 3, 4};
  ParallelConfig c;
  c.tp = pick(rng, small);
  c.pp = pick(rng, small);
  c.cp = pick(rng, small);
  const std::int64_t dp = pick(rng, small);
  c.world_size = c.tp * c.pp * c.cp * dp;
  // Expert grid: etp * ep divides W / pp.
  const std::int64_t per_stage = c.world_size / c.pp;
  const std::int64_t etp = pick(rng, divisors(per_stage));
  if (etp != c.tp || rng() % 2) c.etp = etp;
  c.ep = pick(rng, divisors(per_stage / etp));
  const std::int64_t edp = per_stage / (etp * c.ep);
  c.dist_opt_instances = pick(rng, divisors(std::gcd(dp * c.cp, edp)));
  if (c.cp > 1 && rng() % 2) {
    // A random factorization of cp.
    std::int64_t rest = c.cp;
    while (rest > 1) {
      std::vector<std::int64_t> d = divisors(rest);
      const std::int64_t h = pick(rng, d);
      c.hcp.push_back(h);
      rest /= h;
    }
    if (c.hcp.empty()) c.hcp.push_back(1);
  }
  if (c.pp > 1 && rng() % 3 == 0) c.vpp = pick(rng, small);
  std::vector<std::string> tokens = {"tp", "cp", "ep", "dp", "pp"};
  std::shuffle(tokens.begin(), tokens.end(), rng);
  if (rng() % 3 == 0)
    std::rotate(tokens.begin(), std::find(tokens.begin(), tokens.end(), "pp") + 1,
                tokens.end());  // pp last, the common case
  c.order.clear();
  for (const auto& t : tokens) c.order += (c.order.empty() ? "" : "-") + t;
  return c;
}

// n valid configs from a random generator (which may also make invalid ones), seeded.
std::vector<ParallelConfig> valid_configs(std::size_t n, ParallelConfig (*make)(std::mt19937&),
                                          std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<ParallelConfig> out;
  while (out.size() < n) {
    ParallelConfig c = make(rng);
    try {
      c.validate();
      out.push_back(c);
    } catch (const ConfigError&) {}
  }
  return out;
}

// Expected group size of each kind (spec §7).
std::int64_t expected_size(const Layout& l, GroupKind k, int level) {
  const ParallelConfig& c = l.config();
  const std::int64_t N = c.dist_opt_instances, etp = c.expert_tp();
  switch (k) {
    case GroupKind::tp: return c.tp;
    case GroupKind::cp: return c.cp;
    case GroupKind::dp: return l.dp();
    case GroupKind::pp: return c.pp;
    case GroupKind::mp: return c.tp * c.pp;
    case GroupKind::dp_cp: return l.dp() * c.cp;
    case GroupKind::tp_cp: return c.tp * c.cp;
    case GroupKind::tp_dp: return c.tp * l.dp();
    case GroupKind::tp_dp_cp: return c.tp * l.dp() * c.cp;
    case GroupKind::ep: return c.ep;
    case GroupKind::expt_tp: return etp;
    case GroupKind::tp_ep: return etp * c.ep;
    case GroupKind::tp_ep_pp: return etp * c.ep * c.pp;
    case GroupKind::expt_dp: return l.expert_dp();
    case GroupKind::embd: return c.pp == 1 ? 1 : 2;
    case GroupKind::pos_embd: return 1;
    case GroupKind::hcp: return c.hcp[static_cast<std::size_t>(level)];
    case GroupKind::intra_dp_cp: return l.dp() * c.cp / N;
    case GroupKind::intra_expt_dp: return l.expert_dp() / N;
    case GroupKind::inter_dist_opt: return N;
    case GroupKind::intra_dist_opt: return c.world_size / N;
    default: break;  // the HEAD-only kinds: never in these (seed) layouts
  }
  return -1;
}

class Properties : public ::testing::Test {
 protected:
  static const std::vector<ParallelConfig>& configs() {
    static const std::vector<ParallelConfig> c = valid_configs(300, random_config, 20261129);
    return c;
  }
};

TEST_F(Properties, ConfigsAreVaried) {
  std::set<std::string> orders;
  std::size_t with_hcp = 0, with_n = 0, moe = 0;
  for (const auto& c : configs()) {
    orders.insert(c.order);
    with_hcp += !c.hcp.empty();
    with_n += c.dist_opt_instances > 1;
    moe += c.ep > 1;
  }
  EXPECT_GT(orders.size(), 30u);
  EXPECT_GT(with_hcp, 20u);
  EXPECT_GT(with_n, 20u);
  EXPECT_GT(moe, 50u);
}

TEST_F(Properties, EveryKindPartitionsAndQueriesMatchEnumeration) {
  for (const ParallelConfig& c : configs()) {
    SCOPED_TRACE(c.canonical());
    const Layout l(c);
    const auto W = static_cast<std::size_t>(c.world_size);
    for (GroupKind k : l.kinds()) {
      for (int level = 0; level < l.levels(k); ++level) {
        SCOPED_TRACE(std::string(kind_name(k)) + " level " + std::to_string(level));
        const GroupList groups = l.groups(k, level);
        ASSERT_EQ(static_cast<std::int64_t>(groups.size()), l.num_groups(k, level));
        std::vector<std::int64_t> owner(W, -1), pos(W, -1);
        for (std::size_t g = 0; g < groups.size(); ++g) {
          ASSERT_EQ(static_cast<std::int64_t>(groups[g].size()), expected_size(l, k, level));
          for (std::size_t i = 0; i < groups[g].size(); ++i) {
            const Rank r = groups[g][i];
            ASSERT_TRUE(r >= 0 && r < c.world_size);
            ASSERT_EQ(owner[static_cast<std::size_t>(r)], -1) << "rank " << r << " in two groups";
            owner[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(g);
            pos[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(i);
          }
          if (k != GroupKind::intra_dist_opt) {
            ASSERT_TRUE(std::is_sorted(groups[g].begin(), groups[g].end()));
          }
        }
        const bool covers_all = k != GroupKind::embd && k != GroupKind::pos_embd;
        for (std::size_t r = 0; r < W; ++r) {
          const auto ref = l.group_of(k, static_cast<Rank>(r), level);
          if (owner[r] < 0) {
            ASSERT_FALSE(covers_all) << "rank " << r << " in no group";
            ASSERT_FALSE(ref.has_value()) << "rank " << r;
            continue;
          }
          ASSERT_TRUE(ref.has_value()) << "rank " << r;
          const auto want = groups[static_cast<std::size_t>(owner[r])];
          ASSERT_EQ(ref->index, owner[r]) << "rank " << r;
          ASSERT_EQ(ref->position, pos[r]) << "rank " << r;
          ASSERT_TRUE(
              std::equal(ref->members.begin(), ref->members.end(), want.begin(), want.end()))
              << "rank " << r;
          std::vector<Rank> sorted(want.begin(), want.end());
          std::sort(sorted.begin(), sorted.end());
          ASSERT_EQ(ref->comm_rank,
                    std::lower_bound(sorted.begin(), sorted.end(), static_cast<Rank>(r)) -
                        sorted.begin());
        }
      }
    }
  }
}

TEST_F(Properties, StructuralRelations) {
  for (const ParallelConfig& c : configs()) {
    SCOPED_TRACE(c.canonical());
    const Layout l(c);
    for (Rank r = 0; r < c.world_size; ++r) {
      const auto tp = l.group_of(GroupKind::tp, r)->members;
      const auto dp = l.group_of(GroupKind::dp, r)->members;
      const auto pp = l.group_of(GroupKind::pp, r)->members;
      // A tp group and a dp group meet in exactly this rank.
      std::vector<Rank> meet;
      std::set_intersection(tp.begin(), tp.end(), dp.begin(), dp.end(), std::back_inserter(meet));
      ASSERT_EQ(meet, std::vector<Rank>{r});
      // mp is tp x pp: the union of the tp groups of r's pipeline peers.
      std::vector<Rank> mp;
      for (Rank s : pp) {
        const std::vector<Rank> peers = l.group_of(GroupKind::tp, s)->members;
        mp.insert(mp.end(), peers.begin(), peers.end());
      }
      std::sort(mp.begin(), mp.end());
      ASSERT_EQ(l.group_of(GroupKind::mp, r)->members, mp);
      // embd holds the first and last stage; pos_embd the first.
      const auto embd = l.group_of(GroupKind::embd, r);
      const auto pos = l.group_of(GroupKind::pos_embd, r);
      const std::int64_t stage = l.coordinates(r).pp;
      ASSERT_EQ(embd.has_value(), stage == 0 || stage == c.pp - 1);
      ASSERT_EQ(pos.has_value(), stage == 0);
      if (embd) {
        std::vector<Rank> want = {pp.front()};
        if (c.pp > 1) want.push_back(pp.back());
        ASSERT_EQ(embd->members, want);
      }
      // The dense and expert pipeline groups coincide (rule 11).
      ASSERT_EQ(l.expert_grid().group_of({Axis::pp}, r), pp);
      // The dense and expert pipeline stage agree.
      ASSERT_EQ(l.expert_grid().coordinate(r, Axis::pp), stage);
    }
  }
}

// ---- compat head: HEAD's six-axis grids, rank offsets, hybrid and all-gather kinds ----

// A random HEAD config (may be invalid): the seed's random config plus HEAD's options.
ParallelConfig random_head_config(std::mt19937& rng) {
  ParallelConfig c = random_config(rng);
  c.compat = Compat::head;
  const std::vector<std::int64_t> gtp = {1, 1, 2, 3};
  c.gtp_remat = pick(rng, gtp);
  c.expert_gtp_remat = pick(rng, gtp);
  const std::int64_t L = c.world_size * c.gtp_remat;
  if (rng() % 3 == 0) {
    // Laid out inside a larger world, at an offset.
    c.local_world_size = L;
    c.world_size = L * 2;
    c.rank_offset = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(L + 1));
  } else {
    c.world_size = L;
  }
  c.hybrid_context_parallel = rng() % 3 == 0;
  c.all_gather_groups = rng() % 4 == 0;
  if (c.gtp_remat > 1 || c.expert_gtp_remat > 1) c.dist_opt_instances = 1;
  // Sometimes the gtp_remat token is in the order, at a random place.
  if (rng() % 3 == 0) {
    const std::size_t dashes =
        static_cast<std::size_t>(std::count(c.order.begin(), c.order.end(), '-'));
    std::size_t at = rng() % (dashes + 2), seen = 0, pos = 0;
    for (; pos < c.order.size() && seen < at; ++pos) seen += c.order[pos] == '-';
    if (at == 0) c.order = "gtp_remat-" + c.order;
    else if (seen < at) c.order += "-gtp_remat";
    else c.order.insert(pos, "gtp_remat-");
  }
  return c;
}

// An independent reference for HEAD's grid kinds: rank by rank, coordinates by division
// over the grid's token order, groups keyed by the unmasked coordinates (the first token
// fastest), members by the masked ones, plus the offset. Written from the README of the
// HEAD vectors, not from the library's odometer.
std::vector<std::vector<Rank>> reference_groups(const std::vector<std::string>& order,
                                                const std::vector<std::int64_t>& sizes,
                                                const std::set<std::string>& mask,
                                                std::int64_t offset) {
  std::int64_t world = 1, groups = 1, members = 1;
  for (std::size_t i = 0; i < order.size(); ++i) {
    world *= sizes[i];
    (mask.count(order[i]) ? members : groups) *= sizes[i];
  }
  std::vector<std::vector<Rank>> out(static_cast<std::size_t>(groups),
                                     std::vector<Rank>(static_cast<std::size_t>(members)));
  for (std::int64_t r = 0; r < world; ++r) {
    std::int64_t q = 0, k = 0, qr = 1, kr = 1, rest = r;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const std::int64_t c = rest % sizes[i];
      rest /= sizes[i];
      if (mask.count(order[i])) {
        k += c * kr;
        kr *= sizes[i];
      } else {
        q += c * qr;
        qr *= sizes[i];
      }
    }
    out[static_cast<std::size_t>(q)][static_cast<std::size_t>(k)] = offset + r;
  }
  return out;
}

std::set<std::string> tokens(const std::string& s) {
  std::set<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t dash = s.find('-', start);
    out.insert(s.substr(start, dash == std::string::npos ? dash : dash - start));
    if (dash == std::string::npos) return out;
    start = dash + 1;
  }
}

// The grid kinds of HEAD (the vectors' README): kind, expert grid?, token mask.
struct HeadGridKind {
  GroupKind kind;
  bool expert;
  const char* mask;
};
constexpr HeadGridKind kHeadGridKinds[] = {
    {GroupKind::dp, false, "dp"},
    {GroupKind::dp_cp, false, "dp-cp"},
    {GroupKind::cp, false, "cp"},
    {GroupKind::mp, false, "tp-gtp_remat-pp"},
    {GroupKind::tp, false, "tp"},
    {GroupKind::pp, false, "pp"},
    {GroupKind::tp_dp_cp, false, "tp-gtp_remat-dp-cp"},
    {GroupKind::tp_dp, false, "tp-gtp_remat-dp"},
    {GroupKind::tp_cp, false, "tp-cp"},
    {GroupKind::ep, true, "ep"},
    {GroupKind::expt_tp, true, "tp"},
    {GroupKind::tp_ep, true, "tp-ep"},
    {GroupKind::tp_ep_pp, true, "tp-ep-pp"},
    {GroupKind::expt_dp, true, "dp"},
    {GroupKind::gtp_remat, false, "gtp_remat"},
    {GroupKind::expt_gtp_remat, true, "gtp_remat"},
    {GroupKind::dp_gtp_remat, false, "gtp_remat-dp"},
    {GroupKind::dp_cp_gtp_remat, false, "gtp_remat-dp-cp"},
    {GroupKind::expt_dp_gtp_remat, true, "gtp_remat-dp"},
    {GroupKind::tp_ep_pp_with_egtp_remat, true, "tp-ep-gtp_remat-pp"},
};

std::vector<std::int64_t> head_sizes(const ParallelConfig& c, const std::vector<std::string>& order,
                                     bool expert, std::int64_t dp_factor = 1) {
  std::vector<std::int64_t> out;
  for (const std::string& t : order) {
    if (t == "tp") out.push_back(expert ? c.expert_tp() : c.tp);
    else if (t == "cp") out.push_back(expert ? 1 : c.cp);
    else if (t == "ep") out.push_back(expert ? c.ep : 1);
    else if (t == "dp") out.push_back((expert ? c.expert_dp() : c.dp()) * dp_factor);
    else if (t == "pp") out.push_back(c.pp);
    else out.push_back(expert ? c.expert_gtp_remat : c.gtp_remat);
  }
  return out;
}

class HeadProperties : public ::testing::Test {
 protected:
  static const std::vector<ParallelConfig>& configs() {
    static const std::vector<ParallelConfig> c = valid_configs(200, random_head_config, 20261201);
    return c;
  }
};

TEST_F(HeadProperties, ConfigsAreVaried) {
  std::size_t gtp = 0, egtp = 0, offset = 0, hybrid = 0, ag = 0, token = 0;
  for (const auto& c : configs()) {
    gtp += c.gtp_remat > 1;
    egtp += c.expert_gtp_remat > 1;
    offset += c.rank_offset > 0;
    token += c.order.find("gtp_remat") != std::string::npos;
    const Layout l(c);
    hybrid += l.has_kind(GroupKind::hybrid_dp_cp);
    ag += l.has_kind(GroupKind::dp_cp_ag);
  }
  EXPECT_GT(gtp, 30u);
  EXPECT_GT(egtp, 30u);
  EXPECT_GT(offset, 20u);
  EXPECT_GT(hybrid, 10u);
  EXPECT_GT(ag, 10u);
  EXPECT_GT(token, 20u);
}

TEST_F(HeadProperties, GridKindsMatchAReferenceGenerator) {
  for (const ParallelConfig& c : configs()) {
    SCOPED_TRACE(c.canonical());
    const Layout l(c);
    for (const HeadGridKind& g : kHeadGridKinds) {
      const std::vector<std::string> order = c.head_order(g.expert);
      const auto want =
          reference_groups(order, head_sizes(c, order, g.expert), tokens(g.mask), c.rank_offset);
      ASSERT_EQ(l.groups(g.kind).to_vectors(), want) << kind_name(g.kind);
    }
    if (l.has_kind(GroupKind::dp_cp_ag)) {
      // create_all_gather_groups: HEAD's default order, rank 0, dp taken as dp*gtp_remat.
      ParallelConfig d;
      d.compat = Compat::head;
      const std::vector<std::string> dense = d.head_order(false), expert = d.head_order(true);
      EXPECT_EQ(
          l.groups(GroupKind::dp_cp_ag).to_vectors(),
          reference_groups(dense, head_sizes(c, dense, false, c.gtp_remat), tokens("dp-cp"), 0));
      if (c.ep > 1) {
        EXPECT_EQ(l.groups(GroupKind::expt_dp_ag).to_vectors(),
                  reference_groups(expert, head_sizes(c, expert, true, c.expert_gtp_remat),
                                   tokens("dp"), 0));
      }
    }
  }
}

TEST_F(HeadProperties, DerivedKindsFollowTheirParents) {
  for (const ParallelConfig& c : configs()) {
    SCOPED_TRACE(c.canonical());
    const Layout l(c);
    const GroupList dp_cp = l.groups(GroupKind::dp_cp);
    // intra_dist_opt: one ascending group of every laid-out rank when a gtp size is > 1,
    // else runs of edp / N consecutive tp_ep_pp groups.
    const GroupList intra = l.groups(GroupKind::intra_dist_opt);
    if (c.gtp_remat > 1 || c.expert_gtp_remat > 1) {
      ASSERT_EQ(intra.size(), 1u);
      std::vector<Rank> all(static_cast<std::size_t>(c.layout_world_size()));
      std::iota(all.begin(), all.end(), c.rank_offset);
      EXPECT_EQ(intra.to_vectors()[0], all);
    } else {
      const GroupList tep = l.groups(GroupKind::tp_ep_pp);
      std::vector<Rank> concat(tep.members().begin(), tep.members().end());
      EXPECT_EQ(std::vector<Rank>(intra.members().begin(), intra.members().end()), concat);
      EXPECT_EQ(static_cast<std::int64_t>(intra.size()), c.dist_opt_instances);
    }
    // hybrid_dp_cp level n: consecutive slices of n of each dp_cp group, the last shorter.
    for (int level = 0;
         l.has_kind(GroupKind::hybrid_dp_cp) && level < l.levels(GroupKind::hybrid_dp_cp);
         ++level) {
      const std::int64_t n = l.hybrid_sizes()[static_cast<std::size_t>(level)];
      std::vector<std::vector<Rank>> want;
      for (std::size_t q = 0; q < dp_cp.size(); ++q)
        for (std::size_t s = 0; s < dp_cp[q].size(); s += static_cast<std::size_t>(n))
          want.emplace_back(
              dp_cp[q].begin() + static_cast<std::ptrdiff_t>(s),
              dp_cp[q].begin() + static_cast<std::ptrdiff_t>(
                                     std::min(s + static_cast<std::size_t>(n), dp_cp[q].size())));
      EXPECT_EQ(l.groups(GroupKind::hybrid_dp_cp, level).to_vectors(), want) << "n " << n;
    }
  }
}

TEST_F(HeadProperties, EveryKindPartitionsQueriesAndPiecesMatchEnumeration) {
  for (const ParallelConfig& c : configs()) {
    SCOPED_TRACE(c.canonical());
    const Layout l(c);
    const auto W = static_cast<std::size_t>(c.world_size);
    for (GroupKind k : l.kinds()) {
      for (int level = 0; level < l.levels(k); ++level) {
        SCOPED_TRACE(l.level_name(k, level));
        const GroupList groups = l.groups(k, level);
        ASSERT_EQ(static_cast<std::int64_t>(groups.size()), l.num_groups(k, level));
        ASSERT_EQ(static_cast<std::int64_t>(groups.members().size()), l.num_members(k, level));
        const auto size = l.group_size(k, level);
        std::vector<std::int64_t> owner(W, -1), pos(W, -1);
        for (std::size_t g = 0; g < groups.size(); ++g) {
          if (size) { ASSERT_EQ(static_cast<std::int64_t>(groups[g].size()), *size); }
          for (std::size_t i = 0; i < groups[g].size(); ++i) {
            const Rank r = groups[g][i];
            ASSERT_TRUE(r >= 0 && r < c.world_size);
            ASSERT_EQ(owner[static_cast<std::size_t>(r)], -1) << "rank " << r << " in two groups";
            owner[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(g);
            pos[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(i);
          }
        }
        for (std::size_t r = 0; r < W; ++r) {
          const auto ref = l.group_of(k, static_cast<Rank>(r), level);
          const auto index = l.group_index(k, static_cast<Rank>(r), level);
          if (owner[r] < 0) {
            ASSERT_FALSE(ref.has_value()) << "rank " << r;
            ASSERT_FALSE(index.has_value()) << "rank " << r;
            continue;
          }
          ASSERT_TRUE(ref.has_value()) << "rank " << r;
          ASSERT_EQ(ref->index, owner[r]) << "rank " << r;
          ASSERT_EQ(index, std::optional<std::int64_t>(owner[r])) << "rank " << r;
          ASSERT_EQ(ref->position, pos[r]) << "rank " << r;
          const auto want = groups[static_cast<std::size_t>(owner[r])];
          ASSERT_TRUE(
              std::equal(ref->members.begin(), ref->members.end(), want.begin(), want.end()))
              << "rank " << r;
        }
        // Pieces of 5 entries, starting anywhere inside groups, equal the whole list.
        const auto all = groups.members();
        std::vector<Rank> got(all.size());
        for (std::size_t i = 0; i < all.size(); i += 5) {
          const std::size_t n = std::min<std::size_t>(5, all.size() - i);
          l.members(k, level, static_cast<std::int64_t>(i), std::span<Rank>(got.data() + i, n));
        }
        ASSERT_TRUE(std::equal(got.begin(), got.end(), all.begin()));
      }
    }
  }
}

}  // namespace
}  // namespace commgrid
