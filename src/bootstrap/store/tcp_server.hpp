// The tcp:// store's server: one event-loop thread (epoll) serves every connection, with no
// thread per connection, whatever the number of ranks. Each connection proves the job's
// token (tcp_auth.hpp) before any request; requests are served in order, a wait is parked at
// the server and answered when its keys are set.
//
// What a stranger can cost the server: before its proof a connection owns a fixed 256-byte
// buffer (nothing is allocated from a length it announces), must prove within a few seconds,
// and is the first closed when connections run short; a connection that closes at once
// costs nothing that stays. The limits a rank can meet (connections, descriptors, bytes) are
// named in the refusal it is sent.
#pragma once

#include <sys/epoll.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "commgrid/store.hpp"
#include "tcp_io.hpp"
#include "tcp_limits.hpp"
#include "tcp_wire.hpp"

namespace commgrid::bootstrap::tcp {

/// A genuine rank proves within a round trip of the greeting; a loaded machine may take
/// seconds to schedule it.
inline constexpr Ms kHandshakeDeadline = std::chrono::seconds(10);
/// A wait is answered at the latest after this, with the keys still missing.
inline constexpr Ms kMaxWaitSlice = std::chrono::seconds(10);
/// Replies queued for a connection before the server stops reading its requests.
inline constexpr std::size_t kMaxQueued = 256;

/// The server of one tcp:// store, listening from construction to destruction. The serving
/// process's own Store calls set/get/has/fence/wait directly (thread-safe).
class TcpStoreServer {
 public:
  /// Listens on host:port (host's own address) and starts the loop. JobConflictError when
  /// the port is in use, BackendError when it cannot listen.
  TcpStoreServer(const std::string& host, int port, const StoreOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// The numeric address it listens on.
  [[nodiscard]] const std::string& address() const { return address_; }
  /// The job secret it sends each proven rank (empty with a token).
  [[nodiscard]] const std::string& secret() const { return secret_; }

  /// How a set ended.
  enum class SetResult { ok, exists, full };
  /// Sets `key` unless present; `why` receives the refusal when the byte limit is reached.
  [[nodiscard]] SetResult set(const std::string& key, std::string_view value, std::string* why);
  /// The value of `key`; nullopt when it is not set.
  [[nodiscard]] std::optional<std::string> get(const std::string& key) const;
  /// Whether `key` is set.
  [[nodiscard]] bool has(const std::string& key) const;
  /// Fences a process (resilience): every later request of a connection that identified as
  /// it is refused with `message` and the connection closed, and it cannot identify again.
  void fence(const std::string& process, const std::string& message);
  /// Why `process` was fenced; nullopt when it was not.
  [[nodiscard]] std::optional<std::string> fenced(const std::string& process) const;
  /// Waits at most `slice` (and at most 100 ms: the caller then sees abort()) for the keys;
  /// returns those still missing.
  [[nodiscard]] std::vector<std::string> wait(std::vector<std::string> keys, Ms slice);

 private:
  static constexpr std::uint64_t kListenerId = 0, kWakeId = 1;

  // Bytes to send: a header this server built, then (for a value) a view of the value in
  // the map, which is never changed or removed while the server lives.
  struct Segment {
    std::string head;
    std::string_view body;
  };

  struct Conn {
    std::uint64_t id = 0;
    Socket socket;
    std::uint32_t events = 0;  // as registered with epoll
    bool authed = false, closing = false, dead = false;
    std::string process;  // the identity it gave ('I'), for fencing; empty: none
    std::string nonce;    // the challenge sent in the greeting
    // Before the proof: the fixed buffer. After: requests as they arrive.
    std::array<char, kPreAuthBuffer> small{};
    std::size_t small_len = 0;
    std::string in;
    std::size_t in_off = 0;
    std::deque<Segment> out;
    std::size_t out_off = 0;  // bytes of out.front() already sent
    std::list<std::uint64_t>::iterator pending_it;
    bool has_timer = false;
    std::multimap<Clock::time_point, std::uint64_t>::iterator timer;
    // A wait parked at the server: the keys, the first not yet seen, where it is listed.
    bool parked = false;
    std::vector<std::string> wait_keys;
    std::size_t wait_next = 0;
    Clock::time_point wait_until;
    bool listed = false;
    std::list<std::uint64_t>::iterator wait_it;
  };

  // tcp_server.cpp: listening, the loop, timers, accepting.
  void listen_on(const std::string& host, int port);
  void watch(int fd, std::uint64_t id, std::uint32_t events);
  void signal_loop();
  SetResult insert(const std::string& key, std::string_view value, std::string* why);
  void loop();
  Conn* find(std::uint64_t id);
  void kill(Conn& c);
  void sweep();
  void set_timer(Conn& c, Clock::time_point when);
  void cancel_timer(Conn& c);
  void fire_timers();
  void on_wake();
  void on_listener();
  void refuse_for_descriptors(int err);
  void pause_accepting();
  void resume_accepting();
  static void refuse(int fd, const std::string& why);
  void admit(Socket s);
  void evict_oldest_pending();

  // tcp_server_requests.cpp: one connection's proof, requests, waits and replies.
  void on_conn(std::uint64_t id, std::uint32_t events);
  bool read_proof(Conn& c);
  bool read_requests(Conn& c);
  bool serve_requests(Conn& c);
  bool refuse_fenced(Conn& c, const std::string& process);
  // Answers a request beyond a limit with an error naming it ('E') and closes the
  // connection once it is sent; true (the connection stays until then).
  bool refuse_request(Conn& c, const std::string& why);
  bool refuse_key(Conn& c, std::size_t bytes);
  bool serve(Conn& c, Message m);
  bool park(Conn& c, Message m);
  void advance_wait(Conn& c, bool resume);
  void unlist(Conn& c);
  void finish_wait(Conn& c, std::vector<std::string> missing, bool resume);
  void resume_serving();
  void wake_key(const std::string& key);
  void queue(Conn& c, std::string frame);
  void flush(Conn& c);
  void update_events(Conn& c);

  const std::string where_;  // host:port as given
  const StoreOptions options_;
  const std::string secret_;
  const Limit connections_, bytes_limit_;
  Socket listener_, epoll_, wake_;
  std::string address_;
  int reserve_ = -1;
  std::atomic<bool> stop_{false};

  mutable std::mutex mutex_;  // guards map_, bytes_, woken_
  std::condition_variable cv_;
  std::unordered_map<std::string, std::string> map_;  // nodes stay put: values are sent from it
  std::size_t bytes_ = 0;
  std::vector<std::string> woken_;  // keys the serving process set, to wake waits with
  std::unordered_map<std::string, std::string> fenced_;  // process -> why (guarded by mutex_)

  // The loop thread's alone.
  std::unordered_map<std::uint64_t, std::unique_ptr<Conn>> conns_;
  std::list<std::uint64_t> pending_;  // connections without proof, oldest first
  std::multimap<Clock::time_point, std::uint64_t> timers_;
  std::unordered_map<std::string, std::list<std::uint64_t>> waiters_;
  std::vector<std::uint64_t> dead_;
  std::vector<std::uint64_t> resume_;  // connections whose wait was answered
  std::array<char, std::size_t{64} << 10> buffer_{};
  std::uint64_t next_id_ = 2;
  bool accept_paused_ = false;
  Clock::time_point accept_resume_;
  std::thread loop_;
};

}  // namespace commgrid::bootstrap::tcp
