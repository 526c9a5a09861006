// Turning Gloo's exceptions into commgrid's typed errors at each call site.
#pragma once

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/store.hpp"

namespace commgrid::gloo_backend {

/// "1, 4, 7": ranks in a message.
inline std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

/// Gloo prefixes its messages with "[file.cc:123] ", sometimes twice; the location inside
/// Gloo helps nobody reading a commgrid error, the rest of the text does.
std::string strip_gloo_location(std::string text);

/// Throws the commgrid error for a Gloo failure of `op` on `group`: TimeoutError when Gloo
/// reports a timeout, AbortedError when a peer closed its connection (it failed or exited),
/// BackendError otherwise. `hint` is appended after the Gloo text when not empty.
[[noreturn]] void rethrow_gloo(std::string_view op, const std::string& group,
                               const std::string& gloo_text, const std::string& hint = "");

/// Runs fn, translating Gloo's exceptions (gloo::Exception and its IoException,
/// gloo::EnforceNotMet) into commgrid errors naming the operation and the group. commgrid's
/// own errors pass through unchanged.
template <typename F>
void guard(std::string_view op, const std::string& group, F&& fn, const std::string& hint = "") {
  try {
    std::forward<F>(fn)();
  } catch (const Error&) { throw; } catch (const ::gloo::EnforceNotMet& e) {
    rethrow_gloo(op, group, e.what(), hint);
  } catch (const ::gloo::Exception& e) {
    rethrow_gloo(op, group, e.what(), hint);
  } catch (const std::exception& e) {
    // Gloo also throws plain std::runtime_error (e.g. slot overflow).
    rethrow_gloo(op, group, e.what(), hint);
  }
}

}  // namespace commgrid::gloo_backend
