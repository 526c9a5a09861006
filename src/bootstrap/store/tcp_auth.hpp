// The tcp:// store's authentication: on every connection the server greets with the job id
// and a fresh 32-byte challenge; the client answers with HMAC-SHA256(token, its purpose, job,
// challenge) and a challenge of its own, which the server answers the same way (with the
// job secret of a job without a token). Both proofs are checked in constant time.
#pragma once

#include <string>

#include "commgrid/store.hpp"
#include "tcp_io.hpp"

namespace commgrid::bootstrap::tcp {

/// The greeting the server sends a new connection: 'H' {job id, challenge}.
[[nodiscard]] Message greeting(const StoreOptions& options, const std::string& challenge);

/// Whether `proof` is the client's proof for the server's `challenge`.
[[nodiscard]] bool client_proven(const StoreOptions& options, const std::string& challenge,
                                 const std::string& proof);

/// The server's answer to a proven client: 'O' {its proof of the client's challenge, the job
/// secret (empty with a token)}.
[[nodiscard]] Message server_answer(const StoreOptions& options,
                                    const std::string& client_challenge,
                                    const std::string& job_secret);

/// How a client's handshake ended.
enum class Handshake {
  ok,         ///< both proven; the job secret is known
  refused,    ///< the server refused the connection for a limit (the reason is kept)
  dropped,    ///< the server closed it before the handshake ended (it may be overloaded)
  timed_out,  ///< the deadline passed
};

/// The client's half on a connected socket, by `deadline`. `refusal` receives the server's
/// reason when it refuses; `secret` the job secret once proven. Throws AuthenticationError
/// when the server is not commgrid's, refuses this token or does not prove its own, and
/// JobConflictError when it serves another job. `uri` names the store in errors.
[[nodiscard]] Handshake client_handshake(int fd, Clock::time_point deadline,
                                         const StoreOptions& options, const std::string& uri,
                                         std::string& refusal, std::string& secret);

}  // namespace commgrid::bootstrap::tcp
