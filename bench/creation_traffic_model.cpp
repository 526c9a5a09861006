#include "creation_traffic_model.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "commgrid/creation_order.hpp"

namespace commgrid::bench {
namespace {

// A pair address as commgrid publishes it: Gloo's tcp::Address record and the gate mark.
constexpr std::int64_t kPairValue = sizeof(sockaddr_storage) + 8 + 1;
// Gloo's own connectFullMesh publishes the records without the mark.
constexpr std::int64_t kGlooRecord = sizeof(sockaddr_storage) + 8;
constexpr std::int64_t kNcclUniqueId = 128;

std::int64_t digits(std::int64_t v) { return static_cast<std::int64_t>(std::to_string(v).size()); }

// The kinds this rank creates (aliases reuse their parent's communicator).
std::vector<GroupKind> created_kinds(const Layout& layout) {
  const std::vector<GroupKind> kinds = layout.kinds();
  const std::vector<CreationAlias> aliases = creation_aliases(layout, kinds);
  std::vector<GroupKind> out;
  for (GroupKind k : kinds)
    if (std::none_of(aliases.begin(), aliases.end(),
                     [&](const CreationAlias& a) { return a.kind == k; }))
      out.push_back(k);
  return out;
}

std::optional<std::int64_t> size_of_group_of(const Layout& layout, GroupKind k, std::int64_t rank,
                                             int level) {
  if (!layout.group_index(k, rank, level)) return std::nullopt;
  if (const auto n = layout.group_size(k, level)) return *n;
  return static_cast<std::int64_t>(layout.group_of(k, rank, level)->members.size());
}

}  // namespace

Traffic& Traffic::operator+=(const Traffic& o) {
  sets += o.sets;
  gets += o.gets;
  waits += o.waits;
  has += o.has;
  set_bytes += o.set_bytes;
  get_bytes += o.get_bytes;
  pairs += o.pairs;
  world_collectives += o.world_collectives;
  world_collective_bytes += o.world_collective_bytes;
  return *this;
}

Traffic gloo_group(std::int64_t n) {
  Traffic t;
  t.sets = n;  // the arrival mark and n-1 pair addresses
  t.set_bytes = 1 + (n - 1) * kPairValue;
  t.waits = n > 1 ? 1 : 0;
  t.gets = n - 1;
  t.get_bytes = (n - 1) * kPairValue;
  t.pairs = n - 1;
  return t;
}

Traffic gloo_world(std::int64_t world_size, std::int64_t rank) {
  Traffic t;
  const std::int64_t d = digits(world_size);
  t.sets = 1;
  t.set_bytes = d;
  if (rank == 0) {
    t.has = world_size - 1;
    t.gets = world_size - 1;
    t.get_bytes = (world_size - 1) * d;
    if (world_size > 1) {
      t.sets += 1;  // the verdict "o"
      t.set_bytes += 1;
    }
  } else {
    t.waits = 2;  // rank 0's size, then its verdict
    t.gets = 2;
    t.get_bytes = d + 1;
  }
  t += gloo_group(world_size);
  return t;
}

Traffic commgrid_rank(const Layout& layout, std::int64_t rank, CreationStrategy strategy,
                      std::span<const GroupKind> skip) {
  auto skipped = [&](GroupKind k) { return std::find(skip.begin(), skip.end(), k) != skip.end(); };
  const std::int64_t w = layout.world_size();
  Traffic t = gloo_world(w, rank);
  if (strategy == CreationStrategy::per_group) {
    // One create_group_collective per group of the layout on every rank: a world allgather
    // of an 8-byte fingerprint, then the members connect.
    for_each_creation(layout, {},
                      [&](GroupKind k, int, std::int64_t, std::span<const Rank> members) {
                        if (skipped(k)) return;
                        t.world_collectives += 1;
                        t.world_collective_bytes += (w - 1) * 8;
                        if (std::find(members.begin(), members.end(), rank) != members.end())
                          t += gloo_group(static_cast<std::int64_t>(members.size()));
                      });
    return t;
  }
  for (GroupKind k : created_kinds(layout)) {
    if (skipped(k)) continue;
    for (int level = 0; level < layout.levels(k); ++level) {
      if (strategy == CreationStrategy::split) {
        t.world_collectives += 1;  // the split's allgather of (color, key): 24 bytes a rank
        t.world_collective_bytes += (w - 1) * 24;
      }
      if (const auto n = size_of_group_of(layout, k, rank, level)) t += gloo_group(*n);
    }
  }
  return t;
}

MegatronCount megatron_rank(const Layout& layout, std::int64_t rank) {
  MegatronCount out;
  Traffic& t = out.rank;
  auto barrier = [&] {
    // _store_based_barrier: add(key, 1), then add(key, 0) until it reads W (>= 1 poll).
    t.sets += 2;
    t.set_bytes += 16;
    t.get_bytes += 16;
  };
  barrier();  // init_process_group's own
  auto nccl_group = [&](std::int64_t n, bool group_rank_zero) {
    if (n < 2) return;
    if (group_rank_zero) {
      t.sets += 1;
      t.set_bytes += kNcclUniqueId;
    } else {
      t.waits += 1;  // c10d's get waits, then gets
      t.gets += 1;
      t.get_bytes += kNcclUniqueId;
    }
  };
  auto gloo_twin = [&](std::int64_t n) {
    if (n < 2) return;
    t.sets += 1;
    t.set_bytes += (n - 1) * kGlooRecord;
    t.waits += n - 1;
    t.gets += n - 1;
    t.get_bytes += (n - 1) * (n - 1) * kGlooRecord;
    t.pairs += n - 1;
  };
  for_each_creation(layout, {}, [&](GroupKind k, int, std::int64_t, std::span<const Rank> members) {
    out.new_group_calls += 1;
    barrier();
    const auto it = std::find(members.begin(), members.end(), rank);
    if (it != members.end())
      nccl_group(static_cast<std::int64_t>(members.size()), it == members.begin());
    // create_gloo_process_groups=True: a Gloo twin of each dp, dp_cp and expt_dp group.
    if (k == GroupKind::dp || k == GroupKind::dp_cp || k == GroupKind::expt_dp) {
      out.new_group_calls += 1;
      barrier();
      if (it != members.end()) gloo_twin(static_cast<std::int64_t>(members.size()));
    }
  });
  return out;
}

}  // namespace commgrid::bench
