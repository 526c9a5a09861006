// The memory, file and Redis stores (the tcp:// store is tcp_store.cpp), with waits that
// poll so that they can name the missing keys, honour millisecond timeouts and be aborted.
// No engine's store is used: the backends adapt a commgrid::Store to their own interface.
#include "commgrid/store.hpp"

#if COMMGRID_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "tcp_store.hpp"

namespace commgrid {
namespace {

// Runs fn, turning anything but commgrid's own errors into a BackendError naming the
// operation and the store.
template <typename F>
void store_call(std::string_view op, const std::string& where, F&& fn) {
  try {
    std::forward<F>(fn)();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw BackendError("store " + std::string(op) + " on " + where + ": " + e.what());
  }
}

}  // namespace

struct Store::State {
  std::mutex mutex;
  std::atomic<bool> aborted{false};
  std::string abort_reason;  // written once under mutex before aborted is set
};

Store::Store() : state_(std::make_unique<State>()) {}
Store::~Store() = default;

void Store::set(const std::string& key, std::span<const char> value) {
  std::lock_guard lock(state_->mutex);
  store_call("set", uri(), [&] { do_set(key, {value.begin(), value.end()}); });
}

std::vector<char> Store::get(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  std::vector<char> out;
  store_call("get", uri(), [&] {
    if (!do_has(key)) throw BackendError("store get on " + uri() + ": key '" + key + "' is not set");
    out = do_get(key);
  });
  return out;
}

bool Store::has(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  bool present = false;
  store_call("check", uri(), [&] { present = do_has(key); });
  return present;
}

std::vector<std::string> Store::wait_for(std::span<const std::string> keys,
                                         std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> missing(keys.begin(), keys.end());
  // Polling rather than a condition variable: the file and Redis stores can only be polled,
  // and one loop for all three keeps abort() and the missing-key report uniform.
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (state_->aborted.load()) {
      std::lock_guard lock(state_->mutex);
      throw AbortedError(state_->abort_reason);
    }
    std::erase_if(missing, [&](const std::string& k) { return has(k); });
    if (missing.empty() || Clock::now() >= deadline) return missing;
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        pause, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()) +
                   std::chrono::milliseconds(1)));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

void Store::abort(const std::string& reason) {
  std::lock_guard lock(state_->mutex);
  if (state_->aborted.load()) return;  // the first reason is the one that matters
  state_->abort_reason = reason;
  state_->aborted.store(true);
}

bool Store::aborted() const noexcept { return state_->aborted.load(); }

std::string Store::local_address() const { return "127.0.0.1"; }

std::string token_proof(const std::string& token, const std::string& context) {
  if (token.empty()) return "";
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(context.data()), context.size(), mac,
           &len) == nullptr)
    throw BackendError("token proof: OpenSSL HMAC-SHA256 failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[mac[i] >> 4];
    out += kHex[mac[i] & 15];
  }
  return out;
}

namespace {

// Ranks that are threads of one process.
class MemoryStore final : public Store {
 public:
  std::string uri() const override { return "memory"; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (!map_.emplace(key, value).second)
      throw BackendError("store set on memory: key '" + key + "' is already set");
  }
  std::vector<char> do_get(const std::string& key) override { return map_.at(key); }
  bool do_has(const std::string& key) override { return map_.count(key) != 0; }

 private:
  std::unordered_map<std::string, std::vector<char>> map_;  // guarded by Store's mutex
};

// One file per key in a folder. A key (a rank's address) is the job's business only: each
// file is written private (0600) from its creation under a temporary name in the same
// folder, then linked into place, which also refuses a key that exists and makes a reader
// see either no file or the whole value. Keys may hold any byte, so file names are the
// key in hex.
class FileStore final : public Store {
 public:
  explicit FileStore(std::string folder) : folder_(std::move(folder)) {}
  std::string uri() const override { return "file://" + folder_; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& data) override {
    static std::atomic<unsigned long> serial{0};
    const std::string path = path_of(key);
    const std::string tmp = folder_ + "/.tmp-" + std::to_string(::getpid()) + "-" +
                            std::to_string(serial.fetch_add(1));
    auto fail = [&](const std::string& what, int err) -> BackendError {
      return BackendError("file store " + folder_ + ": " + what + " for key '" + key +
                          "': " + std::strerror(err));
    };
    const int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) throw fail("cannot create " + tmp, errno);
    size_t done = 0;
    int err = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0 && err == 0) err = errno;
    const int linked = err == 0 ? ::link(tmp.c_str(), path.c_str()) : -1;
    const int link_err = errno;
    ::unlink(tmp.c_str());
    if (err != 0) throw fail("cannot write " + tmp, err);
    if (linked != 0) {
      if (link_err == EEXIST)
        throw BackendError("file store " + folder_ + ": key '" + key + "' is already set");
      throw fail("cannot link " + tmp + " to " + path, link_err);
    }
  }
  std::vector<char> do_get(const std::string& key) override {
    std::ifstream in(path_of(key), std::ios::binary);
    if (!in) throw BackendError("file store " + folder_ + ": cannot read key '" + key + "'");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  bool do_has(const std::string& key) override {
    return ::access(path_of(key).c_str(), F_OK) == 0;
  }

 private:
  std::string path_of(const std::string& key) const {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out = folder_ + "/key-";
    for (unsigned char c : key) {
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
    return out;
  }
  std::string folder_;
};

// The claim record of a job: its id and a keyed hash of its token, so that a second job
// (another id, or the same id with another token) is told apart without the token.
std::string claim_text(const StoreOptions& o) {
  return o.job_id + "\n" + token_proof(o.token, "commgrid store claim " + o.job_id) + "\n";
}

[[noreturn]] void conflict(const std::string& where, const std::string& found,
                           const StoreOptions& o) {
  const std::string other = found.substr(0, found.find('\n'));
  if (other == o.job_id)
    throw JobConflictError("store " + where + " is in use by another job with the id '" +
                           other + "' and a different token: give each job its own store");
  throw JobConflictError("store " + where + " is in use by job '" + other + "' (this is job '" +
                         o.job_id + "'): give each job its own store");
}

#if COMMGRID_HAVE_HIREDIS
// One hiredis connection (commands are serialized by Store's mutex).
class RedisConnection {
 public:
  RedisConnection(const std::string& host, int port, const std::string& password,
                  std::chrono::milliseconds timeout) {
    // hiredis blocks without limit on a server that stopped answering (SIGSTOP, a network
    // partition); a bound per command keeps every wait within its timeout plus this.
    const auto bound = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(2));
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(bound.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((bound.count() % 1000) * 1000);
    // Owned from the start: a refused AUTH below throws out of the constructor, where a
    // destructor would not run.
    redis_.reset(redisConnectWithTimeout(host.c_str(), port, tv));
    if (!redis_) throw BackendError("redis connect: cannot allocate a connection");
    if (redis_->err != 0) throw BackendError(std::string("redis connect: ") + redis_->errstr);
    redisSetTimeout(redis_.get(), tv);
    if (password.empty()) return;
    Reply reply = command("AUTH %b", password.data(), password.size());
    if (reply->type != REDIS_REPLY_STATUS)
      // The reply names no password.
      throw AuthenticationError("redis AUTH refused: " + text_of(reply.get()));
  }
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  /// SET key value NX: true when this call set it, false when the key existed.
  bool set_if_absent(const std::string& key, std::string_view value) {
    Reply reply = command("SET %b %b NX", key.data(), key.size(), value.data(), value.size());
    if (reply->type == REDIS_REPLY_STATUS) return true;
    if (reply->type == REDIS_REPLY_NIL) return false;
    throw BackendError("redis SET: " + text_of(reply.get()));
  }
  std::vector<char> get(const std::string& key) {
    Reply reply = command("GET %b", key.data(), key.size());
    if (reply->type != REDIS_REPLY_STRING)
      throw BackendError("redis GET: " + text_of(reply.get()));
    return {reply->str, reply->str + reply->len};
  }
  bool exists(const std::string& key) {
    Reply reply = command("EXISTS %b", key.data(), key.size());
    if (reply->type != REDIS_REPLY_INTEGER)
      throw BackendError("redis EXISTS: " + text_of(reply.get()));
    return reply->integer != 0;
  }

 private:
  struct FreeReply {
    void operator()(redisReply* r) const { freeReplyObject(r); }
  };
  using Reply = std::unique_ptr<redisReply, FreeReply>;

  template <class... Args>
  Reply command(const char* format, Args... args) {
    auto* r = static_cast<redisReply*>(redisCommand(redis_.get(), format, args...));
    if (r == nullptr) {
      const bool timed_out = redis_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
      const std::string why = redis_->errstr[0] != '\0' ? redis_->errstr : "no reply";
      if (timed_out) throw TimeoutError("redis: the server did not answer: " + why);
      throw BackendError("redis: " + why);
    }
    return Reply(r);
  }
  static std::string text_of(const redisReply* r) {
    if (r->type == REDIS_REPLY_ERROR) return std::string(r->str, r->len);
    if (r->type == REDIS_REPLY_NIL) return "no such key";
    return "unexpected reply";
  }
  struct FreeContext {
    void operator()(redisContext* c) const { redisFree(c); }
  };
  std::unique_ptr<redisContext, FreeContext> redis_;
};

class RedisStore final : public Store {
 public:
  RedisStore(const std::string& host, int port, std::string prefix, const std::string& password,
             std::string local, std::chrono::milliseconds timeout)
      : host_(host), port_(port), prefix_(std::move(prefix)), local_(std::move(local)),
        redis_(host, port, password, timeout) {}
  std::string uri() const override {
    return "redis://" + host_ + ":" + std::to_string(port_) + "/" + prefix_;
  }
  std::string local_address() const override { return local_; }

  /// Claims the prefix for the job, or throws JobConflictError naming the job holding it.
  void claim(const StoreOptions& o) {
    const std::string mine = claim_text(o);
    if (redis_.set_if_absent(full("commgrid-job"), mine)) return;
    const std::vector<char> got = get("commgrid-job");
    const std::string found(got.begin(), got.end());
    if (found != mine) conflict(uri(), found, o);
  }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (!redis_.set_if_absent(full(key), std::string_view(value.data(), value.size())))
      throw BackendError("store set on " + uri() + ": key '" + key + "' is already set");
  }
  std::vector<char> do_get(const std::string& key) override { return redis_.get(full(key)); }
  bool do_has(const std::string& key) override { return redis_.exists(full(key)); }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
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

// The URI as it may be shown: a Redis password is replaced by "***".
std::string shown_uri(std::string_view uri) {
  std::string out(uri);
  if (!out.starts_with("redis://")) return out;
  const size_t at = out.find('@');
  if (at == std::string::npos) return out;
  return "redis://***@" + out.substr(at + 1);
}

[[noreturn]] void bad_uri(std::string_view uri, const std::string& why) {
  throw ConfigError("store", "store '" + shown_uri(uri) + "': " + why +
                                 " (expected file:///absolute/folder, "
                                 "redis://[:password@]host:port[/prefix], tcp://host:port or "
                                 "memory)");
}

// Claims a file store folder: the record is written to a private file and linked into
// place, which fails if a claim exists (rename would replace it).
void claim_folder(const std::string& folder, const StoreOptions& o) {
  const std::string path = folder + "/commgrid-job";
  const std::string mine = claim_text(o);
  std::string tmp = folder + "/.commgrid-job-XXXXXX";
  int fd = ::mkstemp(tmp.data());  // 0600
  if (fd < 0)
    throw BackendError("file store " + folder + ": cannot write a claim: " + std::strerror(errno));
  const bool written = ::write(fd, mine.data(), mine.size()) == static_cast<ssize_t>(mine.size());
  ::close(fd);
  const int linked = written ? ::link(tmp.c_str(), path.c_str()) : -1;
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (!written)
    throw BackendError("file store " + folder + ": cannot write a claim");
  if (linked == 0) return;
  if (link_errno != EEXIST)
    throw BackendError("file store " + folder + ": cannot claim: " + std::strerror(link_errno));
  std::ifstream in(path, std::ios::binary);
  std::string found((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (found != mine) conflict("file://" + folder, found, o);
}

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

std::shared_ptr<Store> make_file_store(const std::string& folder, const StoreOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec))
    throw ConfigError("store", "file store '" + folder + "': not an existing folder");
  claim_folder(folder, options);
  return std::make_shared<FileStore>(folder);
}

std::shared_ptr<Store> make_redis_store(const std::string& host, int port,
                                        const std::string& prefix) {
  return make_redis_store(host, port, prefix, "", StoreOptions{});
}

std::shared_ptr<Store> make_redis_store(const std::string& host, int port,
                                        const std::string& prefix, const std::string& password,
                                        const StoreOptions& options) {
  if (host.empty()) throw ConfigError("store", "redis store: empty host name");
  if (port < 1 || port > 65535)
    throw ConfigError("store", "redis store: port must be in [1, 65535], got " +
                                   std::to_string(port));
  const std::string where = "redis://" + host + ":" + std::to_string(port);
  std::string local;
  if (std::string why = probe_tcp(host, port, 5000, &local); !why.empty()) {
    if (why.find("timed out") != std::string::npos)
      throw TimeoutError("store connect on " + where + ": " + why);
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
  return out;
#endif
}

std::shared_ptr<Store> open_store(std::string_view uri, const StoreOptions& options) {
  constexpr std::string_view kFile = "file://";
  constexpr std::string_view kRedis = "redis://";
  constexpr std::string_view kTcp = "tcp://";
  if (uri == "memory") return make_memory_store();
  if (uri.starts_with(kFile)) {
    std::string path(uri.substr(kFile.size()));
    if (path.empty() || path.front() != '/') bad_uri(uri, "the folder must be an absolute path");
    return make_file_store(path, options);
  }
  if (uri.starts_with(kTcp)) {
    std::string_view rest = uri.substr(kTcp.size());
    const auto colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0) bad_uri(uri, "expected host:port");
    std::string_view port_text = rest.substr(colon + 1);
    int port = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 ||
        port > 65535)
      bad_uri(uri, "port '" + std::string(port_text) + "' is not a number in [1, 65535]");
    std::string host(rest.substr(0, colon));
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    return bootstrap::make_tcp_store(host, port, options);
  }
  if (uri.starts_with(kRedis)) {
    std::string_view rest = uri.substr(kRedis.size());
    // redis://[user]:password@host... : the password is used, never shown.
    std::string password;
    if (auto at = rest.find('@'); at != std::string_view::npos) {
      std::string_view cred = rest.substr(0, at);
      const auto c = cred.find(':');
      password = std::string(c == std::string_view::npos ? cred : cred.substr(c + 1));
      if (password.empty()) bad_uri(uri, "empty password before '@'");
      rest = rest.substr(at + 1);
    }
    if (password.empty())
      if (const char* p = std::getenv("COMMGRID_REDIS_PASSWORD"); p != nullptr) {
        if (*p == '\0')
          throw InvalidValueError("COMMGRID_REDIS_PASSWORD",
                                  "COMMGRID_REDIS_PASSWORD is set but empty");
        password = p;
      }
    std::string prefix = "commgrid";
    if (auto slash = rest.find('/'); slash != std::string_view::npos) {
      prefix = std::string(rest.substr(slash + 1));
      rest = rest.substr(0, slash);
      if (prefix.empty()) bad_uri(uri, "empty key prefix after '/'");
    }
    auto colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0) bad_uri(uri, "expected host:port");
    std::string_view port_text = rest.substr(colon + 1);
    int port = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 ||
        port > 65535)
      bad_uri(uri, "port '" + std::string(port_text) + "' is not a number in [1, 65535]");
    return make_redis_store(std::string(rest.substr(0, colon)), port, prefix, password, options);
  }
  bad_uri(uri, "unknown scheme");
}

}  // namespace commgrid
