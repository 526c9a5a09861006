// The Gloo backend: CPU collectives over TCP, ranks meeting through a Store.
// Link commgrid::gloo. No Gloo header is included here.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/launch_info.hpp"
#include "commgrid/store.hpp"

namespace commgrid {

/// The algorithms of allreduce and allgather. ring: Gloo's ring algorithms, 2(W-1) rounds of
/// neighbour exchanges (allgather W-1), the allreduce in segments of at most 1 MiB,
/// pipelined: for large buffers. bcube: Gloo's bcube allreduce, recursive halving then
/// doubling over the factors of W (2 log2 W rounds when W is a power of two) with a scratch
/// buffer as large as the input; an allgather is then a bcube max-allreduce of a zeroed
/// buffer that holds each rank's block: for the latency-bound small ones (a check's few
/// numbers, a loss, each rank's record), where every round costs a message's latency and,
/// on a busy host, a scheduling delay. automatic: bcube for an allreduce of at most
/// kGlooBcubeMaxBytes with at least log2(W) elements and for an allgather of at most
/// kGlooBcubeMaxBytes in all, ring otherwise (docs/benchmarks.md, "Gloo's allreduce and
/// allgather algorithms").
enum class GlooAlgorithm : std::uint8_t { automatic, ring, bcube };

/// The largest buffer (in bytes) that GlooAlgorithm::automatic reduces or gathers with bcube.
inline constexpr std::size_t kGlooBcubeMaxBytes = std::size_t{1} << 20;

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
  /// The allreduce and allgather algorithms of the world and of every group made from it.
  GlooAlgorithm algorithm = GlooAlgorithm::automatic;
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

/// Connections kept across a job's epochs (docs/resilience.md, "Kept connections"): one Gloo
/// pair between every two processes of the job, spares included, made once. Each epoch's
/// world, and every group made from it, is a view over those pairs: making it connects
/// nothing (its first member names it through the store). When an epoch ends on a process,
/// every operation of its communicators fails at once and every peer is told (so one
/// blocked on this process fails at once too); the pairs that held an unfinished operation,
/// and only those, are made anew for the next epoch. Meant for Recovery
/// (Recovery::keep_connections); one thread per process uses it. Within an epoch, a group's
/// operation that passes its deadline ends that group only (its pairs stay open);
/// Work::done() says false until the work is waited for; every operation's bytes are
/// copied once more (into a buffer of its own, so that an operation ended early can never
/// receive into freed memory).
class GlooConnections {
 public:
  virtual ~GlooConnections() = default;
  /// The world of `epoch` (>= the last one given): rank r is process process_of[r], this
  /// process among them. The pairs with the processes in `renew` are made anew first (both
  /// ends of each such pair list each other). Collective over the epoch's world; keys under
  /// `prefix` (the epoch's). Throws TimeoutError, AbortedError (a member failed: the epoch's
  /// failure key, WaitWatch), BackendError.
  [[nodiscard]] virtual std::unique_ptr<Communicator> world(
      const std::string& prefix, std::int64_t epoch, const std::vector<std::int64_t>& process_of,
      const std::vector<std::int64_t>& renew) = 0;
  /// Ends the current epoch on this process (idempotent) and returns the processes whose
  /// pairs with this one must be made anew (they held an unfinished operation, or are
  /// closed). Never blocks on a peer.
  [[nodiscard]] virtual std::vector<std::int64_t> end_epoch() = 0;
  /// The epoch-end notices this process has sent, over every epoch so far: one per peer
  /// from a process that ended an epoch before any peer's notice of it arrived, none from
  /// one that learned of the end by a notice.
  [[nodiscard]] virtual std::int64_t notices_sent() const = 0;
};

/// Connects every two processes of a job: options.rank is this process, options.size the
/// job's processes (spares included), options.prefix the keys' prefix; the other options
/// as for make_gloo_world. Collective over every process of the job. Errors as
/// make_gloo_world's.
[[nodiscard]] std::shared_ptr<GlooConnections> make_gloo_connections(const GlooOptions& options);

}  // namespace commgrid
