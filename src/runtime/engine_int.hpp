// A rank, a size or a member as the engine's int (MPI, NCCL and Gloo number ranks with int).
// Private to the runtime and the backends: the Communicator contract has already checked
// that every rank it passes on lies in [0, size()), and a world's size is at most 2^31 - 1,
// so the narrowing never loses a value; the check below guards that invariant.
#pragma once

#include <climits>
#include <span>
#include <string>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/error.hpp"

namespace commgrid::detail {

/// `r` as an int; InternalError (an invariant broken) when it does not fit.
inline int engine_int(Rank r) {
  COMMGRID_ENFORCE(r >= INT_MIN && r <= INT_MAX,
                   "rank " + std::to_string(r) + " does not fit the engine's int");
  return static_cast<int>(r);
}

/// Every rank of `ranks` as an int.
inline std::vector<int> engine_ints(std::span<const Rank> ranks) {
  std::vector<int> out;
  out.reserve(ranks.size());
  for (Rank r : ranks) out.push_back(engine_int(r));
  return out;
}

}  // namespace commgrid::detail
