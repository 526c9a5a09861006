#include "commgrid/creation_order.hpp"

#include <algorithm>
#include <array>

#include "edition.hpp"

namespace commgrid {
namespace {

// What the walk needs of a config and a request: the kinds asked for, and which of them
// Megatron does not create because they alias a parent.
class Request {
 public:
  Request(const Layout& layout, std::span<const GroupKind> kinds) {
    if (kinds.empty()) {
      for (GroupKind k : layout.kinds()) want_[static_cast<int>(k)] = true;
    } else {
      for (GroupKind k : kinds) {
        (void)layout.num_groups(k);  // UnknownKindError for a kind the layout lacks
        want_[static_cast<int>(k)] = true;
      }
    }
    const ParallelConfig& c = layout.config();
    const bool one = c.dist_opt_instances == 1;
    add_alias(GroupKind::intra_dp_cp, GroupKind::dp_cp, one);
    add_alias(GroupKind::intra_expt_dp, GroupKind::expt_dp, one);
    // HEAD points these globals at the default groups when the gtp sizes are 1 (the seed
    // has none of these kinds, so they are never wanted there).
    add_alias(GroupKind::dp_gtp_remat, GroupKind::dp, c.gtp_remat == 1);
    add_alias(GroupKind::dp_cp_gtp_remat, GroupKind::dp_cp, c.gtp_remat == 1);
    add_alias(GroupKind::expt_dp_gtp_remat, GroupKind::expt_dp, c.expert_gtp_remat == 1);
  }

  [[nodiscard]] bool want(GroupKind k) const { return want_[static_cast<int>(k)]; }
  /// Whether k is created: asked for, and not an alias of a parent also asked for.
  [[nodiscard]] bool create(GroupKind k) const {
    return want(k) && !(is_alias_[static_cast<int>(k)] && want(parent_[static_cast<int>(k)]));
  }
  [[nodiscard]] const std::vector<CreationAlias>& aliases() const { return aliases_; }

 private:
  void add_alias(GroupKind k, GroupKind parent, bool holds) {
    if (!holds) return;
    is_alias_[static_cast<int>(k)] = true;
    parent_[static_cast<int>(k)] = parent;
    if (want(k) && want(parent)) aliases_.push_back({k, parent});
  }

  std::array<bool, kNumKinds> want_{};
  std::array<bool, kNumKinds> is_alias_{};
  std::array<GroupKind, kNumKinds> parent_{};
  std::vector<CreationAlias> aliases_;
};

class Walker {
 public:
  Walker(const Layout& layout, const Request& req, const CreationVisitor& visit)
      : L_(layout), c_(layout.config()), req_(req), visit_(visit) {}

  void run(const detail::SequenceItem& item) {
    switch (item.walk) {
      case detail::Walk::plain: return plain(item.kind);
      case detail::Walk::dp_cp_with_intra: return dp_cp_with_intra();
      case detail::Walk::cp_with_hcp: return cp_with_hcp();
      case detail::Walk::pp_with_embeddings: return pp_with_embeddings();
      case detail::Walk::expt_dp_with_partials: return expt_dp_with_partials();
      case detail::Walk::hybrid_by_parent: return hybrid_by_parent();
    }
  }

  // Every group of every level of k, in the layout's order.
  void plain(GroupKind k) {
    if (!req_.create(k)) return;
    for (int level = 0; level < L_.levels(k); ++level) {
      const GroupList groups = L_.groups(k, level);
      for (std::size_t i = 0; i < groups.size(); ++i)
        visit_(k, level, static_cast<std::int64_t>(i), groups[i]);
    }
  }

  // dp_cp, each group followed by its intra_dp_cp chunks (consecutive slices).
  void dp_cp_with_intra() {
    const bool parent = req_.create(GroupKind::dp_cp), intra = req_.want(GroupKind::intra_dp_cp);
    if (!parent && !intra) return;
    const std::int64_t N = c_.dist_opt_instances;
    const GroupList parents = L_.groups(GroupKind::dp_cp);
    const std::array<std::int64_t, 2> split = {c_.cp * L_.dp() / N, N};
    for (std::size_t i = 0; i < parents.size(); ++i) {
      const auto q = static_cast<std::int64_t>(i);
      if (parent) visit_(GroupKind::dp_cp, 0, q, parents[i]);
      if (!req_.create(GroupKind::intra_dp_cp)) continue;
      if (N == 1) {  // the alias of dp_cp, created here when dp_cp was not asked for
        visit_(GroupKind::intra_dp_cp, 0, q, parents[i]);
        continue;
      }
      GroupList chunks;
      hierarchical_split(parents[i], split, 0, chunks);
      for (std::size_t j = 0; j < chunks.size(); ++j)
        visit_(GroupKind::intra_dp_cp, 0, q * N + static_cast<std::int64_t>(j), chunks[j]);
    }
  }

  // cp, each group followed by all its hcp level-0 groups, then level 1, ...
  void cp_with_hcp() {
    if (!req_.create(GroupKind::cp) && !req_.create(GroupKind::hcp)) return;
    const GroupList parents = L_.groups(GroupKind::cp);
    for (std::size_t i = 0; i < parents.size(); ++i) {
      const auto q = static_cast<std::int64_t>(i);
      if (req_.create(GroupKind::cp)) visit_(GroupKind::cp, 0, q, parents[i]);
      if (!req_.create(GroupKind::hcp)) continue;
      for (int level = 0; level < L_.levels(GroupKind::hcp); ++level) {
        GroupList sub;
        hierarchical_split(parents[i], c_.hcp, level, sub);
        const std::int64_t per = c_.cp / c_.hcp[static_cast<std::size_t>(level)];
        for (std::size_t j = 0; j < sub.size(); ++j)
          visit_(GroupKind::hcp, level, q * per + static_cast<std::int64_t>(j), sub[j]);
      }
    }
  }

  // pp, each group followed by its embd and pos_embd group.
  void pp_with_embeddings() {
    const bool pp = req_.create(GroupKind::pp), embd = req_.create(GroupKind::embd),
               pos = req_.create(GroupKind::pos_embd);
    if (!pp && !embd && !pos) return;
    const GroupList pps = L_.groups(GroupKind::pp);
    const GroupList embds = embd ? L_.groups(GroupKind::embd) : GroupList();
    const GroupList poss = pos ? L_.groups(GroupKind::pos_embd) : GroupList();
    for (std::size_t i = 0; i < pps.size(); ++i) {
      const auto q = static_cast<std::int64_t>(i);
      if (pp) visit_(GroupKind::pp, 0, q, pps[i]);
      if (embd) visit_(GroupKind::embd, 0, q, embds[i]);
      if (pos) visit_(GroupKind::pos_embd, 0, q, poss[i]);
    }
  }

  // expt_dp, each group followed by its intra_expt_dp groups, then its inter_dist_opt
  // groups (the two levels of a hierarchical split [edp / N, N]).
  void expt_dp_with_partials() {
    const bool parent = req_.create(GroupKind::expt_dp);
    const bool intra = req_.create(GroupKind::intra_expt_dp);
    const bool inter = req_.create(GroupKind::inter_dist_opt);
    if (!parent && !intra && !inter) return;
    const std::int64_t N = c_.dist_opt_instances;
    const GroupList parents = L_.groups(GroupKind::expt_dp);
    const std::int64_t s0 = L_.expert_dp() / N;
    const std::array<std::int64_t, 2> split = {s0, N};
    for (std::size_t i = 0; i < parents.size(); ++i) {
      const auto q = static_cast<std::int64_t>(i);
      if (parent) visit_(GroupKind::expt_dp, 0, q, parents[i]);
      if (N == 1) {
        if (intra) visit_(GroupKind::intra_expt_dp, 0, q, parents[i]);
        continue;
      }
      if (intra) {
        GroupList sub;
        hierarchical_split(parents[i], split, 0, sub);
        for (std::size_t j = 0; j < sub.size(); ++j)
          visit_(GroupKind::intra_expt_dp, 0, q * N + static_cast<std::int64_t>(j), sub[j]);
      }
      if (inter) {
        GroupList sub;
        hierarchical_split(parents[i], split, 1, sub);
        for (std::size_t j = 0; j < sub.size(); ++j)
          visit_(GroupKind::inter_dist_opt, 0, q * s0 + static_cast<std::int64_t>(j), sub[j]);
      }
    }
  }

  // HEAD: after all dp_cp groups, for each dp_cp group every hybrid size n in turn, each
  // as consecutive slices of the group (create_hybrid_dp_cp_groups).
  void hybrid_by_parent() {
    if (!req_.create(GroupKind::hybrid_dp_cp)) return;
    const std::int64_t parents = L_.num_groups(GroupKind::dp_cp);
    std::vector<GroupList> levels;
    levels.reserve(static_cast<std::size_t>(L_.levels(GroupKind::hybrid_dp_cp)));
    for (int l = 0; l < L_.levels(GroupKind::hybrid_dp_cp); ++l)
      levels.push_back(L_.groups(GroupKind::hybrid_dp_cp, l));
    for (std::int64_t i = 0; i < parents; ++i) {
      for (std::size_t l = 0; l < levels.size(); ++l) {
        const auto per = static_cast<std::int64_t>(levels[l].size()) / parents;
        for (std::int64_t j = 0; j < per; ++j)
          visit_(GroupKind::hybrid_dp_cp, static_cast<int>(l), i * per + j,
                 levels[l][static_cast<std::size_t>(i * per + j)]);
      }
    }
  }

 private:
  const Layout& L_;
  const ParallelConfig& c_;
  const Request& req_;
  const CreationVisitor& visit_;
};

}  // namespace

void for_each_creation(const Layout& layout, std::span<const GroupKind> kinds,
                       const CreationVisitor& visit) {
  const Request req(layout, kinds);
  Walker w(layout, req, visit);
  for (const detail::SequenceItem& item : detail::edition_of(layout.config().compat).creation)
    w.run(item);
}

std::vector<CreationStep> creation_sequence(const Layout& layout,
                                            std::span<const GroupKind> kinds) {
  std::vector<CreationStep> out;
  for_each_creation(layout, kinds,
                    [&](GroupKind k, int level, std::int64_t index, std::span<const Rank> members) {
                      out.push_back({k, level, index, {members.begin(), members.end()}});
                    });
  return out;
}

std::vector<CreationAlias> creation_aliases(const Layout& layout,
                                            std::span<const GroupKind> kinds) {
  return Request(layout, kinds).aliases();
}

}  // namespace commgrid
