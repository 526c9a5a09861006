// The etcd:// store: every Store operation on etcd v3's JSON gateway (HTTP/1.1 POSTs to
// /v3/kv/range, /v3/kv/txn, /v3/watch, /v3/auth/*) through libcurl, the JSON by nlohmann-json.
//
// - Keys live under the job's prefix ("commgrid/<job id>" unless the URI names one), which the
//   job claims (<prefix>/commgrid-job: the id and a keyed hash of the token, as on Redis).
// - Every request of a process with an identity (StoreOptions::process) is a transaction whose
//   first comparison is "my fence key does not exist": once the job fences the identity
//   (<prefix>/commgrid-fence/<identity>), etcd itself refuses its every write and read, and
//   the process learns why (FencedError with the fence's message).
// - A write is a transaction "the key does not exist -> put", so keys are written once as the
//   Store contract says, and set_if_absent is decided by etcd's raft log.
// - A wait is one range read (what is there, at which revision) and then one watch from the
//   next revision on the keys' common prefix: no polling, and no event is missed between
//   them.
// - Several members: a request that cannot reach one member (refused, timed out, the member
//   has no leader) goes to the next, until the store's timeout.
// - Authentication: the URI's user and password, else, with a token, the job's user
//   "commgrid-<job id>" with a password derived from the token (HMAC-SHA256, so etcd never
//   sees the token). grant_etcd_job creates that user with a role that may use the prefix.
#include "etcd_store.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#if COMMGRID_HAVE_CURL
#include <curl/curl.h>

#include <nlohmann/json.hpp>
#endif

#include "job_claim.hpp"
#include "secrets.hpp"

namespace commgrid {
namespace bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

constexpr std::string_view kScheme = "etcd://";
constexpr const char* kForms = "etcd://[user:password@]host:port[,host:port...][/prefix]";

struct Endpoint {
  std::string host;  // without brackets
  int port = 0;
  [[nodiscard]] std::string text() const {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
           std::to_string(port);
  }
};

struct EtcdUri {
  std::vector<Endpoint> endpoints;
  std::string user, password;  // the URI's userinfo (empty: none)
  std::string prefix;          // empty: commgrid/<job id>
  [[nodiscard]] std::string hosts() const {
    std::string out;
    for (const auto& e : endpoints) out += (out.empty() ? "" : ",") + e.text();
    return out;
  }
};

// Where the userinfo ends: the URI's last '@' (a password may hold '@' and '/'; a prefix may
// not hold '@'); npos when there is none.
size_t userinfo_end(std::string_view uri) {
  const size_t at = uri.rfind('@');
  return at == std::string_view::npos || at < kScheme.size() ? std::string_view::npos : at;
}

std::string shown_uri(std::string_view uri) {
  const size_t at = userinfo_end(uri);
  if (at == std::string_view::npos) return std::string(uri);
  return std::string(kScheme) + "***@" + std::string(uri.substr(at + 1));
}

[[noreturn]] void bad_uri(std::string_view uri, const std::string& why) {
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
    const std::string_view item = rest.substr(0, comma);
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
    out.endpoints.push_back({host, port});
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

#if COMMGRID_HAVE_CURL

using json = nlohmann::json;

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

// The end of the range of every key that starts with `prefix` (etcd's range_end).
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

// Members of a reply that may be absent (proto3's JSON omits default values).
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
// The key-values of a transaction's i-th response (a range): an empty array when none.
json kvs_of(const json& txn_reply, size_t i) {
  const json& kvs = field(field(item(field(txn_reply, "responses"), i), "response_range"), "kvs");
  return kvs.is_array() ? kvs : json::array();
}
std::string text_of(const json& j, const char* name) {
  const json& v = field(j, name);
  return v.is_string() ? v.get<std::string>() : std::string();
}

std::string seconds_text(Ms d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// etcd's answer to a request it refused (an HTTP error with {"code", "message"}: gRPC's codes).
struct Refusal {
  int code = 0;
  std::string message;
};

enum : int {
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kUnavailable = 14,
  kUnauthenticated = 16,
};

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One HTTP client for a store object: requests are serialized by the Store's mutex.
class EtcdClient {
 public:
  EtcdClient(EtcdUri uri, std::string where, std::string user, std::string password, Ms timeout,
             const std::atomic<bool>* abort)
      : uri_(std::move(uri)), where_(std::move(where)), user_(std::move(user)),
        password_(std::move(password)), timeout_(timeout), abort_(abort),
        tokens_(uri_.endpoints.size()), last_error_(uri_.endpoints.size()) {
    curl_init_once();
    curl_ = curl_easy_init();
    if (curl_ == nullptr) throw BackendError("etcd store " + where_ + ": curl_easy_init failed");
  }
  ~EtcdClient() {
    curl_slist_free_all(headers_);
    curl_easy_cleanup(curl_);
  }
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  /// POSTs `body` to `path` on a member, failing over until the timeout. `ambiguous` (when
  /// given) turns true if an earlier attempt may have been applied although no reply came.
  json call(const std::string& path, const json& body, bool* ambiguous = nullptr) {
    const auto deadline = Clock::now() + timeout_;
    const std::string text = body.dump();
    Ms pause(20);
    for (size_t tried = 0;; ++tried) {
      const size_t e = current_;
      if (credentials() && tokens_[e].empty() && path.rfind("/v3/auth/authenticate", 0) != 0) {
        if (!authenticate(e, deadline)) {
          rotate(e);
          if (!wait_before_next(tried, deadline, pause)) throw timed_out();
          continue;
        }
      }
      Attempt a = attempt(e, path, text, deadline);
      if (a.ok) {
        if (a.resent && ambiguous != nullptr) *ambiguous = true;
        return std::move(a.reply);
      }
      if (a.sent && ambiguous != nullptr) *ambiguous = true;
      if (a.refusal) {
        const Refusal& r = *a.refusal;
        // A token etcd no longer takes: expired, another member's, or older than a change of
        // users and roles ("revision of auth store is old"): log in again.
        if ((r.code == kUnauthenticated ||
             r.message.find("auth store is old") != std::string::npos) &&
            credentials()) {
          tokens_[e].clear();  // a member's simple token is its own, and expires
          continue;
        }
        if (!retryable(r)) throw_refused(r);
        last_error_[e] = "etcd: " + r.message;
      }
      rotate(e);
      if (!wait_before_next(tried, deadline, pause)) throw timed_out();
    }
  }

  /// Watches [key, range_end) from `revision` on the current member for at most `slice`,
  /// erasing from `missing` each key put meanwhile; ends early when `missing` is empty or the
  /// store is aborted. A member that fails is left for the next (the caller asks again).
  void watch(const std::string& key, const std::string& range_end, std::int64_t revision,
             std::set<std::string>& missing, Ms slice) {
    const size_t e = current_;
    if (credentials() && tokens_[e].empty() &&
        !authenticate(e, Clock::now() + std::min(slice, timeout_))) {
      rotate(e);
      return;
    }
    json req;
    req["create_request"] = {
        {"key", b64(key)}, {"range_end", b64(range_end)}, {"start_revision", revision}};
    Stream s{&missing, {}, false, {}};
    set_common(e, "/v3/watch", req.dump(), slice);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, &EtcdClient::on_stream);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &s);
    const CURLcode rc = curl_easy_perform(curl_);
    reset_handlers();
    if (s.refusal) {
      if (s.refusal->code == kUnauthenticated ||
          s.refusal->message.find("auth store is old") != std::string::npos)
        tokens_[e].clear();
      else if (!retryable(*s.refusal)) throw_refused(*s.refusal);
      rotate(e);
      return;
    }
    // Ended by us (every key came, abort, cancel) or by the slice: both normal.
    if (rc == CURLE_OK || rc == CURLE_WRITE_ERROR || rc == CURLE_OPERATION_TIMEDOUT ||
        rc == CURLE_ABORTED_BY_CALLBACK)
      return;
    last_error_[e] = curl_easy_strerror(rc);
    rotate(e);
  }

  /// The local address of the last connection to a member.
  [[nodiscard]] std::string local_address() const { return local_; }
  [[nodiscard]] const std::string& where() const { return where_; }

  /// Whether the cluster has authentication off (found when authenticating).
  [[nodiscard]] bool auth_disabled() const { return auth_disabled_; }

  /// Authenticates with the client's credentials at some member within the timeout: false
  /// when the cluster has authentication off; AuthenticationError when refused.
  bool login() {
    const auto deadline = Clock::now() + timeout_;
    Ms pause(20);
    for (size_t tried = 0;; ++tried) {
      const size_t e = current_;
      if (authenticate(e, deadline)) return !auth_disabled_;
      rotate(e);
      if (!wait_before_next(tried, deadline, pause)) throw timed_out();
    }
  }

 private:
  struct Attempt {
    bool ok = false;
    bool sent = false;  // the request may have reached the member
    // libcurl sent the request again on a fresh connection (a kept-alive one died before any
    // reply byte: libcurl retries that itself): the first may have been applied.
    bool resent = false;
    json reply;
    std::optional<Refusal> refusal;
  };
  struct Stream {
    std::set<std::string>* missing;
    std::string buffer;
    bool stop;
    std::optional<Refusal> refusal;
  };

  [[nodiscard]] bool credentials() const { return !user_.empty() && !auth_disabled_; }

  static bool retryable(const Refusal& r) {
    if (r.code == kUnavailable || r.code == kDeadlineExceeded || r.code == kResourceExhausted)
      return true;
    for (const char* m : {"no leader", "leader changed", "timed out", "not capable", "too many"})
      if (r.message.find(m) != std::string::npos) return true;
    return false;
  }

  [[noreturn]] void throw_refused(const Refusal& r) const {
    const std::string head = "etcd store " + where_ + ": ";
    if (r.code == kPermissionDenied)
      throw AuthenticationError(head + "etcd refused the request (" + r.message + "): user '" +
                                user_ + "' may not use the job's keys (docs/security.md)");
    if (r.message.find("user name is empty") != std::string::npos)
      throw AuthenticationError(head +
                                "etcd requires authentication, and this job has neither a "
                                "user in the URI nor a COMMGRID_TOKEN (docs/security.md)");
    if (r.code == kUnauthenticated || r.message.find("authentication failed") != std::string::npos)
      throw AuthenticationError(head + "etcd refused user '" + user_ + "' (" + r.message + ")");
    throw BackendError(head + "etcd refused the request: " + r.message);
  }

  [[nodiscard]] TimeoutError timed_out() const {
    std::string why;
    for (size_t i = 0; i < uri_.endpoints.size(); ++i)
      why += (i ? "; " : "") + uri_.endpoints[i].text() + ": " +
             (last_error_[i].empty() ? "not tried" : last_error_[i]);
    return TimeoutError("etcd store " + where_ + ": no member answered within " +
                        seconds_text(timeout_) + " (" + why + ")");
  }

  void rotate(size_t from) {
    if (current_ == from) current_ = (from + 1) % uri_.endpoints.size();
  }

  // After a failed attempt: at once to the next member, and after each round of all of them
  // a pause (20 ms doubling to 0.5 s); false when the deadline has passed.
  bool wait_before_next(size_t tried, Clock::time_point deadline, Ms& pause) {
    if (abort_ != nullptr && abort_->load()) return false;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if ((tried + 1) % uri_.endpoints.size() == 0) {
      std::this_thread::sleep_for(
          std::min<Ms>(pause, std::chrono::duration_cast<Ms>(deadline - now)));
      pause = std::min(pause * 2, Ms(500));
    }
    return Clock::now() < deadline;
  }

  // false: the member is unreachable (try another); throws when etcd refused the user.
  bool authenticate(size_t e, Clock::time_point deadline) {
    const json body{{"name", user_}, {"password", password_}};
    Attempt a = attempt(e, "/v3/auth/authenticate", body.dump(), deadline);
    if (a.ok) {
      tokens_[e] = text_of(a.reply, "token");
      return true;
    }
    if (a.refusal) {
      if (a.refusal->code == kFailedPrecondition &&
          a.refusal->message.find("not enabled") != std::string::npos) {
        auth_disabled_ = true;  // an open cluster: the claim is the job's only guard
        return true;
      }
      if (a.refusal->message.find("authentication failed") != std::string::npos)
        throw AuthenticationError(
            "etcd store " + where_ + ": etcd refused user '" + user_ + "' (" + a.refusal->message +
            "): " +
            (user_.rfind("commgrid-", 0) == 0
                 ? "the job's user does not exist or COMMGRID_TOKEN differs from its job's "
                   "(grant it first: commgrid launch with COMMGRID_ETCD_ROOT_PASSWORD, or "
                   "grant_etcd_job; docs/security.md)"
                 : "a wrong user or password in the URI"));
      if (!retryable(*a.refusal)) throw_refused(*a.refusal);
      last_error_[e] = "etcd: " + a.refusal->message;
    }
    return false;
  }

  void set_common(size_t e, const std::string& path, const std::string& body, Ms bound) {
    curl_easy_reset(curl_);
    url_ = "http://" + uri_.endpoints[e].text() + path;
    curl_easy_setopt(curl_, CURLOPT_URL, url_.c_str());
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_POST, 1L);
    body_ = body;
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body_.c_str());
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(body_.size()));
    curl_slist_free_all(headers_);
    headers_ = curl_slist_append(nullptr, "Content-Type: application/json");
    if (!tokens_[e].empty() && path != "/v3/auth/authenticate")
      headers_ = curl_slist_append(headers_, ("Authorization: " + tokens_[e]).c_str());
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers_);
    const long ms = static_cast<long>(std::max<long long>(1, bound.count()));
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, ms);
    // A member that is cut off takes the connect's whole bound: keep it short enough to try
    // another within the timeout.
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS,
                     std::min<long>(ms, std::clamp<long>(timeout_.count() / 4, 200, 2000)));
    curl_easy_setopt(curl_, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl_, CURLOPT_XFERINFOFUNCTION, &EtcdClient::on_progress);
    curl_easy_setopt(curl_, CURLOPT_XFERINFODATA, this);
    curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, error_);
    error_[0] = '\0';
    // How many times libcurl sent the request (its debug callback sees each request's head
    // once it is written; nothing is printed).
    requests_sent_ = 0;
    curl_easy_setopt(curl_, CURLOPT_DEBUGFUNCTION, &EtcdClient::on_debug);
    curl_easy_setopt(curl_, CURLOPT_DEBUGDATA, this);
    curl_easy_setopt(curl_, CURLOPT_VERBOSE, 1L);
  }

  static int on_debug(CURL*, curl_infotype type, char* data, size_t size, void* user) {
    // A request's head starts with its method (the rest of a head written in parts does not).
    if (type == CURLINFO_HEADER_OUT && size >= 5 && std::memcmp(data, "POST ", 5) == 0)
      ++static_cast<EtcdClient*>(user)->requests_sent_;
    return 0;
  }

  void reset_handlers() {
    char* ip = nullptr;
    if (curl_easy_getinfo(curl_, CURLINFO_LOCAL_IP, &ip) == CURLE_OK && ip != nullptr && *ip)
      local_ = ip;
  }

  Attempt attempt(size_t e, const std::string& path, const std::string& body,
                  Clock::time_point deadline) {
    Attempt a;
    const Ms left = std::chrono::duration_cast<Ms>(deadline - Clock::now());
    if (left <= Ms(0)) return a;
    // One attempt takes at most half the timeout (at least 0.5 s): a member that took the
    // request but cannot answer (no quorum) leaves time for another.
    const Ms bound = std::min(left, std::max(Ms(500), timeout_ / 2));
    std::string reply;
    set_common(e, path, body, bound);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, &EtcdClient::on_body);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &reply);
    const CURLcode rc = curl_easy_perform(curl_);
    reset_handlers();
    if (rc != CURLE_OK) {
      last_error_[e] = error_[0] != '\0' ? error_ : curl_easy_strerror(rc);
      // Whether the member may have applied it: the request was sent (also when libcurl's
      // own retry on a fresh connection then failed to connect: a member that died after
      // applying it), or anything but a connection never made (a kept-alive connection
      // reports no connect time, so the phase is read from curl's words: "Connection timed
      // out ..." / "Failed to connect ..." while connecting, "Operation timed out ..." after).
      const std::string& what = last_error_[e];
      a.sent =
          requests_sent_ > 0 ||
          (rc != CURLE_COULDNT_CONNECT && rc != CURLE_COULDNT_RESOLVE_HOST &&
           what.rfind("Connection timed out", 0) != 0 && what.rfind("Failed to connect", 0) != 0);
      return a;
    }
    long status = 0;
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &status);
    json j = json::parse(reply, nullptr, false);
    if (status == 200 && j.is_object()) {
      a.ok = true;
      a.resent = requests_sent_ > 1;
      a.reply = std::move(j);
      return a;
    }
    a.sent = true;
    Refusal r;
    r.code = j.is_object() ? static_cast<int>(number(j, "code")) : 0;
    r.message = text_of(j, "message");
    if (r.message.empty()) r.message = text_of(j, "error");
    if (r.message.empty())
      r.message = "HTTP " + std::to_string(status) + " " + reply.substr(0, 200);
    a.refusal = std::move(r);
    return a;
  }

  static size_t on_body(char* data, size_t size, size_t n, void* user) {
    auto* out = static_cast<std::string*>(user);
    // A value is at most the Store's largest (64 MiB), base64 and JSON around it.
    if (out->size() + size * n > (size_t{128} << 20)) return 0;
    out->append(data, size * n);
    return size * n;
  }

  static size_t on_stream(char* data, size_t size, size_t n, void* user) {
    auto* s = static_cast<Stream*>(user);
    s->buffer.append(data, size * n);
    for (size_t nl; (nl = s->buffer.find('\n')) != std::string::npos;) {
      const json j = json::parse(s->buffer.substr(0, nl), nullptr, false);
      s->buffer.erase(0, nl + 1);
      if (!j.is_object()) continue;
      if (const json& err = field(j, "error"); !err.is_null()) {
        const std::string m = err.is_object() ? text_of(err, "message") : "";
        s->refusal = Refusal{static_cast<int>(number(err, "code")), m.empty() ? "watch failed" : m};
        return 0;
      }
      const json& r = field(j, "result");
      if (field(r, "canceled") == true || number(r, "compact_revision") != 0) return 0;
      const json& events = field(r, "events");
      for (size_t i = 0; events.is_array() && i < events.size(); ++i) {
        const json& ev = events[i];
        if (!text_of(ev, "type").empty() && text_of(ev, "type") != "PUT") continue;
        s->missing->erase(unb64(text_of(field(ev, "kv"), "key")));
      }
      if (s->missing->empty()) return 0;
    }
    return s->buffer.size() > (size_t{256} << 20) ? 0 : size * n;
  }

  static int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    const auto* self = static_cast<EtcdClient*>(user);
    return self->abort_ != nullptr && self->abort_->load() ? 1 : 0;
  }

  EtcdUri uri_;
  std::string where_, user_, password_;
  Ms timeout_;
  const std::atomic<bool>* abort_;
  std::vector<std::string> tokens_;  // each member's auth token ("simple" tokens are per member)
  std::vector<std::string> last_error_;
  size_t current_ = 0;
  bool auth_disabled_ = false;
  std::string local_ = "127.0.0.1";
  CURL* curl_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::string url_, body_;
  char error_[CURL_ERROR_SIZE] = {};
  int requests_sent_ = 0;  // by the transfer in progress (on_debug)
};

std::string job_user(const std::string& job_id) { return "commgrid-" + job_id; }
std::string job_password(const StoreOptions& o) {
  return token_proof(o.token, "commgrid etcd password\n" + o.job_id);
}

class EtcdStore final : public Store {
 public:
  EtcdStore(const EtcdUri& uri, const StoreOptions& o)
      : prefix_(uri.prefix.empty() ? "commgrid/" + o.job_id : uri.prefix),
        where_("etcd://" + uri.hosts() + "/" + prefix_), identity_(o.process),
        client_(uri, where_, uri.user.empty() && !o.token.empty() ? job_user(o.job_id) : uri.user,
                uri.user.empty() && !o.token.empty() ? job_password(o) : uri.password, o.timeout,
                &abort_flag()) {}

  std::string uri() const override { return where_; }
  std::string local_address() const override { return client_.local_address(); }

  /// Claims the prefix for the job (or checks the claim), and sets the job secret.
  void claim(const StoreOptions& o) {
    const std::string mine = new_claim(o);
    std::string found;
    if (put_if_absent(full("commgrid-job"), mine, &found)) {
      set_job_secret(parse_claim(mine).secret);
      return;
    }
    set_job_secret(accept_claim(where_, found, o));
  }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (!put_if_absent(full(key), std::string(value.begin(), value.end()), nullptr))
      throw BackendError("store set on " + where_ + ": key '" + key + "' is already set");
  }
  bool do_set_if_absent(const std::string& key, const std::vector<char>& value) override {
    return put_if_absent(full(key), std::string(value.begin(), value.end()), nullptr);
  }
  std::vector<char> do_get(const std::string& key) override {
    const json r = guarded(json::array({{{"request_range", {{"key", b64(full(key))}}}}}));
    const json kvs = kvs_of(r, 0);
    if (kvs.empty())
      throw BackendError("store get on " + where_ + ": key '" + key + "' is not set");
    const std::string v = unb64(text_of(kvs[0], "value"));
    return {v.begin(), v.end()};
  }
  bool do_has(const std::string& key) override {
    const json r = guarded(
        json::array({{{"request_range", {{"key", b64(full(key))}, {"count_only", true}}}}}));
    return number(field(item(field(r, "responses"), 0), "response_range"), "count") > 0;
  }
  // What is there now (one range read over the keys' common prefix), then a watch from the
  // next revision for the rest of the slice.
  std::vector<std::string> do_wait(std::vector<std::string> keys, Ms slice) override {
    if (keys.empty()) return keys;
    std::set<std::string> missing;
    for (const auto& k : keys) missing.insert(full(k));
    std::string common = *missing.begin();
    for (const auto& k : missing) {
      size_t i = 0;
      while (i < common.size() && i < k.size() && common[i] == k[i]) ++i;
      common.resize(i);
    }
    const std::string end = prefix_end(common);
    const json r = guarded(
        json::array({{{"request_range",
                       {{"key", b64(common)}, {"range_end", b64(end)}, {"keys_only", true}}}}}));
    for (const json& kv : kvs_of(r, 0)) missing.erase(unb64(text_of(kv, "key")));
    if (!missing.empty() && slice > Ms(0))
      client_.watch(common, end, number(field(r, "header"), "revision") + 1, missing, slice);
    std::erase_if(keys, [&](const std::string& k) { return missing.count(full(k)) == 0; });
    return keys;
  }
  [[nodiscard]] bool waits_in_slices() const override { return true; }
  // The fence key: every later request of `process` compares it absent, so etcd refuses them.
  bool do_fence(const std::string& process, const std::string& message) override {
    (void)put_if_absent(fence_key(process), message, nullptr);
    return true;
  }

 private:
  [[nodiscard]] std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  [[nodiscard]] std::string fence_key(const std::string& identity) const {
    return prefix_ + "/commgrid-fence/" + identity;
  }

  // A transaction: if this process is not fenced, `ops`; else FencedError with the fence's
  // message. Returns the reply of a transaction that succeeded.
  json guarded(const json& ops) {
    json txn{{"success", ops}};
    if (!identity_.empty()) {
      txn["compare"] = json::array({fence_absent()});
      txn["failure"] = json::array({{{"request_range", {{"key", b64(fence_key(identity_))}}}}});
    }
    json r = client_.call("/v3/kv/txn", txn);
    if (field(r, "succeeded") != true) throw_fenced(kvs_of(r, 0));
    return r;
  }

  json fence_absent() const {
    return {{"key", b64(fence_key(identity_))},
            {"target", "VERSION"},
            {"result", "EQUAL"},
            {"version", "0"}};
  }

  [[noreturn]] void throw_fenced(const json& kvs) {
    const std::string message = kvs.empty() ? "" : unb64(text_of(kvs[0], "value"));
    throw FencedError(message.empty() ? "etcd store " + where_ + ": " + identity_ + " is fenced"
                                      : message);
  }

  // Puts `value` at `key` unless the key exists (one transaction, guarded by this process's
  // fence): true when this call put it. `found` receives the value that was there. After an
  // attempt that may have been applied without a reply, a key holding exactly this value
  // counts as this call's.
  bool put_if_absent(const std::string& key, const std::string& value, std::string* found) {
    json compare = json::array();
    json failure = json::array({{{"request_range", {{"key", b64(key)}}}}});
    if (!identity_.empty()) {
      compare.push_back(fence_absent());
      failure.push_back({{"request_range", {{"key", b64(fence_key(identity_))}}}});
    }
    compare.push_back(
        {{"key", b64(key)}, {"target", "VERSION"}, {"result", "EQUAL"}, {"version", "0"}});
    const json txn{
        {"compare", compare},
        {"success", json::array({{{"request_put", {{"key", b64(key)}, {"value", b64(value)}}}}})},
        {"failure", failure}};
    bool ambiguous = false;
    const json r = client_.call("/v3/kv/txn", txn, &ambiguous);
    if (field(r, "succeeded") == true) return true;
    if (!identity_.empty() && !kvs_of(r, 1).empty()) throw_fenced(kvs_of(r, 1));
    const json kvs = kvs_of(r, 0);
    const std::string there = kvs.empty() ? "" : unb64(text_of(kvs[0], "value"));
    if (found != nullptr) *found = there;
    return ambiguous && there == value;
  }

  std::string prefix_, where_, identity_;
  EtcdClient client_;
};

#endif  // COMMGRID_HAVE_CURL

}  // namespace

bool is_etcd_uri(std::string_view uri) { return uri.starts_with(kScheme); }

std::shared_ptr<Store> make_etcd_store(std::string_view uri, const StoreOptions& options) {
  const EtcdUri parsed = parse_uri(uri);
#if !COMMGRID_HAVE_CURL
  (void)options;
  throw ConfigError("store", "store '" + shown_uri(uri) +
                                 "': this build of commgrid has no etcd support (libcurl was not "
                                 "found when it was built: libcurl4-openssl-dev)");
#else
  auto store = std::make_shared<EtcdStore>(parsed, options);
  store->claim(options);
  join_as_rank(*store, options);
  return store;
#endif
}

}  // namespace bootstrap

bool grant_etcd_job(const std::string& uri, const std::string& root_user,
                    const std::string& root_password, const StoreOptions& options) {
  using namespace bootstrap;
  if (!is_etcd_uri(uri)) bad_uri(uri, "not an etcd:// URI");
  const EtcdUri parsed = parse_uri(uri);
  if (options.token.empty())
    throw ConfigError("token",
                      "grant_etcd_job: the job has no token (its user's password is "
                      "derived from COMMGRID_TOKEN)");
#if !COMMGRID_HAVE_CURL
  (void)root_user;
  (void)root_password;
  throw ConfigError("store", "store '" + shown_uri(uri) +
                                 "': this build of commgrid has no etcd support (libcurl)");
#else
  const std::string prefix = parsed.prefix.empty() ? "commgrid/" + options.job_id : parsed.prefix;
  const std::string where = "etcd://" + parsed.hosts() + "/" + prefix;
  // Granted already (by another node's launch, or an earlier run): change nothing, so that
  // the ranks' tokens stay valid (etcd refuses tokens older than a change of users).
  {
    EtcdClient job(parsed, where, job_user(options.job_id), job_password(options), options.timeout,
                   nullptr);
    try {
      if (job.login()) return true;
    } catch (const AuthenticationError&) {}  // not there yet (or another token's: below)
  }
  EtcdClient root(parsed, where, root_user, root_password, options.timeout, nullptr);
  if (!root.login()) return false;  // authentication is off: nothing to grant
  const std::string user = job_user(options.job_id), role = user;
  auto tolerate_exists = [&](const std::string& path, const json& body) {
    try {
      (void)root.call(path, body);
    } catch (const BackendError& e) {
      if (std::string(e.what()).find("already exists") == std::string::npos) throw;
    }
  };
  tolerate_exists("/v3/auth/role/add", {{"name", role}});
  (void)root.call("/v3/auth/role/grant", {{"name", role},
                                          {"perm",
                                           {{"permType", "READWRITE"},
                                            {"key", b64(prefix + "/")},
                                            {"range_end", b64(prefix_end(prefix + "/"))}}}});
  tolerate_exists("/v3/auth/user/add", {{"name", user}, {"password", job_password(options)}});
  (void)root.call("/v3/auth/user/grant", {{"user", user}, {"role", role}});
  // A user that existed already may hold another job's password: proven by logging in.
  EtcdClient job(parsed, where, user, job_password(options), options.timeout, nullptr);
  try {
    (void)job.login();
  } catch (const AuthenticationError&) {
    throw JobConflictError("etcd store " + where + ": user '" + user +
                           "' exists with another password: another job has the id '" +
                           options.job_id + "' and a different token");
  }
  return true;
#endif
}

}  // namespace commgrid
