// The connection gate: no stranger's byte reaches Gloo's parser.
//
// Debian's Gloo (0.0~git20220518) gives every pending pair a listening socket of its own and
// takes whoever connects first as the peer; its event loop then parses that socket's bytes
// as Gloo messages, and a crafted header makes it throw on its loop thread, which aborts the
// process. Gloo offers no hook between accept() and its parser, so the gate stands in
// front of the calls Gloo makes through the C library:
//
// - listen(): a socket that starts listening on a thread inside a PairGateScope (that is,
//   while Gloo connects a group's pairs) is a Gloo pair listener. The gate moves the
//   listening socket to a descriptor of its own and leaves Gloo, under the number Gloo
//   holds, one end of a local socket pair that turns readable only once the pair is decided
//   (getsockname() on it answers the listening address, which Gloo publishes). The proofs
//   both ends must send are HMAC-SHA256(token, end, group key prefix, listening port), 64 hex
//   characters, where `end` is "listener" or "connector" (neither passes for the other).
// - the gate's own thread accepts every connection on every such listener, sends it the
//   listener's proof and reads until one sends the connector's whole proof; the others are
//   closed and reported as unauthenticated peers. Neither silence nor a refusal ends the
//   wait for the genuine peer before the scope's deadline (on a slow, lossy link its proof
//   can take seconds); a listener holds at most 16 connections without a proof, refusing the
//   oldest past that. Gloo's event loop never waits for a proof, so a stranger on one
//   listener holds up no other pair. At the deadline the pair is decided as failed and
//   commgrid names the refused or late peers.
// - accept(): on a decided listener (Gloo's loop thread) returns the proven socket, or fails
//   with the deadline's error.
// - connect(): inside a scope, Gloo's connecting side completes the TCP connection, checks
//   the listener's proof and sends its own before Gloo sees the socket; a wrong proof is
//   refused and named the same way.
//
// The definitions of listen/connect/accept/getsockname live in this library and take the C
// library's place for the whole process (symbol interposition), so they pass every other call
// straight through. That only works where this library is part of the program's global
// symbol scope (linked into the program, or a shared library it loads at start); in a
// plugin opened with dlopen the C library's calls win, pair_gate_available() says so, and
// the gate is off. Both ends must agree: the gate state travels with a pair's address.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace commgrid::gloo_backend {

/// True when this process's accept, connect, listen and getsockname are the gate's (see above).
bool pair_gate_available();

/// Gates the Gloo pairs this thread creates and connects while the scope is alive.
class PairGateScope {
 public:
  struct State;
  /// `token` may be empty (the proof is then 64 zeros: it keeps garbage out, it proves
  /// nothing); `prefix` names the group creation; `rank` is this rank's rank in the group
  /// (Gloo creates the pairs, and so the listeners, in peer order, skipping itself); the
  /// gate gives up at `deadline`.
  PairGateScope(const std::string& token, const std::string& prefix, int rank,
                std::chrono::steady_clock::time_point deadline);
  /// For pairs made with some peers only (kept connections made anew): the listeners are
  /// created for `peers`, in that order.
  PairGateScope(const std::string& token, const std::string& prefix, int rank,
                std::vector<int> peers, std::chrono::steady_clock::time_point deadline);
  ~PairGateScope();
  PairGateScope(const PairGateScope&) = delete;
  PairGateScope& operator=(const PairGateScope&) = delete;

  /// The scope stops being this thread's current one (its listeners stay gated until it
  /// ends): several groups can be connecting at once, each entered in turn (Entered).
  void leave();
  /// While alive, `scope` is this thread's current scope again (the one listen and connect
  /// answer to); the previous one afterwards.
  class Entered {
   public:
    explicit Entered(PairGateScope& scope);
    ~Entered();
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;

   private:
    State* previous_ = nullptr;
    bool active_ = false;
  };

  /// Whether the gate is on for this scope (pair_gate_available()).
  [[nodiscard]] bool active() const { return static_cast<bool>(state_); }
  /// One line per connection the gate refused: "unauthenticated peer at ADDR (on the
  /// listener for peer P of this group): why", in the order they were refused.
  [[nodiscard]] std::vector<std::string> refused() const;
  /// The peers (ranks in the group) whose connection this rank's listeners still awaited
  /// at the deadline. The gate ends those waits then (Gloo bounds each pair's wait on its
  /// own, one after another: peers connecting late one by one would add up).
  [[nodiscard]] std::vector<int> late_peers() const;

 private:
  std::shared_ptr<State> state_;
  State* outer_ = nullptr;
};

/// For tests: `hook(port)` runs on the creating thread each time a Gloo pair listener is
/// recorded (before any peer can know its address); nullptr removes it.
void set_pair_gate_listen_hook(void (*hook)(int port));

/// For tests: a connecting side waits this long after checking the listener's proof and
/// before sending its own (a slow link); zero (the default) for none.
void set_pair_gate_connect_delay_for_testing(std::chrono::milliseconds delay);

/// For tests: holds the lock of the gate's records (which its thread, every creation and
/// the interposed calls on a recorded listener take) until the returned lock is released.
[[nodiscard]] std::unique_lock<std::mutex> lock_pair_gate_for_testing();

/// Suspends this thread's scope: the store's own connections made during a rendezvous are
/// not Gloo pairs.
class PairGatePause {
 public:
  PairGatePause();
  ~PairGatePause();
  PairGatePause(const PairGatePause&) = delete;
  PairGatePause& operator=(const PairGatePause&) = delete;
};

}  // namespace commgrid::gloo_backend
