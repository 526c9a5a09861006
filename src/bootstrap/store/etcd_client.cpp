// The HTTP client of the etcd:// store (etcd_client.hpp).
//
// - Several members: a request that cannot reach one member (refused, timed out, the member
//   has no leader) goes to the next, until the store's timeout.
// - Authentication: a token per member ("simple" tokens are a member's own), fetched again
//   when etcd no longer takes it.
// - A request that may have reached a member without a reply coming back (a timeout after
//   sending, a connection reset, libcurl's own resend on a fresh connection) is reported as
//   ambiguous, so that the store can tell a write that was applied from one that was not.
#include "etcd_client.hpp"

#if COMMGRID_HAVE_CURL
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

namespace commgrid::bootstrap::etcd {
namespace {

enum : int {
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

std::string seconds_text(Ms d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

EtcdClient::EtcdClient(EtcdUri uri, std::string where, std::string user, std::string password,
                       Ms timeout, const std::atomic<bool>* abort)
    : uri_(std::move(uri)), where_(std::move(where)), user_(std::move(user)),
      password_(std::move(password)), timeout_(timeout), abort_(abort),
      tokens_(uri_.endpoints.size()), last_error_(uri_.endpoints.size()) {
  curl_init_once();
  // NOLINTNEXTLINE(cppcoreguidelines-prefer-member-initializer): after curl_init_once()
  curl_ = curl_easy_init();
  if (curl_ == nullptr) throw BackendError("etcd store " + where_ + ": curl_easy_init failed");
}

EtcdClient::~EtcdClient() {
  curl_slist_free_all(headers_);
  curl_easy_cleanup(curl_);
}

json EtcdClient::call(const std::string& path, const json& body, bool* ambiguous) {
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

void EtcdClient::watch(const std::string& key, const std::string& range_end, std::int64_t revision,
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
  Stream s{&missing, {}, false, false, {}};
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
  // A member that never confirmed the watch within a slice of a second or more (etcd answers
  // a watch's creation at once) is gone or cut off, as far as this client can tell: the next
  // request goes to another member rather than waiting on it again for the attempt's bound.
  // (A shorter slice says little on a loaded machine, and moving away from a member on this
  // host makes every later request cross the network.)
  if (rc == CURLE_OPERATION_TIMEDOUT && !s.answered && slice >= Ms(1000)) {
    last_error_[e] = "the watch was not confirmed within " + seconds_text(slice);
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

bool EtcdClient::login() {
  const auto deadline = Clock::now() + timeout_;
  Ms pause(20);
  for (size_t tried = 0;; ++tried) {
    const size_t e = current_;
    if (authenticate(e, deadline)) return !auth_disabled_;
    rotate(e);
    if (!wait_before_next(tried, deadline, pause)) throw timed_out();
  }
}

bool EtcdClient::retryable(const Refusal& r) {
  if (r.code == kUnavailable || r.code == kDeadlineExceeded || r.code == kResourceExhausted)
    return true;
  // (etcd's words while it elects a leader, or a member stops: the request may go again.)
  for (const char* m : {"no leader", "leader changed", "timed out", "not capable", "too many",
                        "proposal dropped", "server stopped", "not leader"})
    if (r.message.find(m) != std::string::npos) return true;
  return false;
}

void EtcdClient::throw_refused(const Refusal& r) const {
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

TimeoutError EtcdClient::timed_out() const {
  std::string why;
  for (size_t i = 0; i < uri_.endpoints.size(); ++i)
    why += (i ? "; " : "") + uri_.endpoints[i].text() + ": " +
           (last_error_[i].empty() ? "not tried" : last_error_[i]);
  return TimeoutError("etcd store " + where_ + ": no member answered within " +
                      seconds_text(timeout_) + " (" + why + ")");
}

void EtcdClient::rotate(size_t from) {
  if (current_ == from) current_ = (from + 1) % uri_.endpoints.size();
}

// After a failed attempt: at once to the next member, and after each round of all of them a
// pause (20 ms doubling to 0.5 s); false when the deadline has passed.
bool EtcdClient::wait_before_next(size_t tried, Clock::time_point deadline, Ms& pause) {
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
bool EtcdClient::authenticate(size_t e, Clock::time_point deadline) {
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

void EtcdClient::set_common(size_t e, const std::string& path, const std::string& body, Ms bound) {
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

int EtcdClient::on_debug(CURL*, curl_infotype type, char* data, size_t size, void* user) {
  // A request's head starts with its method (the rest of a head written in parts does not).
  if (type == CURLINFO_HEADER_OUT && size >= 5 && std::memcmp(data, "POST ", 5) == 0)
    ++static_cast<EtcdClient*>(user)->requests_sent_;
  return 0;
}

void EtcdClient::reset_handlers() {
  char* ip = nullptr;
  if (curl_easy_getinfo(curl_, CURLINFO_LOCAL_IP, &ip) == CURLE_OK && ip != nullptr && *ip)
    local_ = ip;
}

EtcdClient::Attempt EtcdClient::attempt(size_t e, const std::string& path, const std::string& body,
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
  if (r.message.empty()) r.message = "HTTP " + std::to_string(status) + " " + reply.substr(0, 200);
  a.refusal = std::move(r);
  return a;
}

size_t EtcdClient::on_body(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  // A value is at most the Store's largest (64 MiB), base64 and JSON around it.
  if (out->size() + size * n > (size_t{128} << 20)) return 0;
  out->append(data, size * n);
  return size * n;
}

size_t EtcdClient::on_stream(char* data, size_t size, size_t n, void* user) {
  auto* s = static_cast<Stream*>(user);
  s->buffer.append(data, size * n);
  for (size_t nl; (nl = s->buffer.find('\n')) != std::string::npos;) {
    const json j = json::parse(s->buffer.substr(0, nl), nullptr, false);
    s->buffer.erase(0, nl + 1);
    if (!j.is_object()) continue;
    s->answered = true;
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

int EtcdClient::on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* self = static_cast<EtcdClient*>(user);
  return self->abort_ != nullptr && self->abort_->load() ? 1 : 0;
}
}  // namespace commgrid::bootstrap::etcd
#endif  // COMMGRID_HAVE_CURL
