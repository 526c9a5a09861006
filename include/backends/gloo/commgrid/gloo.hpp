// The Gloo backend: CPU collectives over TCP, ranks meeting through a Store.
// Link commgrid::gloo. No Gloo header is included here.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "commgrid/communicator.hpp"
#include "commgrid/launch_info.hpp"
#include "commgrid/store.hpp"

namespace commgrid {

/// How a Gloo world is made (make_gloo_world).
struct GlooOptions {
  /// Where the ranks meet: every rank passes the same store (or a store at the same place).
  std::shared_ptr<Store> store;
  /// This rank, 0 ... size-1.
  Rank rank = 0;
  /// The number of ranks in the world, >= 1.
  Rank size = 1;
  /// Timeout of every rendezvous and every collective of the world and of every group
  /// created from it.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  /// The address this rank listens on, as a name or a numeric address. Empty: the local
  /// address of the store's connection (Store::local_address: 127.0.0.1 for memory and
  /// file stores; for Redis and TCP stores the interface that reaches the store).
  std::string hostname;
  /// Key prefix of this world in the store. Two worlds in one store need two prefixes.
  std::string prefix = "world";
  /// The job's secret (COMMGRID_TOKEN). After Gloo connects the pairs of a new group, both
  /// ends prove it (HMAC-SHA256) before any use; a peer that cannot is reported as
  /// "unauthenticated peer at ADDR" (AuthenticationError). Empty: every rank proves the
  /// store's job secret, or the empty token, which keeps out only programs that do not speak
  /// commgrid.
  std::string token;
};

/// Creates the world communicator of rank options.rank of options.size ranks: collective
/// over the world: every rank calls it with the same store (or a store at the same place),
/// size and prefix. Throws ConfigError ("store") without a store, RankOutOfRangeError
/// ("rank") or InvalidValueError ("world_size", "timeout", "prefix") for an option out of
/// range, IncompatibleError when ranks were given different sizes ("rank 3 says world size 4,
/// rank 0 says 8"), TimeoutError naming the ranks that did not arrive within
/// options.timeout, BackendError for a transport failure. Sets SIGPIPE to ignored when it has
/// its default action, so that a write to a dead peer is an error, not the death of this
/// rank.
[[nodiscard]] std::unique_ptr<Communicator> make_gloo_world(const GlooOptions& options);

/// Creates the Gloo world of this process from whichever launcher started it (commgrid
/// launch, torchrun, srun, mpirun, Hydra: read_launch_info), with the store from its URL
/// under the job id and the job's token; options.store, rank and size must be unset
/// (InvalidValueError naming them), the launcher gives them. COMMGRID_TIMEOUT, when set,
/// overrides options.timeout; COMMGRID_GLOO_HOSTNAME, when set, overrides options.hostname. A
/// tcp:// store is served by rank 0 (it listens on MASTER_PORT) and every rank's Gloo
/// listens on the interface that reaches the store. Collective over the world; the errors of
/// read_launch_info, open_store and make_gloo_world.
[[nodiscard]] std::unique_ptr<Communicator> make_gloo_world_from_env(GlooOptions options = {});

}  // namespace commgrid
