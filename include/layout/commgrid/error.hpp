// commgrid's exceptions. Recoverable errors (a bad config, a timeout, a backend failure)
// derive from commgrid::Error; broken internal invariants use COMMGRID_ENFORCE.
#pragma once

#include <stdexcept>
#include <string>

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

namespace detail {
[[noreturn]] void enforce_failed(const char* condition, const std::string& detail,
                                 const char* file, int line);
}  // namespace detail

}  // namespace commgrid

/// Checks an internal invariant; on failure throws InternalError with the condition, the
/// message and file:line.
#define COMMGRID_ENFORCE(cond, msg)                                            \
  do {                                                                         \
    if (!(cond)) ::commgrid::detail::enforce_failed(#cond, (msg), __FILE__, __LINE__); \
  } while (false)
