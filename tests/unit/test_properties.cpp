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
  if (rng() % 3 == 0) std::rotate(tokens.begin(), std::find(tokens.begin(), tokens.end(), "pp") + 1,
                                    tokens.end());  // pp last, the common case
  c.order.clear();
  for (const auto& t : tokens) c.order += (c.order.empty() ? "" : "-") + t;
  return c;
}

std::vector<ParallelConfig> valid_configs(std::size_t n) {
  std::mt19937 rng(20261129);
  std::vector<ParallelConfig> out;
  while (out.size() < n) {
    ParallelConfig c = random_config(rng);
    try {
      c.validate();
      out.push_back(c);
    } catch (const ConfigError&) {
    }
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
    static const std::vector<ParallelConfig> c = valid_configs(300);
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
          ASSERT_TRUE(std::equal(ref->members.begin(), ref->members.end(), want.begin(), want.end()))
              << "rank " << r;
          std::vector<Rank> sorted(want.begin(), want.end());
          std::sort(sorted.begin(), sorted.end());
          ASSERT_EQ(ref->comm_rank,
                    std::lower_bound(sorted.begin(), sorted.end(), static_cast<Rank>(r)) - sorted.begin());
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

}  // namespace
}  // namespace commgrid
