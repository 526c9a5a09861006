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
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
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

#include "etcd_store.hpp"
#include "tcp_store.hpp"

namespace commgrid {
namespace {

// Runs fn, turning anything but commgrid's own errors into a BackendError naming the
// operation and the store.
template <typename F>
void store_call(std::string_view op, const std::string& where, F&& fn) {
  try {
    std::forward<F>(fn)();
  } catch (const Error&) { throw; } catch (const std::exception& e) {
    throw BackendError("store " + std::string(op) + " on " + where + ": " + e.what());
  }
}

}  // namespace

struct Store::State {
  std::mutex mutex;        // the engine's: held around every do_* call
  std::mutex abort_mutex;  // abort_reason's (never held with a wait in progress)
  std::atomic<bool> aborted{false};
  std::string abort_reason;  // written once under abort_mutex before aborted is set
  std::string job_secret;
};

Store::Store() : state_(std::make_unique<State>()) {}
void Store::set_job_secret(std::string secret) { state_->job_secret = std::move(secret); }
Store::~Store() = default;

void Store::set(const std::string& key, std::span<const char> value) {
  std::lock_guard lock(state_->mutex);
  store_call("set", uri(), [&] { do_set(key, {value.begin(), value.end()}); });
}

bool Store::set_if_absent(const std::string& key, std::span<const char> value) {
  std::lock_guard lock(state_->mutex);
  bool set = false;
  store_call("set_if_absent", uri(), [&] {
    set = do_set_if_absent(key, {value.begin(), value.end()});
  });
  return set;
}

bool Store::fence(const std::string& process, const std::string& message) {
  std::lock_guard lock(state_->mutex);
  bool enforced = false;
  store_call("fence", uri(), [&] { enforced = do_fence(process, message); });
  return enforced;
}

bool Store::do_fence(const std::string& /*process*/, const std::string& /*message*/) {
  return false;
}

bool Store::do_set_if_absent(const std::string& key, const std::vector<char>& value) {
  if (do_has(key)) return false;
  do_set(key, value);
  return true;
}

std::vector<char> Store::get(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  std::vector<char> out;
  store_call("get", uri(), [&] {
    if (!do_has(key))
      throw BackendError("store get on " + uri() + ": key '" + key + "' is not set");
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

std::vector<std::string> Store::do_wait(std::vector<std::string> keys,
                                        std::chrono::milliseconds /*slice*/) {
  std::erase_if(keys, [&](const std::string& k) { return do_has(k); });
  return keys;
}

namespace {
thread_local const WaitWatch* tls_watch = nullptr;
}  // namespace

WaitWatch::WaitWatch(std::string key) : key_(std::move(key)), outer_(tls_watch) {
  tls_watch = this;
}
WaitWatch::~WaitWatch() { tls_watch = outer_; }
const std::string* WaitWatch::current() noexcept {
  return tls_watch != nullptr ? &tls_watch->key_ : nullptr;
}

std::vector<std::string> Store::wait_for(std::span<const std::string> keys,
                                         std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  using Ms = std::chrono::milliseconds;
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> missing(keys.begin(), keys.end());
  // Polling (or, where the store can wait, waiting in slices) rather than one long wait:
  // abort() and the deadline are seen between rounds, and the caller learns which keys
  // are still missing. A slice is short so that a thread sharing this store object is
  // not kept waiting for the engine for long.
  auto pause = Ms(1);
  const std::string* watch = WaitWatch::current();
  for (;;) {
    if (state_->aborted.load()) {
      std::lock_guard lock(state_->abort_mutex);
      throw AbortedError(state_->abort_reason);
    }
    const Ms left = std::max(Ms(0), std::chrono::duration_cast<Ms>(deadline - Clock::now()));
    {
      std::lock_guard lock(state_->mutex);
      if (watch != nullptr) {
        bool present = false;
        std::vector<char> value;
        store_call("check", uri(), [&] {
          present = do_has(*watch);
          if (present) value = do_get(*watch);
        });
        if (present)
          throw AbortedError("store " + uri() + ": the wait ended: " + *watch + " is set (" +
                             std::string(value.begin(), value.end()) + ")");
      }
      store_call("wait", uri(), [&] {
        missing = do_wait(
            std::move(missing),
            waits_in_slices() ? std::min(left, watch != nullptr ? Ms(250) : Ms(2000)) : Ms(0));
      });
    }
    if (missing.empty() || Clock::now() >= deadline) return missing;
    if (waits_in_slices()) {
      // A thread sharing this store object, blocked on the engine during the slice, gets
      // its turn now.
      std::this_thread::sleep_for(Ms(1));
      continue;
    }
    std::this_thread::sleep_for(
        std::min<Ms>(pause, std::chrono::duration_cast<Ms>(deadline - Clock::now()) + Ms(1)));
    pause = std::min(pause * 2, Ms(20));
  }
}

void Store::abort(const std::string& reason) {
  std::lock_guard lock(state_->abort_mutex);
  if (state_->aborted.load()) return;  // the first reason is the one that matters
  state_->abort_reason = reason;
  state_->aborted.store(true);
}

bool Store::aborted() const noexcept { return state_->aborted.load(); }

const std::atomic<bool>& Store::abort_flag() const noexcept { return state_->aborted; }

const std::string& Store::job_secret() const noexcept { return state_->job_secret; }

std::string Store::local_address() const { return "127.0.0.1"; }

std::string effective_token(const Store& store, const std::string& token) {
  return token.empty() ? store.job_secret() : token;
}

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
  // Its ranks are threads of this process; the secret still keeps a stranger on the
  // loopback out of their Gloo pairs.
  MemoryStore() { set_job_secret(bootstrap::random_hex(32)); }
  std::string uri() const override { return "memory"; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (!map_.emplace(key, value).second)
      throw BackendError("store set on memory: key '" + key + "' is already set");
  }
  bool do_set_if_absent(const std::string& key, const std::vector<char>& value) override {
    return map_.emplace(key, value).second;
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
  FileStore(std::string folder, std::string secret) : folder_(std::move(folder)) {
    set_job_secret(std::move(secret));
  }
  std::string uri() const override { return "file://" + folder_; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& data) override {
    if (!link_new(key, data))
      throw BackendError("file store " + folder_ + ": key '" + key + "' is already set");
  }
  // link(2) refuses a name that exists, atomically on the file system (NFS included), so
  // of the processes racing for a key exactly one links its file.
  bool do_set_if_absent(const std::string& key, const std::vector<char>& data) override {
    return link_new(key, data);
  }
  std::vector<char> do_get(const std::string& key) override {
    std::ifstream in(path_of(key), std::ios::binary);
    if (!in) throw BackendError("file store " + folder_ + ": cannot read key '" + key + "'");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  bool do_has(const std::string& key) override { return ::access(path_of(key).c_str(), F_OK) == 0; }

 private:
  // Writes `data` under a temporary name and links it to the key's file: false when the key
  // exists.
  bool link_new(const std::string& key, const std::vector<char>& data) {
    static std::atomic<unsigned long> serial{0};
    const std::string path = path_of(key);
    const std::string tmp =
        folder_ + "/.tmp-" + std::to_string(::getpid()) + "-" + std::to_string(serial.fetch_add(1));
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
      if (link_err == EEXIST) return false;
      throw fail("cannot link " + tmp + " to " + path, link_err);
    }
    return true;
  }
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

// The claim record of a job, "ID\nPROOF\n": its id and a keyed hash of its token, so that a
// second job (another id, or the same id with another token) is told apart without the
// token. A job without a token writes "ID\nsecret HEX\n" instead: the random job secret
// its ranks then prove to each other (effective_token), generated by the first to claim.
struct Claim {
  std::string id, proof, secret;
};

Claim parse_claim(const std::string& text) {
  Claim c;
  const size_t nl = text.find('\n');
  c.id = text.substr(0, nl);
  std::string second = nl == std::string::npos ? "" : text.substr(nl + 1);
  if (!second.empty() && second.back() == '\n') second.pop_back();
  constexpr std::string_view kSecret = "secret ";
  if (second.starts_with(kSecret)) c.secret = second.substr(kSecret.size());
  else c.proof = second;
  return c;
}

std::string claim_proof(const StoreOptions& o) {
  return token_proof(o.token, "commgrid store claim " + o.job_id);
}

// What this job writes when it claims a store first.
std::string new_claim(const StoreOptions& o) {
  if (o.token.empty()) return o.job_id + "\nsecret " + bootstrap::random_hex(32) + "\n";
  return o.job_id + "\n" + claim_proof(o) + "\n";
}

// A claim's text as it may appear in a message: it came from the store, so anyone who
// could write there chose it.
std::string shown(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 128)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return text.size() > 128 ? out + "..." : out;
}

// Checks the claim found in a store against this job: returns the job secret (the claim's,
// for a job without a token; empty with a token) or throws JobConflictError.
std::string accept_claim(const std::string& where, const std::string& found,
                         const StoreOptions& o) {
  const Claim c = parse_claim(found);
  if (c.id != o.job_id)
    throw JobConflictError("store " + where + " is in use by job '" + shown(c.id) +
                           "' (this is job '" + o.job_id + "'): give each job its own store");
  if (o.token.empty() && !c.secret.empty()) return c.secret;
  if (!o.token.empty() && c.secret.empty() && c.proof.size() == 64 &&
      CRYPTO_memcmp(c.proof.data(), claim_proof(o).data(), 64) == 0)
    return "";
  throw JobConflictError("store " + where + " is in use by another job with the id '" + o.job_id +
                         "' and a different token" +
                         (o.token.empty() ? " (that job has a token, this one none)"
                                          : (c.secret.empty() ? "" : " (that job has none)")) +
                         ": give each job its own store");
}

// What this process writes in a rank's place: unique to the process (a fork is another).
std::string process_mark() {
  static std::mutex mutex;
  static pid_t owner = -1;
  static std::string mark;
  std::lock_guard lock(mutex);
  if (owner != ::getpid()) {
    owner = ::getpid();
    mark = "pid " + std::to_string(owner) + " " + bootstrap::random_hex(16);
  }
  return mark;
}

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
    if (r->type == REDIS_REPLY_ERROR) return std::string(r->str, r->len);
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
  std::string uri() const override {
    return "redis://" + host_ + ":" + std::to_string(port_) + "/" + prefix_;
  }
  std::string local_address() const override { return local_; }

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

// Claims a file store folder: the record is written to a private file and linked into
// place, which fails if a claim exists (rename would replace it). Returns the job secret.
std::string claim_folder(const std::string& folder, const StoreOptions& o) {
  const std::string path = folder + "/commgrid-job";
  const std::string mine = new_claim(o);
  std::string tmp = folder + "/.commgrid-job-XXXXXX";
  int fd = ::mkstemp(tmp.data());  // 0600
  if (fd < 0)
    throw BackendError("file store " + folder + ": cannot write a claim: " + std::strerror(errno));
  const bool written = ::write(fd, mine.data(), mine.size()) == static_cast<ssize_t>(mine.size());
  ::close(fd);
  const int linked = written ? ::link(tmp.c_str(), path.c_str()) : -1;
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (!written) throw BackendError("file store " + folder + ": cannot write a claim");
  if (linked == 0) return parse_claim(mine).secret;
  if (link_errno != EEXIST)
    throw BackendError("file store " + folder + ": cannot claim: " + std::strerror(link_errno));
  std::ifstream in(path, std::ios::binary);
  std::string found((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return accept_claim("file://" + folder, found, o);
}

}  // namespace

namespace bootstrap {

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  if (RAND_bytes(raw.data(), static_cast<int>(bytes)) != 1)
    throw BackendError("store: OpenSSL RAND_bytes failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

void join_as_rank(Store& store, const StoreOptions& o) {
  if (o.rank < 0) return;
  const std::string key = "commgrid-job/rank/" + std::to_string(o.rank);
  const std::string mine = process_mark();
  try {
    store.set(key, std::span<const char>(mine.data(), mine.size()));
    return;
  } catch (const BackendError&) {
    if (!store.has(key)) throw;  // not a taken place: the store failed
  }
  const std::vector<char> got = store.get(key);
  if (std::string(got.begin(), got.end()) == mine) return;  // this process, again
  throw JobConflictError(
      "store " + store.uri() + " is in use by another job with the same id '" + o.job_id +
      "': its rank " + std::to_string(o.rank) +
      " has joined the store already (two jobs started with one id on one store, or one "
      "rank started twice): give each job its own COMMGRID_JOB_ID or store" +
      (o.token.empty() ? ", and a COMMGRID_TOKEN" : ""));
}

}  // namespace bootstrap

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

std::shared_ptr<Store> make_file_store(const std::string& folder, const StoreOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec))
    throw ConfigError("store", "file store '" + folder + "': not an existing folder");
  auto store = std::make_shared<FileStore>(folder, claim_folder(folder, options));
  bootstrap::join_as_rank(*store, options);
  return store;
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

std::shared_ptr<Store> open_store(std::string_view uri, const StoreOptions& options) {
  constexpr std::string_view kFile = "file://";
  constexpr std::string_view kRedis = "redis://";
  constexpr std::string_view kTcp = "tcp://";
  if (uri == "memory") return make_memory_store();
  if (bootstrap::is_etcd_uri(uri)) return bootstrap::make_etcd_store(uri, options);
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
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 || port > 65535)
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
    if (const size_t at = userinfo_end(uri); at != std::string_view::npos) {
      std::string_view cred = uri.substr(kRedis.size(), at - kRedis.size());
      const auto c = cred.find(':');
      password = std::string(c == std::string_view::npos ? cred : cred.substr(c + 1));
      if (password.empty()) bad_uri(uri, "empty password before '@'");
      rest = uri.substr(at + 1);
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
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 || port > 65535)
      bad_uri(uri, "port '" + std::string(port_text) + "' is not a number in [1, 65535]");
    return make_redis_store(std::string(rest.substr(0, colon)), port, prefix, password, options);
  }
  bad_uri(uri, "unknown scheme");
}

}  // namespace commgrid
