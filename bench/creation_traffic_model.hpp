// What creating the world and every group costs a rank in store traffic and connections,
// counted from the code's own rules (see bench_creation_traffic.cpp, which checks these
// counts against a counting store at small worlds), for commgrid's Gloo strategies and for
// Megatron-core's pattern on torch.distributed.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "commgrid/layout.hpp"
#include "commgrid/process_groups.hpp"

namespace commgrid::bench {

/// Store traffic (commgrid Store API calls and value bytes) and Gloo connections of one rank.
struct Traffic {
  std::int64_t sets = 0, gets = 0, waits = 0, has = 0;  // waits: wait_for requests
  std::int64_t set_bytes = 0, get_bytes = 0;            // value bytes written and read
  std::int64_t pairs = 0;                               // Gloo pair connections (one end each)
  std::int64_t world_collectives = 0;                   // world allgathers for creation
  std::int64_t world_collective_bytes = 0;              // bytes each rank receives in them
  Traffic& operator+=(const Traffic& o);
};

/// One Gloo group of n members connected by connect_group: per member one arrival mark
/// (1 byte), n-1 pair addresses set (sizeof(sockaddr_storage) + 8 + a gate mark: 137 bytes),
/// one wait for the n-1 addresses meant for it, n-1 gets of them.
Traffic gloo_group(std::int64_t n);

/// The world of W ranks: its size check (rank 0 reads every rank's size: `has` counted
/// once per rank, a lower bound: it polls a missing one again) and its full mesh.
Traffic gloo_world(std::int64_t world_size, std::int64_t rank);

/// Rank `rank`'s traffic to create every kind of `layout` with `strategy` on Gloo, the world
/// included; the fingerprint check (two allreduces and an allgather on the world) is not
/// counted: it is the same for every strategy. Kinds in `skip` are not created (what
/// InitOptions::kinds leaves out).
Traffic commgrid_rank(const Layout& layout, std::int64_t rank, CreationStrategy strategy,
                      std::span<const GroupKind> skip = {});

/// Megatron-core's initialize_model_parallel on torch.distributed (torch 1.13's
/// distributed_c10d, TCPStore): every rank calls new_group for every group (Megatron's
/// creation order, plus the Gloo twins of the dp, dp_cp and expt_dp groups that
/// create_gloo_process_groups=True adds), and each new_group ends with
/// _store_based_barrier: one add, then adds polling every 10 ms until all W arrived (at
/// least one: counted as one, a lower bound). A member of a Gloo twin runs Gloo's
/// connectFullMesh: its whole address list set once, every peer's whole list read
/// ((n-1) gets of (n-1) x 136 bytes). NCCL groups connect at their first collective
/// (ncclUniqueId: 128 bytes set by the group's rank 0, read by the others); counted here too.
struct MegatronCount {
  std::int64_t new_group_calls = 0;  // every rank makes them all
  Traffic rank;                      // of `rank`
};
MegatronCount megatron_rank(const Layout& layout, std::int64_t rank);

}  // namespace commgrid::bench
