// The tcp:// store's challenge and proofs (tcp_auth.hpp).
#include "tcp_auth.hpp"

#include "secrets.hpp"
#include "text.hpp"

namespace commgrid::bootstrap::tcp {
namespace {

std::string client_context(const std::string& job, const std::string& nonce) {
  return "commgrid tcp store client\n" + job + "\n" + nonce;
}
std::string server_context(const std::string& job, const std::string& nonce) {
  return "commgrid tcp store server\n" + job + "\n" + nonce;
}

}  // namespace

Message greeting(const StoreOptions& o, const std::string& challenge) {
  return {'H', {o.job_id, challenge}};
}

bool client_proven(const StoreOptions& o, const std::string& challenge, const std::string& proof) {
  return same_secret(proof, token_proof(o.token, client_context(o.job_id, challenge)));
}

Message server_answer(const StoreOptions& o, const std::string& client_challenge,
                      const std::string& job_secret) {
  return {'O', {token_proof(o.token, server_context(o.job_id, client_challenge)), job_secret}};
}

Handshake client_handshake(int fd, Clock::time_point deadline, const StoreOptions& o,
                           const std::string& uri, std::string& refusal, std::string& secret) {
  try {
    Message h;
    try {
      h = recv_message(fd, deadline, kMaxHandshakeFrame);
    } catch (const IoTimeout&) { throw; } catch (const IoError&) {
      return Handshake::dropped;
    }
    if (h.type == 'R' && h.fields.size() == 1) {
      refusal = quote_untrusted(h.fields[0], 300);
      return Handshake::refused;
    }
    if (h.type != 'H' || h.fields.size() != 2 || h.fields[1].size() != 32)
      throw AuthenticationError("tcp store " + uri +
                                ": the server does not speak commgrid's store protocol");
    if (h.fields[0] != o.job_id)
      throw JobConflictError("tcp store " + uri + " serves job " + quote_untrusted(h.fields[0]) +
                             " (this is job '" + o.job_id +
                             "'): give each job its own MASTER_PORT");
    const std::string nonce = random_bytes(32);
    Message answer;
    try {
      send_message(fd, {'A', {token_proof(o.token, client_context(o.job_id, h.fields[1])), nonce}},
                   deadline);
      answer = recv_message(fd, deadline, kMaxHandshakeFrame);
    } catch (const IoTimeout&) { throw; } catch (const IoError&) {
      return Handshake::dropped;
    }
    if (answer.type == 'R')
      throw AuthenticationError("tcp store " + uri + " refused this rank: it serves job '" +
                                o.job_id + "' with another token (COMMGRID_TOKEN differs)");
    if (answer.type != 'O' || answer.fields.size() != 2 ||
        !same_secret(answer.fields[0], token_proof(o.token, server_context(o.job_id, nonce))))
      throw AuthenticationError("tcp store " + uri + ": the server did not prove the job's token");
    secret = answer.fields[1];
    return Handshake::ok;
  } catch (const IoTimeout&) { return Handshake::timed_out; }
}

}  // namespace commgrid::bootstrap::tcp
