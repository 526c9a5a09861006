// open_store: a store from its URL. kSchemes is the one place where a scheme maps to the
// store that serves it; a new store adds one entry.
#include <charconv>

#include "commgrid/launch_env.hpp"
#include "commgrid/store.hpp"
#include "etcd_store.hpp"
#include "tcp_store.hpp"

namespace commgrid {
namespace {

// Where a redis:// URI's userinfo ("[user]:password@") ends: at its last '@', since a
// password may hold '@' (and '/'); npos when there is none. A prefix may not hold '@'.
size_t userinfo_end(std::string_view uri) {
  constexpr std::string_view kRedis = "redis://";
  if (!uri.starts_with(kRedis)) return std::string_view::npos;
  const size_t at = uri.rfind('@');
  return at == std::string_view::npos || at < kRedis.size() ? std::string_view::npos : at;
}

// The URI as it may be shown: a Redis URI's whole userinfo is replaced by "***".
std::string shown_uri(std::string_view uri) {
  const size_t at = userinfo_end(uri);
  if (at == std::string_view::npos) return std::string(uri);
  return "redis://***@" + std::string(uri.substr(at + 1));
}

[[noreturn]] void bad_uri(std::string_view uri, const std::string& why) {
  throw ConfigError("store", "store '" + shown_uri(uri) + "': " + why +
                                 " (expected file:///absolute/folder, "
                                 "redis://[:password@]host:port[/prefix], tcp://host:port, "
                                 "etcd://host:port[,host:port...][/prefix] or memory)");
}

// "host:port" (the host may be "[v6]" or empty: the caller checks) split at the last ':'.
std::pair<std::string, int> host_port(std::string_view uri, std::string_view rest) {
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) bad_uri(uri, "expected host:port");
  std::string_view port_text = rest.substr(colon + 1);
  int port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 || port > 65535)
    bad_uri(uri, "port '" + std::string(port_text) + "' is not a number in [1, 65535]");
  return {std::string(rest.substr(0, colon)), port};
}

// Each opener gets the whole URI (for its errors) and what follows the scheme.
using Opener = std::shared_ptr<Store> (*)(std::string_view uri, std::string_view rest,
                                          const StoreOptions& options);

std::shared_ptr<Store> open_file(std::string_view uri, std::string_view rest,
                                 const StoreOptions& options) {
  std::string path(rest);
  if (path.empty() || path.front() != '/') bad_uri(uri, "the folder must be an absolute path");
  return make_file_store(path, options);
}

std::shared_ptr<Store> open_tcp(std::string_view uri, std::string_view rest,
                                const StoreOptions& options) {
  auto [host, port] = host_port(uri, rest);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return bootstrap::make_tcp_store(host, port, options);
}

std::shared_ptr<Store> open_redis(std::string_view uri, std::string_view rest,
                                  const StoreOptions& options) {
  constexpr std::string_view kRedis = "redis://";
  // redis://[user]:password@host... : the password is used, never shown.
  std::string password;
  if (const size_t at = userinfo_end(uri); at != std::string_view::npos) {
    std::string_view cred = uri.substr(kRedis.size(), at - kRedis.size());
    const auto c = cred.find(':');
    password = std::string(c == std::string_view::npos ? cred : cred.substr(c + 1));
    if (password.empty()) bad_uri(uri, "empty password before '@'");
    rest = uri.substr(at + 1);
  }
  if (password.empty()) password = read_launch_env().redis_password.value_or("");
  std::string prefix = "commgrid";
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    prefix = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
    if (prefix.empty()) bad_uri(uri, "empty key prefix after '/'");
  }
  const auto [host, port] = host_port(uri, rest);
  return make_redis_store(host, port, prefix, password, options);
}

std::shared_ptr<Store> open_etcd(std::string_view uri, std::string_view /*rest*/,
                                 const StoreOptions& options) {
  return bootstrap::make_etcd_store(uri, options);  // (it parses and masks its own URIs)
}

struct Scheme {
  std::string_view prefix;  // what the URI starts with
  Opener open;
};

// The one table of schemes ("memory" has no address and is matched whole).
constexpr Scheme kSchemes[] = {
    {"file://", open_file},
    {"redis://", open_redis},
    {"tcp://", open_tcp},
    {"etcd://", open_etcd},
};

}  // namespace

std::shared_ptr<Store> open_store(std::string_view uri, const StoreOptions& options) {
  if (uri == "memory") return make_memory_store();
  for (const Scheme& s : kSchemes)
    if (uri.starts_with(s.prefix)) return s.open(uri, uri.substr(s.prefix.size()), options);
  bad_uri(uri, "unknown scheme");
}

}  // namespace commgrid
