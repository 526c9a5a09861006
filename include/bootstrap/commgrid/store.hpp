// Store: where the ranks of a job meet before they can talk to each other (rendezvous).
// The stores (in-memory, file, Redis, tcp) live in the commgrid::bootstrap target.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/communicator.hpp"

namespace commgrid {

/// A key-value store shared by the ranks of one job. Keys are written once (a second set of
/// the same key is an error) and never removed, so every rendezvous uses a fresh key prefix.
/// Every method is thread-safe; waits poll (a few milliseconds apart, or, on a tcp:// store,
/// wait at the server) and always end by a timeout or by abort(), never hang.
class Store {
 public:
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Sets `key` to `value`. Throws BackendError if the key exists or the store fails.
  void set(const std::string& key, std::span<const char> value);
  /// Sets `key` to `value` unless it is present: true when this call set it, false when the
  /// key was already set (its value is then the first writer's; read it with get()).
  /// Atomic across every process that uses the store: of concurrent calls on one key
  /// exactly one returns true (memory: under the store's mutex; file: link(2), which
  /// refuses an existing name; Redis: SET NX; tcp://: decided by the server). This is the
  /// compare-and-set the resilience runtime agrees with (docs/resilience.md). Throws
  /// BackendError when the store fails.
  [[nodiscard]] bool set_if_absent(const std::string& key, std::span<const char> value);
  /// The value of `key`, which must be present (wait for it first).
  [[nodiscard]] std::vector<char> get(const std::string& key);
  /// Whether `key` is present; never blocks.
  [[nodiscard]] bool has(const std::string& key);
  /// Waits until every key is present or `timeout` passes; returns the keys still missing
  /// (empty: all present). Throws AbortedError once abort() was called, or as soon as the
  /// key of this thread's WaitWatch is present (checked at least every 250 ms).
  std::vector<std::string> wait_for(std::span<const std::string> keys,
                                    std::chrono::milliseconds timeout);
  /// Fences `process` (StoreOptions::process of the fenced one): the store refuses its every
  /// later request with FencedError carrying `message`, and it cannot connect as it again.
  /// Returns whether the store enforces it: only the tcp:// store (whose server is ours);
  /// with memory, file and Redis stores fencing is cooperative (docs/resilience.md).
  bool fence(const std::string& process, const std::string& message);
  /// Makes every current and future wait on this store object throw AbortedError with
  /// `reason`. Used to unblock sibling threads when one rank of a local job fails.
  void abort(const std::string& reason);
  /// Whether abort() was called.
  [[nodiscard]] bool aborted() const noexcept;

  /// "memory", "file:///path" or "redis://host:port/prefix": where the store is. Never
  /// contains a password.
  [[nodiscard]] virtual std::string uri() const = 0;
  /// The address of this machine on the network the store is reached through (the local end
  /// of its connection): the interface a rank's listeners bind to. "127.0.0.1" for the
  /// memory and file stores, which join ranks of one machine.
  [[nodiscard]] virtual std::string local_address() const;
  /// The job's random secret (64 hex digits) when the job has no token, else empty: the
  /// first rank to claim the store generated it and wrote it with the claim (a memory store
  /// makes its own), and every rank that opens the store under the claim reads the same.
  /// See effective_token(): only who can read the store learns it.
  [[nodiscard]] const std::string& job_secret() const noexcept;

 protected:
  Store();
  /// Sets job_secret(), once, before the store is shared (by its factory or constructor).
  void set_job_secret(std::string secret);
  /// Backend hooks, called with the store's mutex held (so a non-thread-safe engine such as
  /// one hiredis connection is safe); none may block for long.
  virtual void do_set(const std::string& key, const std::vector<char>& value) = 0;
  /// set_if_absent's hook. The default (do_has, then do_set) is atomic only among the users
  /// of this one store object; every store of commgrid overrides it with its engine's own
  /// atomic operation.
  virtual bool do_set_if_absent(const std::string& key, const std::vector<char>& value);
  /// fence()'s hook; the default enforces nothing and returns false.
  virtual bool do_fence(const std::string& process, const std::string& message);
  virtual std::vector<char> do_get(const std::string& key) = 0;
  virtual bool do_has(const std::string& key) = 0;
  /// The keys of `keys` still missing after waiting for them at most `slice` (a fraction of
  /// the caller's timeout). The default checks each with do_has and does not wait (the
  /// caller then pauses before asking again); a store that can wait where the keys are
  /// (the tcp:// store's server) overrides it, and also waits_in_slices().
  virtual std::vector<std::string> do_wait(std::vector<std::string> keys,
                                           std::chrono::milliseconds slice);
  /// Whether `key` is present as the copy of the store nearest to this process has it: may
  /// answer false for a key set a moment ago elsewhere (a later check sees it), never true
  /// for an absent one. wait_for checks its WaitWatch key with it on every round. The
  /// default: do_has.
  virtual bool do_has_nearby(const std::string& key) { return do_has(key); }
  /// Whether do_wait waits (true) or only checks (false: wait_for pauses between checks).
  [[nodiscard]] virtual bool waits_in_slices() const { return false; }
  /// Set by abort(); a do_wait that waits should end soon after it turns true.
  [[nodiscard]] const std::atomic<bool>& abort_flag() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// This process was declared dead (fenced) by the job it belonged to: it may not rejoin.
class FencedError : public BackendError {
 public:
  using BackendError::BackendError;
};

/// Which job a store is opened for, and with what secret.
struct StoreOptions {
  /// The job's id: a file store folder, a Redis prefix or a TCP store port holds one job;
  /// a second job there fails at once with JobConflictError. No '/', spaces or newlines.
  std::string job_id = "default";
  /// The job's secret (empty: none). The file store records a keyed hash of it; the TCP
  /// store answers a challenge with it; it never appears in a message.
  std::string token;
  /// Bound on connecting to the store (and, for a TCP store's clients, on each request).
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  /// tcp:// only: this process serves the store (rank 0, MASTER_ADDR:MASTER_PORT).
  bool serve = false;
  /// The rank this process joins the job as (-1: none, e.g. ranks that are threads sharing
  /// a store object, or a tool); make_gloo_world_from_env sets it. The rank claims its place
  /// in the store (key "commgrid-job/rank/R", a value unique to the process), so that a second job
  /// with the same id on the same store fails at once, in each of its ranks whose place is taken,
  /// with JobConflictError "... is in use by another job with the same id ..." instead of
  /// merging. The same process may open the store again as the same rank.
  Rank rank = -1;
  /// With rank >= 0: what tells this run of the job from another run with the same id
  /// (LaunchInfo::nonce: COMMGRID_JOB_NONCE, SLURM's job and step, Open MPI's namespace;
  /// empty: the launcher gave none). The first rank to join records it with `epoch`
  /// ("commgrid-job/run"); a rank of another run (another nonce, or none where the store's
  /// run has one, or the reverse) or of another start is refused with JobConflictError,
  /// even when its place is free: a rank that starts late cannot be replaced by another
  /// job's rank (docs/security.md, "Two jobs with one id").
  std::string nonce = {};
  /// With rank >= 0: which start of the job this is (TORCHELASTIC_RESTART_COUNT; 0 for the
  /// first): recorded and compared with `nonce`.
  Rank epoch = 0;
  /// tcp:// server only: the ranks of the job (0: unknown), whose connections the server
  /// keeps room for: connections that have not proven the token yet may hold at most a
  /// quarter of what the descriptor limit leaves beside them.
  Rank world_size = 0;
  /// The process identity this store connection speaks for (resilience: "process/3/0",
  /// process 3's first incarnation), so that a fence() of it is enforced: a tcp:// store's
  /// server refuses the process's requests from then on (FencedError). Empty: none.
  std::string process = {};
  /// tcp:// server only: the most connections it serves at once (0: COMMGRID_STORE_MAX_CONNECTIONS
  /// when set, else only the descriptor limit bounds them). A rank refused for it is told
  /// the number and which limit it was, retries until its timeout, then fails with that.
  std::size_t max_connections = 0;
  /// tcp:// server only: the most bytes it holds, counting each key's bookkeeping (128 bytes)
  /// with its key and value (0: COMMGRID_STORE_MAX_BYTES when set, else a quarter of this
  /// machine's memory, at most 16 GiB). A set beyond it is refused, naming the limit.
  std::size_t max_bytes = 0;
};

/// While it lives, every Store::wait_for made by this thread also ends, with AbortedError
/// naming `key` and its value, as soon as `key` is present in the store waited on: a wait
/// for peers that a failure elsewhere made pointless. Recovery::build watches its epoch's
/// failure key while the epoch's world is created, so that a process that died before
/// arriving fails the others at once instead of at the timeout. Scopes nest (the inner one
/// wins); thread-local, so ranks that are threads of one process do not see each other's.
class WaitWatch {
 public:
  explicit WaitWatch(std::string key);
  ~WaitWatch();
  WaitWatch(const WaitWatch&) = delete;
  WaitWatch& operator=(const WaitWatch&) = delete;
  /// This thread's innermost watched key; nullptr when none.
  [[nodiscard]] static const std::string* current() noexcept;

 private:
  std::string key_;
  const WaitWatch* outer_;
};

/// An in-memory store for ranks that are threads of one process.
std::shared_ptr<Store> make_memory_store();
/// A store in a folder (one 0600 file per key) for processes of one machine or a shared file
/// system. The folder must exist; use a fresh, empty one per job.
/// The folder is claimed for options.job_id (a 0600 file "commgrid-job" holding the id and
/// a keyed hash of the token); key files are 0600.
std::shared_ptr<Store> make_file_store(const std::string& folder, const StoreOptions& options = {});
/// A Redis store (hiredis) for machines that share nothing but the network.
/// Keys are prefixed with `prefix` so that jobs sharing one server do not collide: give
/// every job its own prefix. Connecting times out after 5 seconds (TimeoutError).
std::shared_ptr<Store> make_redis_store(const std::string& host, int port,
                                        const std::string& prefix = "commgrid");
/// As above, sending `password` with AUTH (empty: none; AuthenticationError when refused;
/// never shown) and claiming the prefix for options.job_id (JobConflictError when another
/// job holds it).
std::shared_ptr<Store> make_redis_store(const std::string& host, int port,
                                        const std::string& prefix, const std::string& password,
                                        const StoreOptions& options);

/// Opens a store from its URI: `file:///absolute/folder`, `redis://[:password@]host:port[/prefix]`,
/// `tcp://host:port` (served by the process with options.serve),
/// `etcd://[user:password@]host:port[,host:port...][/prefix]` (an etcd cluster's members;
/// docs/launching.md) or `memory` (only useful within one process). Throws ConfigError
/// (parameter "store") for anything else, naming the text (without a password) and the
/// accepted forms.
std::shared_ptr<Store> open_store(std::string_view uri, const StoreOptions& options = {});

/// Creates (or checks) the etcd user of job options.job_id, "commgrid-<job id>", whose
/// password is derived from options.token, with a role that may read and write only the
/// job's key prefix (the URI's, else "commgrid/<job id>"), as etcd's `root_user`. Returns
/// false when the cluster has authentication off (nothing to create). Throws
/// AuthenticationError when etcd refuses the root user, JobConflictError when the job's user
/// exists with another token's password, ConfigError without a token. docs/security.md.
bool grant_etcd_job(const std::string& uri, const std::string& root_user,
                    const std::string& root_password, const StoreOptions& options);

/// The secret a job's ranks prove to each other (the Gloo connection gate and pair proofs):
/// `token` when it is not empty, else store.job_secret(). Without a token this keeps out
/// anyone who cannot read the store (a scanner of the job's ports, another job); only a
/// token keeps out those who can read it (the same user, or anyone who reaches a token-less
/// tcp:// store or an open Redis).
std::string effective_token(const Store& store, const std::string& token);

/// Bytes that came from a peer or a store (anyone who could write there chose them), as
/// they may appear in a message: in single quotes, cut after `max_bytes` ("...' (N bytes)"),
/// with every byte outside printable ASCII, the quote and the backslash written \xNN. Used
/// wherever such bytes enter an error, so that a stranger cannot forge lines, colour a
/// terminal or flood a log.
[[nodiscard]] std::string quote_untrusted(std::string_view bytes, std::size_t max_bytes = 120);

/// OpenSSL's random generator failed: no secret or challenge can be made. Never caught
/// by commgrid (a job without a cryptographic random source must not start).
class RandomSourceError : public BackendError {
 public:
  using BackendError::BackendError;
};

/// `bytes` random bytes from OpenSSL's cryptographic generator (RAND_bytes), as 2 * bytes
/// lowercase hex digits: the job secret, a job token, every challenge. Throws
/// RandomSourceError when the generator fails, InvalidValueError for 0 or more than 2^20.
[[nodiscard]] std::string random_secret_hex(std::size_t bytes);

/// options.token in hex, keyed-hashed (HMAC-SHA256) with `context`: what a store or a peer
/// may learn about the token without learning it. Empty when the token is empty.
std::string token_proof(const std::string& token, const std::string& context);

}  // namespace commgrid
