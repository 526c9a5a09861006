#include "p2p_work.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "deadline.hpp"
#include "gloo_communicator.hpp"

namespace commgrid::gloo_backend {

std::shared_ptr<SelfMessage> SelfMailbox::post(bool is_send, std::uint64_t slot, void* buf,
                                               size_t bytes, const std::string& where) {
  auto msg = std::make_shared<SelfMessage>(SelfMessage{buf, bytes, false});
  auto& waiting = is_send ? recvs_[slot] : sends_[slot];
  if (waiting.empty()) {
    (is_send ? sends_[slot] : recvs_[slot]).push_back(msg);
    return msg;
  }
  std::shared_ptr<SelfMessage> other = waiting.front();
  waiting.pop_front();
  SelfMessage& send = is_send ? *msg : *other;
  SelfMessage& recv = is_send ? *other : *msg;
  if (send.bytes != recv.bytes)
    throw InvalidValueError(
        "count", where + ": a message to this rank itself carries " + std::to_string(send.bytes) +
                     " bytes, its receive expects " + std::to_string(recv.bytes));
  if (send.bytes > 0) std::memcpy(recv.buf, send.buf, send.bytes);
  send.done = recv.done = true;
  return msg;
}

void GlooP2PWork::wait() {
  waited_ = true;
  // While the deadline is ahead, the watchdog bounds the waits together and, when it passes,
  // closes the group's connections at once (Gloo's own timeout closes them one event-loop
  // turn apart, about 5 ms a peer: seconds in a large group). A wait that starts after the
  // deadline only collects what has completed, as a zero timeout does.
  std::optional<DeadlineGuard> deadline;
  if (Clock::now() < deadline_ &&
      std::any_of(ops_.begin(), ops_.end(), [](const PendingP2P& p) { return !p.done && p.ub; }))
    deadline.emplace(comm_.context(), op_, comm_.name(), timeout_, deadline_);
  auto ran_out = [&] { return deadline && (deadline->release() || deadline->passed()); };
  for (PendingP2P& op : ops_) {
    if (op.done) continue;
    const char* what = op.kind == P2POp::Kind::send ? "send to" : "receive from";
    if (op.self) {
      // This rank's own messages are matched when posted; one still open now can never
      // be (nothing else runs on this communicator while this thread waits).
      if (!op.self->done)
        throw BackendError(
            "gloo " + op_ + " on " + comm_.name() + ": a " + what + " this rank itself (tag " +
            std::to_string(op.tag) + ") has no matching " +
            (op.kind == P2POp::Kind::send ? "receive" : "send") + "; post both before waiting");
      op.done = true;
      continue;
    }
    // Rounded up: Gloo's own wait then ends at the deadline or after it, never a fraction of
    // a millisecond before it (its timeout would read as Gloo's, not as the deadline's).
    const auto left = std::max(Ms(0), std::chrono::ceil<Ms>(deadline_ - Clock::now()));
    try {
      comm_.call(
          op_,
          [&] {
            int peer = -1;
            const bool ok = op.kind == P2POp::Kind::send ? op.ub->waitSend(&peer, left)
                                                         : op.ub->waitRecv(&peer, left);
            if (!ok)
              throw AbortedError("gloo " + op_ + " on " + comm_.name() + ": aborted (" +
                                 comm_.peer_text(op.peer, op.tag) + ")");
          },
          comm_.peer_text(op.peer, op.tag));
    } catch (const Error&) {
      if (ran_out())
        throw TimeoutError(deadline->timeout_text() + " (" + comm_.peer_text(op.peer, op.tag) +
                           ")");
      throw;
    }
    op.done = true;
  }
  // Everything completed, but just as the deadline passed: the connections are closed.
  if (deadline && deadline->release()) throw TimeoutError(deadline->timeout_text());
}

bool GlooP2PWork::done() const {
  for (PendingP2P& op : ops_) {
    if (op.done) continue;
    if (op.self) {
      if (!op.self->done) return false;
      op.done = true;
      continue;
    }
    try {
      int peer = -1;
      const bool ok = op.kind == P2POp::Kind::send ? op.ub->waitSend(&peer, Ms(0))
                                                   : op.ub->waitRecv(&peer, Ms(0));
      if (!ok) return false;
      op.done = true;
    } catch (const std::exception&) {
      return false;  // not yet (or failed: wait() reports it)
    }
  }
  return true;
}

}  // namespace commgrid::gloo_backend
