#include "edition.hpp"

#include <array>

namespace commgrid::detail {
namespace {

using enum Rule;
using K = GroupKind;

// Megatron-core at the seed (8c1e094afe). Rule order cross-checked against Megatron on
// 2,189 invalid configs (layout spec, §4): 1, 2, 3, 12, then 4, 5, 10 (dense), 6, 10
// (expert), 7, 11, 8a, 9, 8b.
constexpr std::array kSeedRules = {
    head_options_unset, world_size,          positive_sizes, order_tokens,         dense_divides,
    vpp_needs_pp,       dense_axes_in_order, expert_divides, expert_axes_in_order, pp_last,
    pp_groups_agree,    dist_opt_divides_dp, hcp_product,    dist_opt_divides_edp};

// HEAD (d98e8a64dd): initialize_model_parallel's checks, then create_all_gather_groups'.
constexpr std::array kHeadRules = {world_size,      positive_sizes,       placement,
                                   order_tokens,    order_has_tp,         gtp_without_dist_opt,
                                   dense_divides,   vpp_needs_pp,         dense_axes_in_order,
                                   expert_divides,  expert_axes_in_order, pp_last,
                                   pp_groups_agree, dist_opt_divides_dp,  hybrid_even,
                                   hcp_product,     dist_opt_divides_edp, all_gather_fits};

constexpr std::array kSeedKinds = {K::dp_cp,
                                   K::intra_dp_cp,
                                   K::dp,
                                   K::cp,
                                   K::hcp,
                                   K::mp,
                                   K::tp,
                                   K::pp,
                                   K::embd,
                                   K::pos_embd,
                                   K::tp_dp_cp,
                                   K::tp_dp,
                                   K::tp_cp,
                                   K::ep,
                                   K::expt_tp,
                                   K::tp_ep,
                                   K::tp_ep_pp,
                                   K::expt_dp,
                                   K::intra_expt_dp,
                                   K::inter_dist_opt,
                                   K::intra_dist_opt};

constexpr std::array kHeadKinds = {K::dp_cp,
                                   K::intra_dp_cp,
                                   K::dp,
                                   K::cp,
                                   K::hcp,
                                   K::mp,
                                   K::tp,
                                   K::pp,
                                   K::embd,
                                   K::pos_embd,
                                   K::tp_dp_cp,
                                   K::tp_dp,
                                   K::tp_cp,
                                   K::ep,
                                   K::expt_tp,
                                   K::tp_ep,
                                   K::tp_ep_pp,
                                   K::expt_dp,
                                   K::intra_expt_dp,
                                   K::inter_dist_opt,
                                   K::intra_dist_opt,
                                   K::gtp_remat,
                                   K::expt_gtp_remat,
                                   K::dp_gtp_remat,
                                   K::dp_cp_gtp_remat,
                                   K::expt_dp_gtp_remat,
                                   K::tp_ep_pp_with_egtp_remat,
                                   K::hybrid_dp_cp,
                                   K::dp_cp_ag,
                                   K::expt_dp_ag};

constexpr SequenceItem plain(GroupKind k) { return {Walk::plain, k}; }
constexpr SequenceItem walk(Walk w) { return {w, GroupKind::tp}; }

// The layout spec, §11.
constexpr std::array kSeedCreation = {plain(K::dp),
                                      walk(Walk::dp_cp_with_intra),
                                      walk(Walk::cp_with_hcp),
                                      plain(K::mp),
                                      plain(K::tp),
                                      walk(Walk::pp_with_embeddings),
                                      plain(K::tp_dp_cp),
                                      plain(K::tp_dp),
                                      plain(K::tp_cp),
                                      plain(K::ep),
                                      plain(K::expt_tp),
                                      plain(K::tp_ep),
                                      plain(K::tp_ep_pp),
                                      walk(Walk::expt_dp_with_partials),
                                      plain(K::intra_dist_opt)};

// HEAD's initialize_model_parallel, then create_all_gather_groups (which megatron/training
// calls after it), recorded from HEAD's own code (tests/data/head_creation_order/). The Gloo
// twins HEAD interleaves are not created by commgrid. gtp_remat comes before everything
// (singletons when gtp_remat = 1); dp_cp first of the data groups; dp_gtp_remat,
// dp_cp_gtp_remat and expt_dp_gtp_remat are aliases while their gtp size is 1 (created
// here only when asked for without their parent).
constexpr std::array kHeadCreation = {plain(K::gtp_remat),
                                      walk(Walk::dp_cp_with_intra),
                                      walk(Walk::hybrid_by_parent),
                                      plain(K::dp),
                                      plain(K::dp_gtp_remat),
                                      plain(K::dp_cp_gtp_remat),
                                      walk(Walk::cp_with_hcp),
                                      plain(K::mp),
                                      plain(K::tp),
                                      walk(Walk::pp_with_embeddings),
                                      plain(K::tp_dp_cp),
                                      plain(K::tp_dp),
                                      plain(K::tp_cp),
                                      plain(K::expt_gtp_remat),
                                      plain(K::ep),
                                      plain(K::expt_tp),
                                      plain(K::tp_ep),
                                      plain(K::tp_ep_pp),
                                      plain(K::tp_ep_pp_with_egtp_remat),
                                      walk(Walk::expt_dp_with_partials),
                                      plain(K::expt_dp_gtp_remat),
                                      plain(K::intra_dist_opt),
                                      plain(K::dp_cp_ag),
                                      plain(K::expt_dp_ag)};

constexpr Edition kSeed{Compat::seed, kSeedAxes, false, kSeedRules, kSeedKinds, kSeedCreation};
constexpr Edition kHead{Compat::head, kAllAxes, true, kHeadRules, kHeadKinds, kHeadCreation};

}  // namespace

const Edition& edition_of(Compat c) noexcept { return c == Compat::head ? kHead : kSeed; }

}  // namespace commgrid::detail
