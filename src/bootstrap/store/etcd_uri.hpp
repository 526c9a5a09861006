// etcd:// URIs: `etcd://[user:password@]host:port[,host:port...][/prefix]`, parsed into the
// members to talk to, the credentials and the key prefix; shown with the password masked.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace commgrid::bootstrap::etcd {

inline constexpr std::string_view kScheme = "etcd://";

/// One member's client address.
struct Endpoint {
  std::string host;  // without brackets
  int port = 0;
  /// host:port ([host]:port for an IPv6 address).
  [[nodiscard]] std::string text() const;
};

struct EtcdUri {
  std::vector<Endpoint> endpoints;
  std::string user, password;  // the URI's userinfo (empty: none)
  std::string prefix;          // empty: commgrid/<job id>
  /// The members, comma-separated.
  [[nodiscard]] std::string hosts() const;
};

/// The URI as errors show it: the userinfo masked ("etcd://***@...").
std::string shown_uri(std::string_view uri);

/// ConfigError (parameter "store") naming the URI (masked), why, and the forms accepted.
[[noreturn]] void bad_uri(std::string_view uri, const std::string& why);

/// Parses an etcd:// URI (the caller checked the scheme); bad_uri for what is malformed.
EtcdUri parse_uri(std::string_view uri);

}  // namespace commgrid::bootstrap::etcd
