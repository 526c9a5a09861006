// The Store base: the public methods every store shares (the engine's mutex around each
// hook, waits that poll or wait in slices, abort), the thread's WaitWatch, and the token a
// job's ranks prove to each other. The engines are memory_store.cpp, file_store.cpp,
// redis_store.cpp and tcp_client.cpp.
#include "commgrid/store.hpp"

#include <algorithm>
#include <mutex>
#include <thread>

#include "store_call.hpp"

namespace commgrid {

using bootstrap::store_call;

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
          present = do_has_nearby(*watch);
          if (present) value = do_get(*watch);
        });
        if (present)
          throw AbortedError("store " + uri() + ": the wait ended: " + *watch + " is set to " +
                             quote_untrusted(std::string_view(value.data(), value.size())));
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

}  // namespace commgrid
