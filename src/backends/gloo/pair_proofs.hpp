// Pair proofs: both ends of every pair of a new group prove the job's token over it before
// the group is used, so a stranger that won a connection is named, not trusted.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <string>

namespace commgrid::gloo_backend {

/// Whoever connects first to a listening Gloo pair becomes the peer. Before a new group is
/// used, both ends of every pair therefore prove the job's token over it: HMAC-SHA256 of the
/// group's key prefix (unique per job, group and creation) and the two ranks. A stranger that
/// won a connection cannot produce it and is reported as an unauthenticated peer; the wait is
/// bounded by the creation's deadline, not per peer. A slot prefix of its own (0x7f) keeps
/// these messages apart from every collective and point-to-point message.
/// Throws AuthenticationError "unauthenticated peer at ADDR (expected rank R)".
void prove_peers(::gloo::Context& ctx, const std::string& token, const std::string& prefix,
                 int rank, const std::string& op, const std::string& group,
                 std::chrono::steady_clock::time_point deadline);

}  // namespace commgrid::gloo_backend
