// Text helpers of the stores.
#include "text.hpp"

namespace commgrid::bootstrap {

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

std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 300)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

std::string shown(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 128)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return text.size() > 128 ? out + "..." : out;
}

}  // namespace commgrid::bootstrap
