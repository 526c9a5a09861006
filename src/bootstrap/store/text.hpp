// Text helpers of the stores: bytes in hex. (Bytes from a peer or a store are shown with
// quote_untrusted, <commgrid/store.hpp>.)
#pragma once

#include <string>
#include <string_view>

namespace commgrid::bootstrap {

/// `bytes` as lowercase hex, two digits a byte.
[[nodiscard]] std::string hex_of(std::string_view bytes);

}  // namespace commgrid::bootstrap
