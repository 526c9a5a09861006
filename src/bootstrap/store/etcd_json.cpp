// The JSON of etcd v3's gateway (etcd_json.hpp).
#include "etcd_json.hpp"

#if COMMGRID_HAVE_CURL
#include <openssl/evp.h>

#include <algorithm>
#include <charconv>

#include "commgrid/error.hpp"

namespace commgrid::bootstrap::etcd {

std::string b64(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3), '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

std::string unb64(const std::string& s) {
  if (s.empty()) return {};
  std::string out(3 * (s.size() / 4) + 3, '\0');
  const int n =
      EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) throw BackendError("etcd: a reply held malformed base64");
  size_t pad = 0;
  for (size_t i = s.size(); i > 0 && s[i - 1] == '='; --i) ++pad;
  out.resize(static_cast<size_t>(n) - std::min<size_t>(pad, static_cast<size_t>(n)));
  return out;
}

std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::int64_t number(const json& j, const char* field) {
  if (!j.is_object() || !j.contains(field)) return 0;
  const json& v = j.at(field);
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    std::int64_t out = 0;
    std::from_chars(s.data(), s.data() + s.size(), out);
    return out;
  }
  return 0;
}

const json& field(const json& j, const char* name) {
  static const json kNull;
  if (j.is_object())
    if (const auto it = j.find(name); it != j.end()) return *it;
  return kNull;
}

const json& item(const json& j, size_t i) {
  static const json kNull;
  return j.is_array() && i < j.size() ? j[i] : kNull;
}

std::string text_of(const json& j, const char* name) {
  const json& v = field(j, name);
  return v.is_string() ? v.get<std::string>() : std::string();
}

json kvs_of(const json& txn_reply, size_t i) {
  const json& kvs = field(field(item(field(txn_reply, "responses"), i), "response_range"), "kvs");
  return kvs.is_array() ? kvs : json::array();
}

}  // namespace commgrid::bootstrap::etcd
#endif  // COMMGRID_HAVE_CURL
