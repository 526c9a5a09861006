// etcd:// URIs (etcd_uri.hpp).
#include "etcd_uri.hpp"

#include <charconv>

#include "commgrid/error.hpp"

namespace commgrid::bootstrap::etcd {
namespace {

constexpr const char* kForms = "etcd://[user:password@]host:port[,host:port...][/prefix]";

// Where the userinfo ends: the URI's last '@' (a password may hold '@' and '/'; a prefix may
// not hold '@'); npos when there is none.
size_t userinfo_end(std::string_view uri) {
  const size_t at = uri.rfind('@');
  return at == std::string_view::npos || at < kScheme.size() ? std::string_view::npos : at;
}

// One member "host:port" (the host may be a bracketed IPv6 address).
Endpoint parse_member(std::string_view uri, std::string_view item) {
  const size_t colon = item.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    bad_uri(uri, "member '" + std::string(item) + "': expected host:port");
  const std::string_view port_text = item.substr(colon + 1);
  int port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 || port > 65535)
    bad_uri(uri, "member '" + std::string(item) + "': port '" + std::string(port_text) +
                     "' is not a number in [1, 65535]");
  std::string host(item.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, port};
}

}  // namespace

std::string Endpoint::text() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

std::string EtcdUri::hosts() const {
  std::string out;
  for (const auto& e : endpoints) out += (out.empty() ? "" : ",") + e.text();
  return out;
}

std::string shown_uri(std::string_view uri) {
  const size_t at = userinfo_end(uri);
  if (at == std::string_view::npos) return std::string(uri);
  return std::string(kScheme) + "***@" + std::string(uri.substr(at + 1));
}

void bad_uri(std::string_view uri, const std::string& why) {
  throw ConfigError("store",
                    "store '" + shown_uri(uri) + "': " + why + " (expected " + kForms + ")");
}

EtcdUri parse_uri(std::string_view uri) {
  EtcdUri out;
  std::string_view rest = uri.substr(kScheme.size());
  if (const size_t at = userinfo_end(uri); at != std::string_view::npos) {
    const std::string_view cred = uri.substr(kScheme.size(), at - kScheme.size());
    const size_t colon = cred.find(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == cred.size())
      bad_uri(uri, "the userinfo before '@' must be user:password");
    out.user = std::string(cred.substr(0, colon));
    out.password = std::string(cred.substr(colon + 1));
    rest = uri.substr(at + 1);
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    out.prefix = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
    if (out.prefix.empty()) bad_uri(uri, "empty key prefix after '/'");
    if (out.prefix.find_first_of(" \n\t") != std::string::npos)
      bad_uri(uri, "the key prefix may not hold spaces or newlines");
  }
  if (rest.empty()) bad_uri(uri, "no member host:port");
  while (true) {
    const size_t comma = rest.find(',');
    out.endpoints.push_back(parse_member(uri, rest.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

}  // namespace commgrid::bootstrap::etcd
