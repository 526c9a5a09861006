#include "gloo_errors.hpp"

#include <algorithm>
#include <cctype>

namespace commgrid::gloo_backend {

std::string strip_gloo_location(std::string text) {
  for (;;) {
    size_t start = text.find_first_not_of(' ');
    if (start == std::string::npos || text[start] != '[') break;
    size_t close = text.find("] ", start);
    if (close == std::string::npos) break;
    // Only a "[path.cc:123]" bracket is a location; "[127.0.0.1]:port" is a peer address.
    std::string inside = text.substr(start + 1, close - start - 1);
    bool location = inside.find(".cc:") != std::string::npos ||
                    inside.find(".h:") != std::string::npos ||
                    inside.find(".cpp:") != std::string::npos;
    if (!location) break;
    text.erase(0, close + 2);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

namespace {

bool contains_nocase(std::string_view hay, std::string_view needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return std::tolower(a) == std::tolower(b); });
  return it != hay.end();
}

}  // namespace

void rethrow_gloo(std::string_view op, const std::string& group, const std::string& gloo_text,
                  const std::string& hint) {
  std::string text = strip_gloo_location(gloo_text);
  std::string msg = "gloo " + std::string(op) + " on " + group + ": " + text;
  if (!hint.empty()) msg += " (" + hint + ")";
  if (contains_nocase(text, "timeout") || contains_nocase(text, "timed out"))
    throw TimeoutError(msg);
  if (contains_nocase(text, "closed by peer") || contains_nocase(text, "reset by peer") ||
      contains_nocase(text, "broken pipe") || contains_nocase(text, "connection refused"))
    throw AbortedError(msg + " (a peer rank of " + group + " failed or exited)");
  // A view over kept connections whose epoch ended (mesh_view.hpp).
  if (contains_nocase(text, "ended epoch")) throw AbortedError(msg);
  throw BackendError(msg);
}

}  // namespace commgrid::gloo_backend
