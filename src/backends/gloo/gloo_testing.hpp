// What tests need to play a peer that runs Gloo's own algorithms inside a real commgrid
// group (e.g. one that makes progress slowly, step after step). Not installed; the library
// itself never calls it.
#pragma once

#include <cstdint>
#include <memory>

#include "commgrid/communicator.hpp"

namespace gloo {
class Context;
}

namespace commgrid::gloo_backend {

/// A Gloo group's context and the tag of the collective it would run next.
struct CollectiveForTesting {
  std::shared_ptr<::gloo::Context> context;
  std::uint32_t tag = 0;
};

/// Takes the next collective of `comm`, which must be a Gloo communicator (ConfigError
/// otherwise): every other rank of the group then runs its next collective with the tag
/// returned here, and this rank runs the same Gloo algorithm on `context` itself.
CollectiveForTesting take_collective_for_testing(Communicator& comm);

}  // namespace commgrid::gloo_backend
