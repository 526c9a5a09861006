// Store: where the ranks of a job meet before they can talk to each other (rendezvous).
// The stores are Gloo's (in-memory, file, Redis) and live in the commgrid::gloo target.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "commgrid/communicator.hpp"

namespace commgrid {

/// Every store wait was cut short by Store::abort (e.g. a sibling rank thread failed), or a
/// peer of a group closed its connection mid-operation: the error is a consequence of a
/// failure elsewhere. The message names what happened and, where known, where.
class AbortedError : public BackendError {
 public:
  using BackendError::BackendError;
};

/// A key-value store shared by the ranks of one job. Keys are written once (a second set of
/// the same key is an error) and never removed, so every rendezvous uses a fresh key prefix.
/// Every method is thread-safe; waits poll (a few milliseconds apart) and always end by a
/// timeout or by abort(), never hang.
class Store {
 public:
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Sets `key` to `value`. Throws BackendError if the key exists or the store fails.
  void set(const std::string& key, std::span<const char> value);
  /// The value of `key`, which must be present (wait for it first).
  [[nodiscard]] std::vector<char> get(const std::string& key);
  /// Whether `key` is present; never blocks.
  [[nodiscard]] bool has(const std::string& key);
  /// Waits until every key is present or `timeout` passes; returns the keys still missing
  /// (empty: all present). Throws AbortedError once abort() was called.
  std::vector<std::string> wait_for(std::span<const std::string> keys,
                                    std::chrono::milliseconds timeout);
  /// Makes every current and future wait on this store object throw AbortedError with
  /// `reason`. Used to unblock sibling threads when one rank of a local job fails.
  void abort(const std::string& reason);
  /// Whether abort() was called.
  [[nodiscard]] bool aborted() const noexcept;

  /// "memory", "file:///path" or "redis://host:port/prefix": where the store is.
  [[nodiscard]] virtual std::string uri() const = 0;

 protected:
  Store();
  /// Backend hooks, called with the store's mutex held (so a non-thread-safe engine such as
  /// one hiredis connection is safe); none may block for long.
  virtual void do_set(const std::string& key, const std::vector<char>& value) = 0;
  virtual std::vector<char> do_get(const std::string& key) = 0;
  virtual bool do_has(const std::string& key) = 0;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// An in-memory store (Gloo's HashStore) for ranks that are threads of one process.
std::shared_ptr<Store> make_memory_store();
/// A store in a folder (Gloo's FileStore) for processes of one machine or a shared file
/// system. The folder must exist; use a fresh, empty one per job.
std::shared_ptr<Store> make_file_store(const std::string& folder);
/// A Redis store (Gloo's RedisStore) for machines that share nothing but the network.
/// Keys are prefixed with `prefix` so that jobs sharing one server do not collide: give
/// every job its own prefix. Connecting times out after 5 seconds (TimeoutError).
std::shared_ptr<Store> make_redis_store(const std::string& host, int port,
                                        const std::string& prefix = "commgrid");

/// Opens a store from its URI: `file:///absolute/folder`, `redis://host:port` or
/// `redis://host:port/prefix`, or `memory` (only useful within one process). Throws
/// ConfigError (parameter "store") for anything else, naming the text and the accepted forms.
std::shared_ptr<Store> open_store(std::string_view uri);

}  // namespace commgrid
