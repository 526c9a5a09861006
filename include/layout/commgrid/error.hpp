// commgrid's exceptions, every layer's in one header (standard library only). Recoverable
// errors (a bad config, a timeout, a backend failure) derive from commgrid::Error; broken
// internal invariants use COMMGRID_ENFORCE. Two families: ConfigError (the caller's
// mistake: the CLI exits 2) and BackendError (communication failed: the CLI exits 1).
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace commgrid {

/// Base of every error commgrid raises on purpose. what() is one line: "subject: what is
/// wrong", with the values involved.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A user-supplied value is invalid. parameter() names it ("tp", "order", "rank", ...).
class ConfigError : public Error {
 public:
  ConfigError(std::string parameter, const std::string& message)
      : Error(message), parameter_(std::move(parameter)) {}
  /// The parameter the message is about.
  [[nodiscard]] const std::string& parameter() const noexcept { return parameter_; }

 private:
  std::string parameter_;
};

/// A size or count is out of its range (rules 1, 2): `tp must be >= 1, got 0`.
class InvalidValueError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// The order string is malformed, or omits an axis whose size is not 1 (rules 3, 10).
class OrderError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// A size does not divide what it must divide (rules 4, 6, 8a, 8b).
class DivisibilityError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// Sizes that are each valid but do not fit together (rules 5, 7, 9, 11).
class IncompatibleError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// A product of sizes, or the world size, exceeds what ranks can address (rule 12).
class OverflowError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// An embedding policy returned an invalid group (rule 13).
class PolicyError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// A rank argument outside [0, world size) (rule 14).
class RankOutOfRangeError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// A group kind name that commgrid does not know, or a kind that does not exist for the
/// layout (e.g. hcp without hcp sizes).
class UnknownKindError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// An internal invariant failed: a bug in commgrid, not in the caller's input.
class InternalError : public Error {
 public:
  using Error::Error;
};

// ---- runtime: process groups and collections -------------------------------------------

/// A call that needs an initialized ProcessGroups came before initialize() or after
/// destroy(), or initialize() came twice. The message names the call.
class StateError : public Error {
 public:
  using Error::Error;
};

/// This rank has no group of the kind asked for: it is in none (a middle pipeline stage has
/// no embd group), the kind does not exist for the config (inter_dist_opt when
/// dist_opt_instances = 1) or was not requested. The message says which.
class NoGroupError : public Error {
 public:
  using Error::Error;
};

/// Ranks were given different configs or options. Raised on every rank after the
/// fingerprint exchange; parameter() is the first differing field, and the message lists
/// the values and the ranks holding each.
class ConfigMismatchError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// Reading a field of a collection that was never set. The message names the collection
/// and the field and says how to set it.
class UnsetFieldError : public Error {
 public:
  using Error::Error;
};

// ---- communication: backends and bootstrap ---------------------------------------------

/// A backend call failed. The message names the backend, the operation, the group and the
/// backend's own text: `mpi allreduce on tp#3: MPI_ERR_TRUNCATE: message truncated`.
class BackendError : public Error {
 public:
  using Error::Error;
};

/// A rendezvous or collective did not complete within its timeout. The message names the
/// group and, where the backend can tell, the ranks that did not arrive (where it cannot,
/// the message says so).
class TimeoutError : public BackendError {
 public:
  using BackendError::BackendError;
};

/// Every store wait was cut short by Store::abort (e.g. a sibling rank thread failed), or a
/// peer of a group closed its connection mid-operation: the error is a consequence of a
/// failure elsewhere. The message names what happened and, where known, where.
class AbortedError : public BackendError {
 public:
  using BackendError::BackendError;
};

/// Another job already uses the store's folder, key prefix or port, or another job with the
/// same id has taken this rank's place in it (StoreOptions::rank): jobs never merge.
class JobConflictError : public BackendError {
 public:
  using BackendError::BackendError;
};

/// The store or a peer did not prove the job's token (a stranger, or a rank of another job).
class AuthenticationError : public BackendError {
 public:
  using BackendError::BackendError;
};

// ---- resilience: a job that cannot go on after a failure -------------------------------

/// A job that lost processes cannot go on: no spare and no smaller layout, a state that no
/// live process holds, a state provider that failed. A runtime event, not bad input (the
/// CLI exits 1, not 2). Every process of the job raises it alike, with the same message;
/// the first to find it posts it to the job's store, where commgrid launch reads it and
/// says it once.
class RecoveryError : public Error {
 public:
  using Error::Error;
};

/// The state of a logical rank is lost: every process that held it (its data-parallel
/// replicas, or it and its buddy) died. The message names the logical rank.
class StateLostError : public RecoveryError {
 public:
  using RecoveryError::RecoveryError;
};

/// The program's state provider (save, load or reshard) failed: the message names the
/// process, the call and the provider's own message.
class StateProviderError : public RecoveryError {
 public:
  using RecoveryError::RecoveryError;
};

/// A rank of a local job failed. what() is "rank R: <the rank's own message>"; cause()
/// holds the original exception (rethrow it to recover its type).
class RankFailedError : public Error {
 public:
  RankFailedError(int rank, std::exception_ptr cause, const std::string& message)
      : Error(message), rank_(rank), cause_(std::move(cause)) {}
  /// The rank that failed first.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// The exception that rank threw.
  [[nodiscard]] std::exception_ptr cause() const noexcept { return cause_; }

 private:
  int rank_;
  std::exception_ptr cause_;
};

namespace detail {
[[noreturn]] void enforce_failed(const char* condition, const std::string& detail, const char* file,
                                 int line);
}  // namespace detail

}  // namespace commgrid

/// Checks an internal invariant; on failure throws InternalError with the condition, the
/// message and file:line.
#define COMMGRID_ENFORCE(cond, msg)                                                    \
  do {                                                                                 \
    if (!(cond)) ::commgrid::detail::enforce_failed(#cond, (msg), __FILE__, __LINE__); \
  } while (false)
