// The Redis store (hiredis): for machines that share nothing but the network. Keys live
// under a prefix, which the job claims (job_claim.hpp).
#if COMMGRID_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "commgrid/store.hpp"
#include "job_claim.hpp"
#include "store_call.hpp"
#include "tcp_io.hpp"

namespace commgrid {
namespace {

using bootstrap::accept_claim;
using bootstrap::new_claim;
using bootstrap::parse_claim;
using bootstrap::store_call;

#if COMMGRID_HAVE_HIREDIS
// One hiredis connection (commands are serialized by Store's mutex).
class RedisConnection {
 public:
  RedisConnection(std::string where, const std::string& host, int port, const std::string& password,
                  std::chrono::milliseconds timeout)
      : where_(std::move(where)),
        // hiredis blocks without limit on a server that stopped answering (SIGSTOP, a
        // network partition); a bound per command keeps every wait within its timeout plus
        // this.
        bound_(std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(2))) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(bound_.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((bound_.count() % 1000) * 1000);
    // Owned from the start: a refused AUTH below throws out of the constructor, where a
    // destructor would not run.
    redis_.reset(redisConnectWithTimeout(host.c_str(), port, tv));
    if (!redis_)
      throw BackendError("redis connect to " + where_ + ": cannot allocate a connection");
    if (redis_->err != 0) throw_failure("connect");
    redisSetTimeout(redis_.get(), tv);
    if (password.empty()) return;
    Reply reply = command("AUTH", "AUTH %b", password.data(), password.size());
    if (reply->type != REDIS_REPLY_STATUS)
      // The reply names no password.
      throw AuthenticationError("redis AUTH on " + where_ + " refused: " + text_of(reply.get()));
  }
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  /// SET key value NX: true when this call set it, false when the key existed.
  bool set_if_absent(const std::string& key, std::string_view value) {
    Reply reply =
        command("SET", "SET %b %b NX", key.data(), key.size(), value.data(), value.size());
    if (reply->type == REDIS_REPLY_STATUS) return true;
    if (reply->type == REDIS_REPLY_NIL) return false;
    throw BackendError("redis SET on " + where_ + ": " + text_of(reply.get()));
  }
  std::vector<char> get(const std::string& key) {
    Reply reply = command("GET", "GET %b", key.data(), key.size());
    if (reply->type != REDIS_REPLY_STRING)
      throw BackendError("redis GET on " + where_ + ": " + text_of(reply.get()));
    return {reply->str, reply->str + reply->len};
  }
  bool exists(const std::string& key) {
    Reply reply = command("EXISTS", "EXISTS %b", key.data(), key.size());
    if (reply->type != REDIS_REPLY_INTEGER)
      throw BackendError("redis EXISTS on " + where_ + ": " + text_of(reply.get()));
    return reply->integer != 0;
  }

 private:
  struct FreeReply {
    void operator()(redisReply* r) const { freeReplyObject(r); }
  };
  using Reply = std::unique_ptr<redisReply, FreeReply>;

  template <class... Args>
  Reply command(const char* name, const char* format, Args... args) {
    auto* r = static_cast<redisReply*>(redisCommand(redis_.get(), format, args...));
    if (r == nullptr) throw_failure(name);
    return Reply(r);
  }
  // What went wrong with the connection, in words: hiredis' own ("Resource temporarily
  // unavailable", "Server closed the connection") says neither where nor what it means.
  // Once failed, a hiredis connection stays failed: every later command says the same.
  [[noreturn]] void throw_failure(const std::string& op) const {
    const int err = redis_->err;
    const std::string why = redis_->errstr[0] != '\0' ? redis_->errstr : "no reply";
    const std::string head = "redis " + op + " on " + where_ + ": ";
    const std::string secs = std::to_string(bound_.count() / 1000) + "." +
                             std::to_string(bound_.count() % 1000 / 100) + " s";
    if (err == REDIS_ERR_IO && (why.find("temporarily unavailable") != std::string::npos ||
                                why.find("timed out") != std::string::npos))
      throw TimeoutError(head + "the server did not answer within " + secs +
                         " (it is stopped, overloaded or cut off from this host)");
    if (err == REDIS_ERR_EOF || why.find("reset by peer") != std::string::npos ||
        why.find("Broken pipe") != std::string::npos)
      throw BackendError(head + "the server closed the connection (" + why +
                         "): Redis stopped, restarted or dropped this client");
    if (why.find("refused") != std::string::npos)
      throw BackendError(head + "nothing listens there (" + why + "): is redis-server running?");
    throw BackendError(head + why);
  }
  static std::string text_of(const redisReply* r) {
    if (r->type == REDIS_REPLY_ERROR) return quote_untrusted(std::string_view(r->str, r->len));
    if (r->type == REDIS_REPLY_NIL) return "no such key";
    return "unexpected reply";
  }
  struct FreeContext {
    void operator()(redisContext* c) const { redisFree(c); }
  };
  std::string where_;
  std::chrono::milliseconds bound_;
  std::unique_ptr<redisContext, FreeContext> redis_;
};

class RedisStore final : public Store {
 public:
  RedisStore(const std::string& host, int port, std::string prefix, const std::string& password,
             std::string local, std::chrono::milliseconds timeout)
      : host_(host), port_(port), prefix_(std::move(prefix)), local_(std::move(local)),
        redis_(uri(), host, port, password, timeout) {}
  [[nodiscard]] std::string uri() const override {
    return "redis://" + host_ + ":" + std::to_string(port_) + "/" + prefix_;
  }
  [[nodiscard]] std::string local_address() const override { return local_; }

  /// Claims the prefix for the job, or throws JobConflictError naming the job holding it.
  void claim(const StoreOptions& o) {
    const std::string mine = new_claim(o);
    if (redis_.set_if_absent(full("commgrid-job"), mine)) {
      set_job_secret(parse_claim(mine).secret);
      return;
    }
    const std::vector<char> got = get("commgrid-job");
    set_job_secret(accept_claim(uri(), std::string(got.begin(), got.end()), o));
  }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (!redis_.set_if_absent(full(key), std::string_view(value.data(), value.size())))
      throw BackendError("store set on " + uri() + ": key '" + key + "' is already set");
  }
  bool do_set_if_absent(const std::string& key, const std::vector<char>& value) override {
    return redis_.set_if_absent(full(key), std::string_view(value.data(), value.size()));
  }
  std::vector<char> do_get(const std::string& key) override { return redis_.get(full(key)); }
  bool do_has(const std::string& key) override { return redis_.exists(full(key)); }

 private:
  [[nodiscard]] std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::string host_;
  int port_;
  std::string prefix_;
  std::string local_;
  RedisConnection redis_;
};

#endif  // COMMGRID_HAVE_HIREDIS

// hiredis' own connect error does not say whether the host or the port was wrong, and the
// store needs the local end of the connection; probing first gives both. Returns "" when a
// TCP connection could be made.
std::string probe_tcp(const std::string& host, int port, int timeout_ms, std::string* local) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return std::string("cannot resolve host: ") + gai_strerror(rc);
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  std::string last = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { close(*f); });
    auto local_end = [&] {
      if (local != nullptr) *local = bootstrap::socket_local_address(fd);
      return std::string();
    };
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return local_end();
    if (errno != EINPROGRESS) {
      last = std::strerror(errno);
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    int ready = poll(&p, 1, timeout_ms);
    if (ready == 0) {
      last = "connection timed out after " + std::to_string(timeout_ms) + " ms";
      continue;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (ready > 0 && err == 0) return local_end();
    last = std::strerror(err != 0 ? err : errno);
  }
  return last;
}

}  // namespace

std::shared_ptr<Store> make_redis_store(const std::string& host, int port,
                                        const std::string& prefix) {
  return make_redis_store(host, port, prefix, "", StoreOptions{});
}

std::shared_ptr<Store> make_redis_store(const std::string& host, int port,
                                        const std::string& prefix, const std::string& password,
                                        const StoreOptions& options) {
  if (host.empty()) throw ConfigError("store", "redis store: empty host name");
  if (port < 1 || port > 65535)
    throw ConfigError("store",
                      "redis store: port must be in [1, 65535], got " + std::to_string(port));
  const std::string where = "redis://" + host + ":" + std::to_string(port);
  std::string local;
  const int probe_ms = static_cast<int>(std::clamp<long long>(options.timeout.count(), 1, 5000));
  if (std::string why = probe_tcp(host, port, probe_ms, &local); !why.empty()) {
    if (why.find("timed out") != std::string::npos)
      throw TimeoutError("store connect on " + where + ": " + why +
                         " (no answer from the host: wrong address, or a firewall)");
    if (why.find("refused") != std::string::npos)
      throw BackendError("store connect on " + where + ": " + why +
                         " (nothing listens there: is redis-server running on that port?)");
    throw BackendError("store connect on " + where + ": " + why);
  }
#if !COMMGRID_HAVE_HIREDIS
  (void)prefix;
  (void)password;
  throw ConfigError("store", "store " + where +
                                 ": this build of commgrid has no Redis support (hiredis was "
                                 "not found when it was built)");
#else
  std::shared_ptr<RedisStore> out;
  store_call("connect", where, [&] {
    out = std::make_shared<RedisStore>(host, port, prefix, password, local, options.timeout);
  });
  store_call("claim", out->uri(), [&] { out->claim(options); });
  bootstrap::join_as_rank(*out, options);
  return out;
#endif
}

}  // namespace commgrid
