// Text helpers of the stores: hex, and the one way a peer's bytes enter a message.
#include "text.hpp"

#include "commgrid/store.hpp"

namespace commgrid {
namespace bootstrap {

std::string hex_of(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

}  // namespace bootstrap

std::string quote_untrusted(std::string_view bytes, std::size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (const char ch : bytes.substr(0, max_bytes)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  out += '\'';
  if (bytes.size() > max_bytes) out += "... (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

}  // namespace commgrid
