// The HTTP client of the etcd:// store: POSTs to etcd v3's JSON gateway through libcurl, with
// failover across the members, authentication per member, and watches as streamed replies.
// Built with libcurl only.
#pragma once

#if COMMGRID_HAVE_CURL
#include <curl/curl.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "commgrid/error.hpp"
#include "etcd_json.hpp"
#include "etcd_uri.hpp"

namespace commgrid::bootstrap::etcd {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

/// etcd's answer to a request it refused (an HTTP error with {"code", "message"}: gRPC's codes).
struct Refusal {
  int code = 0;
  std::string message;
};

/// One HTTP client for a store object: requests are serialized by the Store's mutex.
class EtcdClient {
 public:
  /// `where` names the store in errors; `user` empty: no authentication. `abort` (may be null)
  /// ends a request or a watch in progress when it turns true.
  EtcdClient(EtcdUri uri, std::string where, std::string user, std::string password, Ms timeout,
             const std::atomic<bool>* abort);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  /// POSTs `body` to `path` on a member, failing over until the timeout. `ambiguous` (when
  /// given) turns true if an earlier attempt may have been applied although no reply came.
  json call(const std::string& path, const json& body, bool* ambiguous = nullptr);

  /// Watches [key, range_end) from `revision` on the current member for at most `slice`,
  /// erasing from `missing` each key put meanwhile; ends early when `missing` is empty or the
  /// store is aborted. A member that fails is left for the next (the caller asks again).
  void watch(const std::string& key, const std::string& range_end, std::int64_t revision,
             std::set<std::string>& missing, Ms slice);

  /// Authenticates with the client's credentials at some member within the timeout: false
  /// when the cluster has authentication off; AuthenticationError when refused.
  bool login();

  /// The local address of the last connection to a member.
  [[nodiscard]] std::string local_address() const { return local_; }
  [[nodiscard]] const std::string& where() const { return where_; }
  /// Whether the cluster has authentication off (found when authenticating).
  [[nodiscard]] bool auth_disabled() const { return auth_disabled_; }

 private:
  // NOLINTNEXTLINE(bugprone-exception-escape): an empty json and optional do not throw
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
    bool answered;  // the member sent a line (the watch's creation at least)
    std::optional<Refusal> refusal;
  };

  [[nodiscard]] bool credentials() const { return !user_.empty() && !auth_disabled_; }
  static bool retryable(const Refusal& r);
  [[noreturn]] void throw_refused(const Refusal& r) const;
  [[nodiscard]] TimeoutError timed_out() const;
  void rotate(size_t from);
  bool wait_before_next(size_t tried, Clock::time_point deadline, Ms& pause);
  bool authenticate(size_t e, Clock::time_point deadline);
  void set_common(size_t e, const std::string& path, const std::string& body, Ms bound);
  void reset_handlers();
  Attempt attempt(size_t e, const std::string& path, const std::string& body,
                  Clock::time_point deadline);
  static int on_debug(CURL*, curl_infotype type, char* data, size_t size, void* user);
  static size_t on_body(char* data, size_t size, size_t n, void* user);
  static size_t on_stream(char* data, size_t size, size_t n, void* user);
  static int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t);

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

}  // namespace commgrid::bootstrap::etcd
#endif  // COMMGRID_HAVE_CURL
