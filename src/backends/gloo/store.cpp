// Stores over Gloo's HashStore, FileStore and RedisStore, with waits that poll so that they
// can name the missing keys, honour millisecond timeouts and be aborted.
#include "commgrid/store.hpp"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <filesystem>
#include <mutex>
#include <thread>

#include "gloo_errors.hpp"

namespace commgrid {

struct Store::State {
  std::mutex mutex;
  std::atomic<bool> aborted{false};
  std::string abort_reason;  // written once under mutex before aborted is set
};

Store::Store() : state_(std::make_unique<State>()) {}
Store::~Store() = default;

void Store::set(const std::string& key, std::span<const char> value) {
  std::lock_guard lock(state_->mutex);
  gloo_backend::guard("store set", uri(), [&] { do_set(key, {value.begin(), value.end()}); });
}

std::vector<char> Store::get(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  std::vector<char> out;
  gloo_backend::guard("store get", uri(), [&] {
    if (!do_has(key)) throw BackendError("gloo store get on " + uri() + ": key '" + key + "' is not set");
    out = do_get(key);
  });
  return out;
}

bool Store::has(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  bool present = false;
  gloo_backend::guard("store check", uri(), [&] { present = do_has(key); });
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

namespace {

// Gloo's stores do not all offer a non-blocking check; these subclasses expose one through
// the members Gloo keeps protected for that purpose.
class CheckableHashStore : public ::gloo::rendezvous::HashStore {
 public:
  bool has(const std::string& key) {
    std::lock_guard lock(m_);
    return map_.count(key) != 0;
  }
};

class CheckableFileStore : public ::gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool has(const std::string& key) { return check({key}); }
};

// A commgrid Store over one of Gloo's stores (S), named by `uri`.
template <class S>
class GlooBackedStore final : public Store {
 public:
  template <class... Args>
  explicit GlooBackedStore(std::string uri, Args&&... args)
      : uri_(std::move(uri)), store_(std::forward<Args>(args)...) {}
  std::string uri() const override { return uri_; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    store_.set(key, value);
  }
  std::vector<char> do_get(const std::string& key) override { return store_.get(key); }
  bool do_has(const std::string& key) override { return store_.has(key); }

 private:
  std::string uri_;
  S store_;
};
using MemoryStore = GlooBackedStore<CheckableHashStore>;
using FileStore = GlooBackedStore<CheckableFileStore>;

class RedisStore final : public Store {
 public:
  RedisStore(const std::string& host, int port, std::string prefix)
      : host_(host), port_(port), prefix_(std::move(prefix)), store_(host, port) {}
  std::string uri() const override {
    return "redis://" + host_ + ":" + std::to_string(port_) + "/" + prefix_;
  }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    store_.set(full(key), value);
  }
  std::vector<char> do_get(const std::string& key) override { return store_.get(full(key)); }
  bool do_has(const std::string& key) override { return store_.check({full(key)}); }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::string host_;
  int port_;
  std::string prefix_;
  ::gloo::rendezvous::RedisStore store_;
};

// Gloo's RedisStore leaks its connection when the connection fails in its constructor, and
// waits 2 s without saying whether the host or the port was wrong; probing first gives a
// clean error with the reason. Returns "" when a TCP connection could be made.
std::string probe_tcp(const std::string& host, int port, int timeout_ms) {
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
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return "";
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
    if (ready > 0 && err == 0) return "";
    last = std::strerror(err != 0 ? err : errno);
  }
  return last;
}

[[noreturn]] void bad_uri(std::string_view uri, const std::string& why) {
  throw ConfigError("store", "store '" + std::string(uri) + "': " + why +
                                 " (expected file:///absolute/folder, redis://host:port[/prefix]"
                                 " or memory)");
}

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>("memory"); }

std::shared_ptr<Store> make_file_store(const std::string& folder) {
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec))
    throw ConfigError("store", "file store '" + folder + "': not an existing folder");
  std::shared_ptr<Store> out;
  gloo_backend::guard("store open", "file://" + folder,
                      [&] { out = std::make_shared<FileStore>("file://" + folder, folder); });
  return out;
}

std::shared_ptr<Store> make_redis_store(const std::string& host, int port,
                                        const std::string& prefix) {
  if (host.empty()) throw ConfigError("store", "redis store: empty host name");
  if (port < 1 || port > 65535)
    throw ConfigError("store", "redis store: port must be in [1, 65535], got " +
                                   std::to_string(port));
  const std::string where = "redis://" + host + ":" + std::to_string(port);
  if (std::string why = probe_tcp(host, port, 5000); !why.empty()) {
    if (why.find("timed out") != std::string::npos)
      throw TimeoutError("gloo store connect on " + where + ": " + why);
    throw BackendError("gloo store connect on " + where + ": " + why);
  }
  std::shared_ptr<Store> out;
  gloo_backend::guard("store connect",
                      "redis://" + host + ":" + std::to_string(port),
                      [&] { out = std::make_shared<RedisStore>(host, port, prefix); });
  return out;
}

std::shared_ptr<Store> open_store(std::string_view uri) {
  constexpr std::string_view kFile = "file://";
  constexpr std::string_view kRedis = "redis://";
  if (uri == "memory") return make_memory_store();
  if (uri.starts_with(kFile)) {
    std::string path(uri.substr(kFile.size()));
    if (path.empty() || path.front() != '/') bad_uri(uri, "the folder must be an absolute path");
    return make_file_store(path);
  }
  if (uri.starts_with(kRedis)) {
    std::string_view rest = uri.substr(kRedis.size());
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
    return make_redis_store(std::string(rest.substr(0, colon)), port, prefix);
  }
  bad_uri(uri, "unknown scheme");
}

}  // namespace commgrid
