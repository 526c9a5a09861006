// The per-group strategy under compat head on 8 Gloo rank-threads: every rank makes exactly
// the creation calls of for_each_creation (HEAD's order, checked against HEAD's own code in
// tests/unit/test_creation_order.cpp), in that order, ends with the right groups (proven by
// an allgather on each), and the kinds HEAD aliases share their parent's communicator.
#include <gtest/gtest.h>

#include <algorithm>

#include "commgrid/creation_order.hpp"
#include "commgrid/process_groups.hpp"
#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

// The real Gloo world, with each create_group_collective call written down before it is
// forwarded; every other call is forwarded unchanged.
class RecordingWorld final : public Communicator {
 public:
  explicit RecordingWorld(Communicator& inner)
      : Communicator("world", inner.timeout()), inner_(inner) {}

  struct Call {
    std::vector<Rank> members;
    std::string name;
  };
  [[nodiscard]] const std::vector<Call>& calls() const { return calls_; }

  std::string_view backend() const noexcept override { return inner_.backend(); }
  Rank rank() const noexcept override { return inner_.rank(); }
  Rank size() const noexcept override { return inner_.size(); }

 protected:
  void timeout_changed(std::chrono::milliseconds t) override { inner_.set_timeout(t); }
  std::unique_ptr<Communicator> do_split(std::optional<std::int64_t> color, std::int64_t key,
                                         std::string name) override {
    return inner_.split(color, key, std::move(name));
  }
  std::unique_ptr<Communicator> do_create_group(std::span<const Rank> members,
                                                std::string name) override {
    return inner_.create_group(members, std::move(name));
  }
  std::unique_ptr<Communicator> do_create_group_collective(std::span<const Rank> members,
                                                           std::string name) override {
    calls_.push_back({{members.begin(), members.end()}, name});
    return inner_.create_group_collective(members, std::move(name));
  }
  std::unique_ptr<Work> do_barrier() override { return inner_.barrier(); }
  std::unique_ptr<Work> do_broadcast(void* b, std::size_t n, DataType t, Rank root) override {
    return inner_.broadcast(b, n, t, root);
  }
  std::unique_ptr<Work> do_allreduce(const void* s, void* r, std::size_t n, DataType t,
                                     ReduceOp op) override {
    return inner_.allreduce(s, r, n, t, op);
  }
  std::unique_ptr<Work> do_allgather(const void* s, void* r, std::size_t n, DataType t) override {
    return inner_.allgather(s, r, n, t);
  }
  std::unique_ptr<Work> do_reduce_scatter(const void* s, void* r, std::size_t n, DataType t,
                                          ReduceOp op) override {
    return inner_.reduce_scatter(s, r, n, t, op);
  }
  std::unique_ptr<Work> do_alltoall(const void* s, void* r, std::size_t n, DataType t) override {
    return inner_.alltoall(s, r, n, t);
  }
  std::unique_ptr<Work> do_alltoallv(const void* s, std::span<const std::size_t> sc, void* r,
                                     std::span<const std::size_t> rc, DataType t) override {
    return inner_.alltoallv(s, sc, r, rc, t);
  }
  std::unique_ptr<Work> do_allgatherv(const void* s, std::size_t n, void* r,
                                      std::span<const std::size_t> rc, DataType t) override {
    return inner_.allgatherv(s, n, r, rc, t);
  }
  std::unique_ptr<Work> do_reduce(const void* s, void* r, std::size_t n, DataType t, ReduceOp op,
                                  Rank root) override {
    return inner_.reduce(s, r, n, t, op, root);
  }
  std::unique_ptr<Work> do_gather(const void* s, void* r, std::size_t n, DataType t,
                                  Rank root) override {
    return inner_.gather(s, r, n, t, root);
  }
  std::unique_ptr<Work> do_scatter(const void* s, void* r, std::size_t n, DataType t,
                                   Rank root) override {
    return inner_.scatter(s, r, n, t, root);
  }
  std::unique_ptr<Work> do_batch_isend_irecv(std::span<const P2POp> ops,
                                             std::string_view) override {
    return inner_.batch_isend_irecv(ops);
  }

 private:
  Communicator& inner_;
  std::vector<Call> calls_;
};

// The calls this rank made are the pure sequence, one for one: members (ascending, as the
// backend takes them) and the group's name (kind[level]#index).
void expect_calls_follow_sequence(const RecordingWorld& w, const Layout& layout) {
  const std::vector<CreationStep> steps = creation_sequence(layout);
  ASSERT_EQ(w.calls().size(), steps.size()) << "on rank " << w.rank();
  for (std::size_t i = 0; i < steps.size(); ++i) {
    std::vector<Rank> want(steps[i].members.begin(), steps[i].members.end());
    std::sort(want.begin(), want.end());
    std::string label(kind_name(steps[i].kind));
    if (steps[i].kind == GroupKind::hcp || steps[i].kind == GroupKind::hybrid_dp_cp)
      label += "[" + std::to_string(steps[i].level) + "]";
    ASSERT_EQ(w.calls()[i].members, want) << "call " << i << " on rank " << w.rank();
    ASSERT_EQ(w.calls()[i].name, label + "#" + std::to_string(steps[i].index))
        << "call " << i << " on rank " << w.rank();
  }
}

// Each created kind and level: the communicator's members, by an allgather of world ranks,
// are the layout's group of this rank; a rank the layout leaves out has none.
void expect_groups_on_the_wire(const ProcessGroups& pg, int rank) {
  for (GroupKind k : pg.kinds()) {
    for (int l = 0; l < pg.layout().levels(k); ++l) {
      const auto ref = pg.layout().group_of(k, rank, l);
      ASSERT_EQ(pg.has_group(k, l), ref.has_value()) << pg.layout().level_name(k, l);
      if (!ref) continue;
      std::vector<std::int64_t> got(ref->members.size());
      const std::int64_t mine = rank;
      pg.group(k, l).allgather(&mine, got.data(), 1, DataType::int64)->wait();
      std::vector<std::int64_t> want(ref->members.begin(), ref->members.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(got, want) << pg.layout().level_name(k, l) << " on rank " << rank;
    }
  }
}

InitOptions per_group() {
  InitOptions o;
  o.strategy = CreationStrategy::per_group;
  return o;
}

// gtp_remat 2 and expert_gtp_remat 2 (HEAD builds the gtp variants: no aliases there) and
// hybrid cp (dp_cp groups of 4: hybrid_dp_cp_2). 97 HEAD calls, no Gloo twins under gtp
// (tests/data x4-...).
TEST(GlooHeadCreationOrder, GtpAndHybridOnEightRankThreads) {
  ParallelConfig cfg;
  cfg.world_size = 8;
  cfg.compat = Compat::head;
  cfg.cp = 2;
  cfg.ep = 2;
  cfg.etp = 1;
  cfg.gtp_remat = 2;
  cfg.expert_gtp_remat = 2;
  cfg.hybrid_context_parallel = true;
  run_ranks(8, [&](Communicator& inner) {
    RecordingWorld w(inner);
    ProcessGroups pg;
    pg.initialize(w, cfg, per_group());
    expect_calls_follow_sequence(w, pg.layout());
    EXPECT_EQ(w.calls().size(), 97u);
    expect_groups_on_the_wire(pg, w.rank());
    EXPECT_NE(pg.group_handle(GroupKind::dp_gtp_remat), pg.group_handle(GroupKind::dp));
    EXPECT_NE(pg.group_handle(GroupKind::expt_dp_gtp_remat), pg.group_handle(GroupKind::expt_dp));
    EXPECT_EQ(pg.group_handle(GroupKind::intra_dp_cp), pg.group_handle(GroupKind::dp_cp));
    EXPECT_EQ(pg.size(GroupKind::hybrid_dp_cp, 0), 2);
  });
}

// All-gather groups over ranks 0-3 (HEAD's default order, no offset) while the layout covers
// ranks 4-7; with gtp sizes of 1 the gtp variants are HEAD's aliases of dp, dp_cp and
// expt_dp. 58 HEAD calls besides its 12 Gloo twins (tests/data x5-...).
TEST(GlooHeadCreationOrder, AllGatherGroupsAndRankOffsetOnEightRankThreads) {
  ParallelConfig cfg;
  cfg.world_size = 8;
  cfg.compat = Compat::head;
  cfg.tp = 2;
  cfg.pp = 2;
  cfg.ep = 2;
  cfg.etp = 1;
  cfg.all_gather_groups = true;
  cfg.rank_offset = 4;
  cfg.local_world_size = 4;
  run_ranks(8, [&](Communicator& inner) {
    RecordingWorld w(inner);
    ProcessGroups pg;
    pg.initialize(w, cfg, per_group());
    expect_calls_follow_sequence(w, pg.layout());
    EXPECT_EQ(w.calls().size(), 58u);
    expect_groups_on_the_wire(pg, w.rank());
    EXPECT_EQ(pg.has_group(GroupKind::dp_cp_ag), w.rank() < 4);
    EXPECT_EQ(pg.has_group(GroupKind::tp), w.rank() >= 4);
    if (w.rank() >= 4) {
      EXPECT_EQ(pg.group_handle(GroupKind::dp_gtp_remat), pg.group_handle(GroupKind::dp));
      EXPECT_EQ(pg.group_handle(GroupKind::dp_cp_gtp_remat), pg.group_handle(GroupKind::dp_cp));
      EXPECT_EQ(pg.group_handle(GroupKind::expt_dp_gtp_remat), pg.group_handle(GroupKind::expt_dp));
    }
    for (const KindCreation& st : pg.creation_stats()) {
      const bool alias = st.kind == GroupKind::dp_gtp_remat ||
                         st.kind == GroupKind::dp_cp_gtp_remat ||
                         st.kind == GroupKind::expt_dp_gtp_remat ||
                         st.kind == GroupKind::intra_dp_cp || st.kind == GroupKind::intra_expt_dp;
      EXPECT_EQ(st.alias, alias) << st.label;
      if (alias) { EXPECT_EQ(st.creation_calls, 0) << st.label; }
    }
  });
}

// The other strategies alias the same kinds (creation_aliases), making no call for them.
TEST(GlooHeadCreationOrder, SplitAndMemberAliasLikeHead) {
  ParallelConfig cfg;
  cfg.world_size = 8;
  cfg.compat = Compat::head;
  cfg.tp = 2;
  cfg.pp = 2;
  for (CreationStrategy strategy : {CreationStrategy::split, CreationStrategy::member}) {
    run_ranks(8, [&](Communicator& w) {
      ProcessGroups pg;
      InitOptions o;
      o.strategy = strategy;
      pg.initialize(w, cfg, o);
      EXPECT_EQ(pg.group_handle(GroupKind::dp_gtp_remat), pg.group_handle(GroupKind::dp));
      EXPECT_EQ(pg.group_handle(GroupKind::dp_cp_gtp_remat), pg.group_handle(GroupKind::dp_cp));
      EXPECT_EQ(pg.group_handle(GroupKind::expt_dp_gtp_remat), pg.group_handle(GroupKind::expt_dp));
      EXPECT_NE(pg.group_handle(GroupKind::tp_ep_pp_with_egtp_remat),  // HEAD creates it anew
                pg.group_handle(GroupKind::tp_ep_pp));
      for (const KindCreation& st : pg.creation_stats()) {
        if (st.alias) { EXPECT_EQ(st.creation_calls, 0) << st.label; }
      }
      expect_groups_on_the_wire(pg, w.rank());
    });
  }
}

}  // namespace
}  // namespace commgrid::test
