// The host-side parts of the NCCL backend, apart from the device so that they are tested on
// machines without a GPU: the exchanges over the bootstrap communicator (unique ids, host
// names and devices), device choice, and the texts of errors.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"

namespace commgrid::nccl_host {

/// An ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES), opaque here.
inline constexpr std::size_t kUniqueIdBytes = 128;
using UniqueId = std::array<unsigned char, kUniqueIdBytes>;

/// The bootstrap tag of unique-id messages, and their length in int64 words (status, name
/// hash, id, error text).
inline constexpr int kUniqueIdTag = 0x6e63636c;  // "nccl"
inline constexpr std::size_t kIdMessageWords = 2 + kUniqueIdBytes / 8 + 25;

/// Makes a unique id, or throws (BackendError with NCCL's text). On the ranks that make one.
using MakeUniqueId = std::function<UniqueId()>;

/// Collective over `bootstrap`: `root` calls make() and every rank returns its id. When
/// make() throws on root, every rank throws BackendError carrying root's message (cut to
/// 200 bytes), so no rank waits for an id that never comes.
UniqueId broadcast_unique_id(Communicator& bootstrap, int root, const MakeUniqueId& make,
                             const std::string& what);

/// Only the members call it: `members` are ranks of `bootstrap`, ascending, this rank among
/// them. The first member calls make() and sends the id, with a hash of `name`, to every other
/// member at once (batch_isend_irecv); the others receive it. A member whose name differs
/// from the first member's throws BackendError naming both; a failing make() is reported to
/// every member.
UniqueId distribute_unique_id(Communicator& bootstrap, std::span<const int> members,
                              const std::string& name, const MakeUniqueId& make);

/// What one rank says about itself before the NCCL world is made.
struct HostInfo {
  std::string host;        ///< host name
  int device_count = 0;    ///< CUDA devices the process sees
  int device = -1;         ///< the device it chose (-1: none)
  std::string bus_id;      ///< that device's PCI bus id; empty without one
  std::string problem;     ///< why this rank cannot take part; empty when it can
};

/// Collective over `bootstrap`: every rank's HostInfo, in rank order (host names cut to 63
/// bytes, bus ids to 31, problems to 200).
std::vector<HostInfo> exchange_host_info(Communicator& bootstrap, const HostInfo& mine);

/// This rank's local rank and the number of ranks on its host, from exchanged host names.
struct LocalRank {
  int rank = 0;
  int size = 1;
};
LocalRank local_rank_of(const std::vector<HostInfo>& all, int rank);

/// The device of a rank: `requested` when given (InvalidValueError when it is not below
/// device_count), else the local rank, or 0 when the process sees exactly one device
/// (CUDA_VISIBLE_DEVICES per rank). Throws BackendError "no CUDA device ..." when
/// device_count is 0 (with `why`), and InvalidValueError when the local rank has no device
/// of its own.
int choose_device(std::optional<int> requested, LocalRank local, int device_count,
                  const std::string& host, const std::string& why);

/// The first problem among the exchanged infos, the same text on every rank: a rank's own
/// problem ("rank 3 (host gpu7): no CUDA device ..."), or two ranks of one host on one
/// device ("ranks 0 and 1 on host gpu7 both chose CUDA device 0 (bus 0000:3b:00.0); NCCL
/// needs one GPU per rank"). Empty when every rank can take part.
std::string world_problem(const std::vector<HostInfo>& all);

/// "[0,1,2,3]", at most 16 ranks then ",... (N ranks)".
std::string members_text(std::span<const std::int64_t> members);

/// The message of a creation or operation that did not complete in time:
/// "nccl <op> on <group> for <target>: did not complete within <t>; <aborted> aborted
/// (members [..])". `target` may be empty (an operation on the group itself).
std::string timeout_message(const std::string& op, const std::string& group,
                            const std::string& target, std::chrono::milliseconds timeout,
                            const std::string& aborted,
                            std::span<const std::int64_t> members);

/// A 64-bit FNV-1a hash of the members and name: what ranks compare to agree on a group.
std::uint64_t group_fingerprint(std::span<const int> members, const std::string& name);

}  // namespace commgrid::nccl_host
