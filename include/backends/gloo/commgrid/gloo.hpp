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

/// How a Gloo world is created.
struct GlooOptions {
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
  /// empty token, which keeps out only programs that do not speak commgrid.
  std::string token;
};

/// Creates the world communicator of rank `rank` of `size` ranks: collective over the
/// world: every rank calls it with the same store (or a store at the same place), size and
/// prefix. Throws ConfigError for a rank or size out of range, IncompatibleError when ranks
/// were given different sizes ("rank 3 says world size 4, rank 0 says 8"), TimeoutError
/// naming the ranks that did not arrive within options.timeout, BackendError for a
/// transport failure. Sets SIGPIPE to ignored when it has its default action, so that a
/// write to a dead peer is an error, not the death of this rank.
[[nodiscard]] std::unique_ptr<Communicator> make_gloo_world(std::shared_ptr<Store> store, int rank,
                                                            int size,
                                                            const GlooOptions& options = {});

/// The rank, size, store and timeout that a launcher put in the environment.
struct WorldEnv {
  int rank = 0;              ///< COMMGRID_RANK, 0 ... size-1
  int size = 1;              ///< COMMGRID_WORLD_SIZE, >= 1
  std::string store;         ///< COMMGRID_STORE, e.g. file:///tmp/x or redis://host:6379
  /// COMMGRID_TIMEOUT in seconds (a positive decimal), when set.
  std::optional<std::chrono::milliseconds> timeout;
};

/// Reads COMMGRID_RANK, COMMGRID_WORLD_SIZE, COMMGRID_STORE and the optional
/// COMMGRID_TIMEOUT. Throws ConfigError naming the variable and its text when one is
/// missing or malformed ("COMMGRID_RANK=3 is not below COMMGRID_WORLD_SIZE=2").
WorldEnv read_world_env();

/// Whether COMMGRID_RANK is set: the process was started by a store-based launcher
/// (commgrid launch, or a user's own script exporting the variables).
bool world_env_present();

/// Creates the Gloo world of this process from whichever launcher started it (commgrid
/// launch, torchrun, srun, mpirun, Hydra: read_launch_info), with the store from its URL
/// under the job id and the job's token. COMMGRID_TIMEOUT, when set, overrides
/// options.timeout; COMMGRID_GLOO_HOSTNAME, when set, overrides options.hostname. A tcp://
/// store is served by rank 0 (it listens on MASTER_PORT) and every rank's Gloo listens on
/// the interface that reaches the store. Collective over the world; the errors of
/// read_launch_info, open_store and make_gloo_world.
[[nodiscard]] std::unique_ptr<Communicator> make_gloo_world_from_env(GlooOptions options = {});

}  // namespace commgrid
