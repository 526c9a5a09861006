// The runtime benchmarks of `commgrid bench init|collectives`, over any backend: each rank
// of a world runs them, and the results are reduced over the world so that rank 0 can print.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commgrid/communicator.hpp"
#include "commgrid/config.hpp"
#include "commgrid/process_groups.hpp"

namespace commgrid::bench {

/// One strategy's cost of ProcessGroups::initialize, over every rank of the world.
struct StrategyResult {
  CreationStrategy strategy{};
  /// Fastest repetition of the slowest rank's initialize (wall time, what the job waits).
  double seconds = 0;
  /// The same repetition's slowest rank: time in the backend's creation calls.
  double creation_seconds = 0;
  /// Backend creation calls per rank: the most any rank made, and the mean.
  std::int64_t creation_calls_max = 0;
  double creation_calls_mean = 0;
};

/// `bench init` on one world.
struct InitResult {
  std::string backend;
  int world_size = 0;
  int repeats = 0;
  std::int64_t kinds = 0, groups = 0;  ///< created by each strategy (every level)
  std::vector<StrategyResult> strategies;
};

/// Collective over `world`: initializes and destroys ProcessGroups `repeats` times per
/// strategy, the strategies interleaved within each repetition (so that noise on a shared
/// machine hits all of them), a barrier around each. Every rank returns the same result.
[[nodiscard]] InitResult run_init_bench(Communicator& world, const ParallelConfig& config,
                                        const std::vector<CreationStrategy>& strategies,
                                        int repeats);

/// The same collective called through the backend's own API, the reference for commgrid's
/// overhead. Implementations: raw MPI on an MpiCommunicator's native communicator, a raw
/// Gloo algorithm on the Gloo world's context.
class DirectCollectives {
 public:
  virtual ~DirectCollectives() = default;
  /// Sum of float32 over the world, as Communicator::allreduce.
  virtual void allreduce(const float* send, float* recv, std::size_t count) = 0;
  /// float32 in rank order, as Communicator::allgather.
  virtual void allgather(const float* send, float* recv, std::size_t count) = 0;
  /// Point to point between this rank and `peer`: `count` float32 there and back, the
  /// initiator sending first (a ping-pong; the blocking send and receive).
  virtual void pingpong(float* buf, std::size_t count, int peer, bool initiator) = 0;
  /// Sends `count` float32 to `peer` and receives as many from it, both posted before
  /// waiting (the batched symmetric exchange of a pipeline).
  virtual void exchange(const float* send, float* recv, std::size_t count, int peer) = 0;
  /// alltoallv of float32, counts per peer, blocks packed in rank order.
  virtual void alltoallv(const float* send, const std::vector<std::size_t>& send_counts,
                         float* recv, const std::vector<std::size_t>& recv_counts) = 0;
  /// What the direct calls are, for the report: "MPI_Allreduce / MPI_Allgather".
  [[nodiscard]] virtual std::string description() const = 0;
  /// `count` float32 that both sides read and write, each set to `value`: host memory, or
  /// device memory where the backend works on a device (NCCL).
  [[nodiscard]] virtual std::shared_ptr<float> buffer(std::size_t count, float value);
};

/// One operation at one size: commgrid and direct, interleaved in one run.
struct CollectiveResult {
  /// "allreduce", "allgather", "pingpong", "exchange" or "alltoallv"
  std::string op;
  /// per rank: the buffer reduced, the block each rank sends (to each peer for alltoallv),
  /// or the message (pingpong, exchange: ranks paired as r and r^1; an odd last rank idles)
  std::size_t bytes = 0;
  int iterations = 0;
  double commgrid_seconds = 0;  ///< median per call, slowest rank
  double direct_seconds = 0;    ///< median per call, slowest rank
};

/// `bench collectives` on one world.
struct CollectivesResult {
  std::string backend;
  std::string direct;
  int world_size = 0;
  std::vector<CollectiveResult> results;
};

/// Collective over `world` (and `direct`, which must be the same group): for each size and
/// op, alternates one commgrid call and one direct call, a barrier before each, `iterations`
/// times (fewer for large sizes: at least 5, about 1 GiB per rank for each op and side).
[[nodiscard]] CollectivesResult run_collectives_bench(Communicator& world,
                                                      DirectCollectives& direct,
                                                      const std::vector<std::size_t>& sizes,
                                                      int iterations);

/// The JSON documents and tables of both commands.
[[nodiscard]] nlohmann::ordered_json init_json(const InitResult& r, const ParallelConfig& config);
[[nodiscard]] std::string init_table(const InitResult& r, const ParallelConfig& config);
[[nodiscard]] nlohmann::ordered_json collectives_json(const CollectivesResult& r);
[[nodiscard]] std::string collectives_table(const CollectivesResult& r);

/// Parses "1KiB,64MiB" (suffixes B, KiB, MiB, GiB; a plain number is bytes); each size a
/// positive multiple of 4 bytes (float32). Throws InvalidValueError naming `param`.
[[nodiscard]] std::vector<std::size_t> parse_sizes(const std::string& param,
                                                   const std::string& text);

}  // namespace commgrid::bench
