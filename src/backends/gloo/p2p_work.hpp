// Point-to-point work on Gloo: messages to this rank itself, the posted operations of a
// batch, and the Work that waits for them against one deadline.
#pragma once

#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"

namespace commgrid::gloo_backend {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

/// Gloo has no connection from a rank to itself, so messages a rank sends to itself are
/// matched here: per slot, in posting order, like any other pair's messages.
struct SelfMessage {
  void* buf = nullptr;
  size_t bytes = 0;
  bool done = false;
};

class SelfMailbox {
 public:
  /// Posts a send (or receive) to this rank; when a receive (send) with the same slot is
  /// already waiting, copies the data and completes both. Throws InvalidValueError when the
  /// two carry different byte counts.
  std::shared_ptr<SelfMessage> post(bool is_send, std::uint64_t slot, void* buf, size_t bytes,
                                    const std::string& where);

 private:
  std::map<std::uint64_t, std::deque<std::shared_ptr<SelfMessage>>> sends_, recvs_;
};

/// One posted point-to-point operation: on a Gloo pair (ub), to this rank itself (self), or
/// empty (nothing travels: both sides know the count is 0).
struct PendingP2P {
  P2POp::Kind kind = P2POp::Kind::send;
  int peer = 0;
  int tag = 0;
  std::unique_ptr<::gloo::transport::UnboundBuffer> ub;
  std::shared_ptr<SelfMessage> self;
  bool done = false;
};

class GlooCommunicator;

/// The Work of isend, irecv and batch_isend_irecv (and of the rooted collectives): waits for
/// every operation against one deadline, `timeout` from when they were posted.
class GlooP2PWork final : public Work {
 public:
  GlooP2PWork(GlooCommunicator& comm, std::string op, std::vector<PendingP2P> ops,
              Clock::time_point deadline, Ms timeout)
      : comm_(comm), op_(std::move(op)), ops_(std::move(ops)), deadline_(deadline),
        timeout_(timeout) {}
  ~GlooP2PWork() override {
    if (waited_) return;
    try {
      wait();
    } catch (...) {
      // A destructor cannot report; wait() is where errors are seen.
    }
  }
  void wait() override;
  bool done() const override;

 private:
  GlooCommunicator& comm_;
  std::string op_;
  mutable std::vector<PendingP2P> ops_;
  Clock::time_point deadline_;
  Ms timeout_;
  bool waited_ = false;
};

}  // namespace commgrid::gloo_backend
