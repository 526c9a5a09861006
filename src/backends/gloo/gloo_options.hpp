// Checks of GlooOptions shared by the entries that place the rank themselves (the
// rank-threads runner, the world of a launched process). Private to the gloo backend.
#pragma once

#include <string>

#include "commgrid/error.hpp"
#include "commgrid/gloo.hpp"

namespace commgrid::gloo_backend {

/// Throws InvalidValueError naming options.store, rank or size when one is set: `who` (e.g.
/// "local ranks") places the rank itself.
inline void check_unset_placement(const GlooOptions& options, const std::string& who) {
  auto set = [&](const char* field, const std::string& value) {
    throw InvalidValueError(field, who + ": GlooOptions::" + field + " is set (" + value + "); " +
                                       who + " chooses it, leave it unset");
  };
  if (options.store) set("store", options.store->uri());
  if (options.rank != 0) set("rank", std::to_string(options.rank));
  if (options.size != 1) set("size", std::to_string(options.size));
}

}  // namespace commgrid::gloo_backend
