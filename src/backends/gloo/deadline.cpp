#include "deadline.hpp"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <memory>
#include <utility>

#include "commgrid/communicator.hpp"
#include "loop_turner.hpp"
#include "mesh_view.hpp"
#include "time_text.hpp"

namespace commgrid::gloo_backend {

using Clock = std::chrono::steady_clock;

namespace {

// Gloo's own timeout path, reached through its public API: a wait on a fresh buffer of a
// context that times out at once makes Gloo fail every pending send and receive of every
// pair of the context ("Application timeout caused pair closure"), which wakes all of the
// operation's waits, and close the pairs. The returned turner keeps the context's event loop
// turning until every operation whose deadline passed at the same time is signalled (the
// watchdog keeps it until then): the operations wake first, the loops then settle.
std::shared_ptr<void> close_connections(const std::shared_ptr<::gloo::Context>& ctx) {
  auto turner = std::make_shared<LoopTurner>(ctx->getDevice());
  char byte = 0;
  try {
    std::unique_ptr<::gloo::transport::UnboundBuffer> probe = ctx->createUnboundBuffer(&byte, 1);
    probe->waitRecv(std::chrono::milliseconds(0));
  } catch (const std::exception&) {
    // Expected: the wait's own timeout, after the pairs were signalled.
  }
  return turner;
}

}  // namespace

DeadlineGuard::DeadlineGuard(std::shared_ptr<::gloo::Context> context, std::string_view op,
                             const std::string& group, std::chrono::milliseconds timeout)
    : DeadlineGuard(std::move(context), op, group, timeout, Clock::now() + timeout) {}

// The context is shared with the action: the watchdog closes its pairs without holding up
// the operation, which may end (and its group be destroyed) meanwhile.
DeadlineGuard::DeadlineGuard(std::shared_ptr<::gloo::Context> context, std::string_view op,
                             const std::string& group, std::chrono::milliseconds timeout,
                             Clock::time_point deadline)
    : op_(op), group_(group), timeout_(timeout),
      watch_(deadline, [ctx = std::move(context), op = std::string(op)] {
        // A view over kept connections ends its own operations; the pairs stay open.
        if (ViewTransport* view = view_of(*ctx)) {
          view->abort("the deadline of its " + op + " passed");
          return std::shared_ptr<void>();
        }
        return close_connections(ctx);
      }) {}

DeadlineGuard::~DeadlineGuard() = default;

bool DeadlineGuard::release() { return watch_.release(); }

bool DeadlineGuard::passed() const { return watch_.passed(); }

std::string DeadlineGuard::timeout_text() const {
  return "gloo " + std::string(op_) + " on " + group_ + ": timed out after " +
         seconds_text(timeout_) +
         " (one deadline for the whole operation); its connections are closed and the group "
         "cannot be used again";
}

void throw_deadline_passed(const std::string& text) { throw TimeoutError(text); }

}  // namespace commgrid::gloo_backend
