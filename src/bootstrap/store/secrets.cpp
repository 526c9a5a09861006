// Random secrets and keyed hashes (OpenSSL's libcrypto).
#include "secrets.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "commgrid/store.hpp"
#include "text.hpp"

namespace commgrid {
namespace bootstrap {

std::string random_bytes(std::size_t n) {
  if (n > kMaxRandomBytes)
    throw InvalidValueError("bytes", "random bytes: at most " + std::to_string(kMaxRandomBytes) +
                                         " at once, asked for " + std::to_string(n));
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    char why[256] = "no reason given";
    if (const unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, why, sizeof why);
    throw RandomSourceError(std::string("OpenSSL RAND_bytes failed (") + why +
                            "): no secret can be made without a cryptographic random source");
  }
  return out;
}

std::string random_hex(std::size_t bytes) { return hex_of(random_bytes(bytes)); }

bool same_secret(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace bootstrap

std::string random_secret_hex(std::size_t bytes) {
  if (bytes == 0) throw InvalidValueError("bytes", "random_secret_hex: bytes must be >= 1, got 0");
  return bootstrap::random_hex(bytes);
}

std::string token_proof(const std::string& token, const std::string& context) {
  if (token.empty()) return "";
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(context.data()), context.size(), mac,
           &len) == nullptr)
    throw BackendError("token proof: OpenSSL HMAC-SHA256 failed");
  return bootstrap::hex_of(std::string_view(reinterpret_cast<const char*>(mac), len));
}

}  // namespace commgrid
