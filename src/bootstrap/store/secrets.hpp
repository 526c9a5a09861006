// The stores' secrets: random bytes from OpenSSL's generator and constant-time comparison.
// (token_proof, the keyed hash of a token, is public: <commgrid/store.hpp>.)
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace commgrid::bootstrap {

/// The most bytes one call makes (RAND_bytes takes an int; no secret needs more).
inline constexpr std::size_t kMaxRandomBytes = std::size_t{1} << 20;

/// `n` random bytes from OpenSSL's generator (at most kMaxRandomBytes); RandomSourceError
/// when the generator fails.
[[nodiscard]] std::string random_bytes(std::size_t n);

/// `bytes` random bytes from OpenSSL's generator, in hex (random_bytes' errors).
[[nodiscard]] std::string random_hex(std::size_t bytes);

/// Whether two secrets are equal, compared in constant time for equal sizes.
[[nodiscard]] bool same_secret(std::string_view a, std::string_view b);

}  // namespace commgrid::bootstrap
