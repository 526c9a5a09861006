// Text helpers of the stores: bytes in hex, and bytes that came from a peer or a store made
// safe to put in a message.
#pragma once

#include <string>
#include <string_view>

namespace commgrid::bootstrap {

/// `bytes` as lowercase hex, two digits a byte.
[[nodiscard]] std::string hex_of(std::string_view bytes);

/// Text from the other end of a connection, as it may be shown: printable, bounded.
[[nodiscard]] std::string printable(std::string_view text);

/// A claim's text as it may appear in a message: it came from the store, so anyone who
/// could write there chose it.
[[nodiscard]] std::string shown(const std::string& text);

}  // namespace commgrid::bootstrap
