#include "commgrid/error.hpp"

namespace commgrid::detail {

void enforce_failed(const char* condition, const std::string& detail, const char* file, int line) {
  throw InternalError("internal error: " + std::string(condition) + " failed at " + file + ":" +
                      std::to_string(line) + (detail.empty() ? "" : ": " + detail));
}

}  // namespace commgrid::detail
