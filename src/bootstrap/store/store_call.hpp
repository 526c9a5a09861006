// How every store names a failure of its engine.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "commgrid/error.hpp"

namespace commgrid::bootstrap {

/// Runs fn, turning anything but commgrid's own errors into a BackendError naming the
/// operation and the store.
template <typename F>
void store_call(std::string_view op, const std::string& where, F&& fn) {
  try {
    std::forward<F>(fn)();
  } catch (const Error&) { throw; } catch (const std::exception& e) {
    throw BackendError("store " + std::string(op) + " on " + where + ": " + e.what());
  }
}

}  // namespace commgrid::bootstrap
