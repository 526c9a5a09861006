// The runtime's pure parts, without any backend: bfloat16 conversions, names, strategy
// parsing, ProcessGroups' state errors and the collections over stand-in communicators.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <sstream>

#include "commgrid/collections.hpp"
#include "commgrid/communicator.hpp"
#include "commgrid/process_groups.hpp"

namespace commgrid::test {
namespace {

TEST(Bfloat16, WideningIsExactAndNarrowingRoundsToNearestEven) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc000), -2.0f);
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3*2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  // Just above halfway rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  // Every bfloat16 survives a round trip.
  for (std::uint32_t v = 0; v <= 0xffff; ++v) {
    const auto b = static_cast<std::uint16_t>(v);
    const float f = bf16_to_float(b);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), b) << std::hex << v;
  }
}

TEST(Bfloat16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_to_float(float_to_bf16(inf)), inf);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-inf)), -inf);
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max())), inf)
      << "above the largest bfloat16: rounds to infinity";
  // A NaN whose payload sits only in the low bits must stay a NaN, not become infinity.
  const float low_nan = std::bit_cast<float>(0x7f800001u);
  ASSERT_TRUE(std::isnan(low_nan));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_nan))));
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
}

TEST(RuntimeNames, TypesOpsAndStrategies) {
  EXPECT_EQ(datatype_name(DataType::bfloat16), "bfloat16");
  EXPECT_EQ(datatype_name(DataType::int64), "int64");
  EXPECT_EQ(reduce_op_name(ReduceOp::prod), "prod");
  EXPECT_EQ(element_size(DataType::bfloat16), 2u);
  EXPECT_EQ(parse_strategy("split"), CreationStrategy::split);
  EXPECT_EQ(parse_strategy("per-group"), CreationStrategy::per_group);
  EXPECT_EQ(parse_strategy("per_group"), CreationStrategy::per_group);
  EXPECT_EQ(strategy_name(CreationStrategy::member), "member");
  try {
    (void)parse_strategy("all");
    FAIL() << "unknown strategy must throw";
  } catch (const InvalidValueError& e) {
    EXPECT_STREQ(e.what(),
                 "strategy: unknown creation strategy \"all\"; valid: split, member, per-group");
  }
}

TEST(ProcessGroupsState, EveryCallBeforeInitializeNamesItself) {
  ProcessGroups pg;
  EXPECT_FALSE(pg.is_initialized());
  try {
    (void)pg.pipeline_first_rank();
    FAIL();
  } catch (const StateError& e) {
    EXPECT_STREQ(e.what(),
                 "ProcessGroups::pipeline_first_rank: parallel state is not "
                 "initialized; call initialize() first");
  }
  EXPECT_THROW((void)pg.amax_reduction_group(), StateError);
  EXPECT_THROW((void)pg.creation_stats(), StateError);
  EXPECT_THROW(pg.set_virtual_pipeline_rank(0), StateError);
  const ProcessGroups& cpg = pg;
  EXPECT_THROW((void)ModelCommProcessGroups::from_state(cpg), StateError);
}

// A communicator that only has a name and a size: the collections never communicate.
class NamedGroup final : public Communicator {
 public:
  NamedGroup(std::string name, int size)
      : Communicator(std::move(name), kDefaultTimeout), size_(size) {}
  [[nodiscard]] std::string_view backend() const noexcept override { return "none"; }
  [[nodiscard]] Rank rank() const noexcept override { return 0; }
  [[nodiscard]] Rank size() const noexcept override { return size_; }

 protected:
  std::unique_ptr<Communicator> do_split(std::optional<std::int64_t>, std::int64_t,
                                         std::string) override {
    return fail();
  }
  std::unique_ptr<Communicator> do_create_group(std::span<const Rank>, std::string) override {
    return fail();
  }
  std::unique_ptr<Communicator> do_create_group_collective(std::span<const Rank>,
                                                           std::string) override {
    return fail();
  }
  std::unique_ptr<Work> do_barrier() override { return fail_work(); }
  std::unique_ptr<Work> do_broadcast(void*, std::size_t, DataType, Rank) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_allreduce(const void*, void*, std::size_t, DataType, ReduceOp) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_allgather(const void*, void*, std::size_t, DataType) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_reduce_scatter(const void*, void*, std::size_t, DataType,
                                          ReduceOp) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_alltoall(const void*, void*, std::size_t, DataType) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_batch_isend_irecv(std::span<const P2POp>, std::string_view) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_alltoallv(const void*, std::span<const std::size_t>, void*,
                                     std::span<const std::size_t>, DataType) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_allgatherv(const void*, std::size_t, void*, std::span<const std::size_t>,
                                      DataType) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_reduce(const void*, void*, std::size_t, DataType, ReduceOp,
                                  Rank) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_gather(const void*, void*, std::size_t, DataType, Rank) override {
    return fail_work();
  }
  std::unique_ptr<Work> do_scatter(const void*, void*, std::size_t, DataType, Rank) override {
    return fail_work();
  }

 private:
  static std::unique_ptr<Communicator> fail() { throw BackendError("none: no communication"); }
  static std::unique_ptr<Work> fail_work() { throw BackendError("none: no communication"); }
  int size_;
};

GroupHandle named(std::string name, int size) {
  return std::make_shared<NamedGroup>(std::move(name), size);
}

TEST(Collections, ThreeFieldStatesAndTheSummary) {
  const GroupHandle tp = named("tp#3", 2);
  const GroupHandle h0 = named("hcp[0]#1", 2), h1 = named("hcp[1]#1", 2);
  ModelCommProcessGroups m{{"tp", tp},
                           {"hcp", std::vector<GroupHandle>{h0, h1}},
                           {"pos_embd", NoGroup{"rank 8 is in no pos_embd group"}}};
  EXPECT_TRUE(m.tp().has_group());
  EXPECT_EQ(&*m.tp(), tp.get());
  EXPECT_EQ(m.tp()->name(), "tp#3");
  EXPECT_EQ(&m.hcp().level(1), h1.get());
  EXPECT_THROW((void)m.hcp().level(2), NoGroupError);
  EXPECT_FALSE(m.pos_embd());
  EXPECT_EQ(m.pos_embd().get(), nullptr);
  EXPECT_EQ(m.pos_embd().reason(), "rank 8 is in no pos_embd group");
  try {
    (void)m.pos_embd()->size();
    FAIL() << "no group: -> must throw";
  } catch (const NoGroupError& e) {
    EXPECT_STREQ(
        e.what(),
        "ModelCommProcessGroups.pos_embd: this rank has no group (rank 8 is in no pos_embd group)");
  }
  try {
    (void)m.ep();
    FAIL() << "unset: reading must throw";
  } catch (const UnsetFieldError& e) {
    EXPECT_STREQ(e.what(),
                 "ModelCommProcessGroups.ep is unset; set it with set(\"ep\", group), "
                 "construct with {\"ep\", group}, or take it from_state()");
  }
  EXPECT_EQ(m.summary(),
            "ModelCommProcessGroups{tp: tp#3 (2 ranks), pos_embd: none (rank 8 is in no pos_embd "
            "group), hcp: [hcp[0]#1 (2 ranks), hcp[1]#1 (2 ranks)]; unset: pp, mp, embd, cp, "
            "tp_cp, ep, expt_tp, tp_ep, tp_ep_pp, expt_dp}");
  std::ostringstream os;
  os << m;
  EXPECT_EQ(os.str(), m.summary());

  ModelCommProcessGroups same{{"tp", tp},
                              {"hcp", std::vector<GroupHandle>{h0, h1}},
                              {"pos_embd", NoGroup{"another reason"}}};
  EXPECT_EQ(m, same) << "equal: same states and the same groups";
  same.set("tp", named("tp#3", 2));
  EXPECT_FALSE(m == same) << "another communicator with the same name is another group";

  EXPECT_THROW(m.set("tp", std::vector<GroupHandle>{tp, tp}), InvalidValueError);
  EXPECT_THROW(m.set("hcp", std::vector<GroupHandle>{h0, nullptr}), InvalidValueError);
}

TEST(Collections, UnknownNamesAreListedWithTheValidOnes) {
  try {
    GradCommProcessGroups g{{"dp", named("dp#0", 4)}, {"tp", named("tp#0", 2)}};
    FAIL() << "tp is not a field of GradCommProcessGroups";
  } catch (const UnknownKindError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown group kind \"tp\" for GradCommProcessGroups; valid: dp, dp_cp, "
                 "expt_dp, intra_dp_cp, intra_expt_dp, inter_dist_opt");
  }
  GradCommProcessGroups g;
  EXPECT_EQ(g.summary(),
            "GradCommProcessGroups{unset: dp, dp_cp, expt_dp, intra_dp_cp, "
            "intra_expt_dp, inter_dist_opt}");
  EXPECT_THROW(g.set("pp", named("pp#0", 2)), UnknownKindError);
  g.set("inter_dist_opt", GroupHandle());
  EXPECT_EQ(g.inter_dist_opt().reason(), "set to a null handle");
  EXPECT_EQ(g.field_names(), "dp, dp_cp, expt_dp, intra_dp_cp, intra_expt_dp, inter_dist_opt");
}

}  // namespace
}  // namespace commgrid::test
