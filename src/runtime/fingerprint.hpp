// commgrid's one fingerprint: what ranks exchange to agree that they were given the same
// thing (a config and its options, a group's members and name) before they wait for each
// other, and what names a group in tags and messages. 64-bit FNV-1a over the bytes fed in,
// in order: cheap, stable across processes and builds of the same source (unlike
// std::hash), and not a secret (the job's token is proven with HMAC, see store.hpp). Not
// installed: the runtime and the backends share it from this tree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "commgrid/axis.hpp"

namespace commgrid::detail {

class Fingerprint {
 public:
  /// Feeds raw bytes.
  Fingerprint& bytes(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= kPrime;
    }
    return *this;
  }
  /// Feeds a text's characters (no terminator, no length).
  Fingerprint& text(std::string_view s) noexcept { return bytes(s.data(), s.size()); }
  /// Feeds ranks as their bytes, in order.
  Fingerprint& ranks(std::span<const Rank> v) noexcept { return bytes(v.data(), v.size_bytes()); }

  [[nodiscard]] std::uint64_t value() const noexcept { return h_; }
  /// 63 bits: a non-negative int64 whose negation cannot overflow (for a min taken as a
  /// max of negated values in one max-allreduce).
  [[nodiscard]] std::int64_t value63() const noexcept {
    return static_cast<std::int64_t>(h_ & 0x7fffffffffffffffULL);
  }

 private:
  static constexpr std::uint64_t kBasis = 14695981039346656037ULL;
  static constexpr std::uint64_t kPrime = 1099511628211ULL;
  std::uint64_t h_ = kBasis;
};

/// The fingerprint of a text.
inline std::uint64_t fingerprint(std::string_view s) noexcept {
  return Fingerprint().text(s).value();
}

/// The fingerprint of a group: its name, then its members (ranks of the parent, as passed to
/// create_group*). What ranks compare before creating it together.
inline std::uint64_t group_fingerprint(std::span<const Rank> members,
                                       std::string_view name) noexcept {
  return Fingerprint().text(name).ranks(members).value();
}

}  // namespace commgrid::detail
