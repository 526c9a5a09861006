// Random secrets and keyed hashes (OpenSSL's libcrypto).
#include "secrets.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "commgrid/store.hpp"
#include "text.hpp"

namespace commgrid {
namespace bootstrap {

std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    throw BackendError("tcp store: OpenSSL RAND_bytes failed");
  return out;
}

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1)
    throw BackendError("store: OpenSSL RAND_bytes failed");
  return hex_of(raw);
}

bool same_secret(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace bootstrap

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
