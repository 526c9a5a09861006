#include "head_layout.hpp"

#include <algorithm>

#include "commgrid/error.hpp"

namespace commgrid::detail {

GroupList ordered_grid_groups(std::span<const std::string> order,
                              std::span<const std::int64_t> sizes, std::int64_t offset,
                              std::span<const std::string> mask) {
  struct Dim {
    std::int64_t size, stride;
  };
  std::vector<Dim> in, out;
  std::int64_t stride = 1;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const bool masked = std::find(mask.begin(), mask.end(), order[i]) != mask.end();
    (masked ? in : out).push_back({sizes[i], stride});
    stride *= sizes[i];
  }
  std::int64_t g = 1, n = 1;
  for (const Dim& d : in) g *= d.size;
  for (const Dim& d : out) n *= d.size;
  GroupList list;
  const std::span<Rank> buf =
      list.assign_uniform(static_cast<std::size_t>(n), static_cast<std::size_t>(g));
  // Decomposes an index over dims (first fastest) into a rank offset.
  auto place = [](const std::vector<Dim>& dims, std::int64_t index) {
    std::int64_t r = 0;
    for (const Dim& d : dims) {
      r += (index % d.size) * d.stride;
      index /= d.size;
    }
    return r;
  };
  std::size_t e = 0;
  for (std::int64_t q = 0; q < n; ++q) {
    const std::int64_t base = offset + place(out, q);
    for (std::int64_t k = 0; k < g; ++k) buf[e++] = base + place(in, k);
  }
  return list;
}

namespace {

std::vector<std::string> split_tokens(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t dash = s.find('-', start);
    out.push_back(s.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) return out;
    start = dash + 1;
  }
}

struct Grid {
  std::vector<std::string> order;
  std::vector<std::int64_t> sizes;
  std::int64_t offset = 0;
  [[nodiscard]] GroupList groups(const std::string& tokens) const {
    const std::vector<std::string> mask = split_tokens(tokens);
    return ordered_grid_groups(order, sizes, offset, mask);
  }
};

Grid make_grid(std::vector<std::string> order, std::int64_t tp, std::int64_t cp, std::int64_t ep,
               std::int64_t dp, std::int64_t pp, std::int64_t gtp, std::int64_t offset) {
  Grid g;
  g.offset = offset;
  for (const std::string& t : order)
    g.sizes.push_back(t == "tp" ? tp : t == "cp" ? cp : t == "ep" ? ep : t == "dp" ? dp
                      : t == "pp" ? pp : gtp);
  g.order = std::move(order);
  return g;
}

// HEAD's default order with gtp_remat injected (create_all_gather_groups ignores --order).
std::vector<std::string> default_order(bool expert) {
  if (expert) return {"tp", "cp", "ep", "gtp_remat", "dp", "pp"};
  return {"tp", "gtp_remat", "cp", "ep", "dp", "pp"};
}

// The level-`level` hierarchical split of every group of `parents` (sizes multiply to
// each parent's size).
GroupList split_all(const GroupList& parents, std::span<const std::int64_t> sizes, int level) {
  GroupList out;
  for (std::size_t i = 0; i < parents.size(); ++i)
    hierarchical_split(parents[i], sizes, level, out);
  return out;
}

HeadLevel make_level(GroupList groups, std::int64_t world_size) {
  HeadLevel l;
  l.group_of_rank.assign(static_cast<std::size_t>(world_size), -1);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto g = groups[i];
    if (i == 0) l.uniform_size = static_cast<std::int64_t>(g.size());
    if (l.uniform_size && *l.uniform_size != static_cast<std::int64_t>(g.size()))
      l.uniform_size.reset();
    l.num_members += static_cast<std::int64_t>(g.size());
    for (Rank r : g) {
      COMMGRID_ENFORCE(r >= 0 && r < world_size,
                       "head layout: rank " + std::to_string(r) + " outside the world");
      l.group_of_rank[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(i);
    }
  }
  if (groups.empty()) l.uniform_size = 0;
  l.groups = std::move(groups);
  return l;
}

}  // namespace

std::shared_ptr<const HeadGroups> build_head_groups(
    const ParallelConfig& c,
    const std::function<std::vector<Rank>(GroupKind, std::span<const Rank>)>& embedding) {
  auto h = std::make_shared<HeadGroups>();
  const std::int64_t W = c.world_size, L = c.layout_world_size(), R = c.rank_offset;
  const std::int64_t N = c.dist_opt_instances, dp = c.dp(), edp = c.expert_dp();
  const Grid dense = make_grid(c.head_order(false), c.tp, c.cp, 1, dp, c.pp, c.gtp_remat, R);
  const Grid expert =
      make_grid(c.head_order(true), c.expert_tp(), 1, c.ep, edp, c.pp, c.expert_gtp_remat, R);
  h->dense_order = dense.order;
  h->dense_sizes = dense.sizes;
  h->expert_order = expert.order;
  h->expert_sizes = expert.sizes;
  auto set = [&](GroupKind k, GroupList groups) {
    h->kinds[static_cast<int>(k)].push_back(make_level(std::move(groups), W));
  };
  const GroupList dp_cp = dense.groups("dp-cp");
  const GroupList expt_dp = expert.groups("dp");
  set(GroupKind::dp_cp, dp_cp);
  if (N == 1) {
    set(GroupKind::intra_dp_cp, dp_cp);
  } else {
    const std::array<std::int64_t, 2> s{dp * c.cp / N, N};
    set(GroupKind::intra_dp_cp, split_all(dp_cp, s, 0));
  }
  set(GroupKind::dp, dense.groups("dp"));
  const GroupList cp_groups = dense.groups("cp");
  set(GroupKind::cp, cp_groups);
  for (int l = 0; l < static_cast<int>(c.hcp.size()); ++l)
    set(GroupKind::hcp, split_all(cp_groups, c.hcp, l));
  set(GroupKind::mp, dense.groups("tp-gtp_remat-pp"));
  set(GroupKind::tp, dense.groups("tp"));
  const GroupList pp_groups = dense.groups("pp");
  set(GroupKind::pp, pp_groups);
  for (GroupKind k : {GroupKind::embd, GroupKind::pos_embd}) {
    GroupList e;
    for (std::size_t i = 0; i < pp_groups.size(); ++i) e.push_back(embedding(k, pp_groups[i]));
    set(k, std::move(e));
  }
  set(GroupKind::tp_dp_cp, dense.groups("tp-gtp_remat-dp-cp"));
  set(GroupKind::tp_dp, dense.groups("tp-gtp_remat-dp"));
  set(GroupKind::tp_cp, dense.groups("tp-cp"));
  set(GroupKind::ep, expert.groups("ep"));
  set(GroupKind::expt_tp, expert.groups("tp"));
  set(GroupKind::tp_ep, expert.groups("tp-ep"));
  const GroupList tp_ep_pp = expert.groups("tp-ep-pp");
  set(GroupKind::tp_ep_pp, tp_ep_pp);
  set(GroupKind::expt_dp, expt_dp);
  if (N == 1) {
    set(GroupKind::intra_expt_dp, expt_dp);
  } else {
    const std::array<std::int64_t, 2> s{edp / N, N};
    set(GroupKind::intra_expt_dp, split_all(expt_dp, s, 0));
    set(GroupKind::inter_dist_opt, split_all(expt_dp, s, 1));
  }
  {
    GroupList intra;
    std::vector<Rank> run;
    if (c.gtp_remat > 1 || c.expert_gtp_remat > 1) {
      // HEAD: one instance of every rank, ascending.
      for (Rank r = R; r < R + L; ++r) run.push_back(r);
      intra.push_back(run);
    } else {
      const std::size_t per = static_cast<std::size_t>(edp / N);
      for (std::size_t i = 0; i < tp_ep_pp.size(); ++i) {
        run.insert(run.end(), tp_ep_pp[i].begin(), tp_ep_pp[i].end());
        if ((i + 1) % per == 0) {
          intra.push_back(run);
          run.clear();
        }
      }
    }
    set(GroupKind::intra_dist_opt, std::move(intra));
  }
  set(GroupKind::gtp_remat, dense.groups("gtp_remat"));
  set(GroupKind::expt_gtp_remat, expert.groups("gtp_remat"));
  set(GroupKind::dp_gtp_remat,
      c.gtp_remat > 1 ? dense.groups("gtp_remat-dp") : dense.groups("dp"));
  set(GroupKind::dp_cp_gtp_remat, c.gtp_remat > 1 ? dense.groups("gtp_remat-dp-cp") : dp_cp);
  set(GroupKind::expt_dp_gtp_remat,
      c.expert_gtp_remat > 1 ? expert.groups("gtp_remat-dp") : expt_dp);
  set(GroupKind::tp_ep_pp_with_egtp_remat, expert.groups("tp-ep-gtp_remat-pp"));
  if (c.hybrid_context_parallel && !dp_cp.empty()) {
    // n = 2, 4, ... below 2^floor(log2 size): consecutive slices of each dp_cp group, the
    // last one shorter when n does not divide the size.
    const auto size = static_cast<std::int64_t>(dp_cp[0].size());
    std::int64_t top = 1;
    while (top * 2 <= size) top *= 2;
    for (std::int64_t n = 2; n < top; n *= 2) {
      GroupList level;
      for (std::size_t i = 0; i < dp_cp.size(); ++i)
        for (std::int64_t s = 0; s < size; s += n)
          level.push_back(dp_cp[i].subspan(static_cast<std::size_t>(s),
                                           static_cast<std::size_t>(std::min(n, size - s))));
      h->hybrid_sizes.push_back(n);
      set(GroupKind::hybrid_dp_cp, std::move(level));
    }
  }
  if (c.all_gather_groups) {
    const Grid ag = make_grid(default_order(false), c.tp, c.cp, 1, dp * c.gtp_remat, c.pp,
                              c.gtp_remat, 0);
    set(GroupKind::dp_cp_ag, ag.groups("dp-cp"));
    if (c.ep > 1) {
      const Grid eag = make_grid(default_order(true), c.expert_tp(), 1, c.ep,
                                 edp * c.expert_gtp_remat, c.pp, c.expert_gtp_remat, 0);
      set(GroupKind::expt_dp_ag, eag.groups("dp"));
    }
  }
  return h;
}

}  // namespace commgrid::detail
