// Kept connections: one Gloo TCP pair between every two processes of a job (spares
// included), made once and kept across the job's epochs. An epoch's world, and every group
// made from it, is a view over those pairs: rank i of a view is one process of the mesh, and
// the view's messages carry a namespace of their own in bits 8-23 and 48-55 of every slot, so views
// that share a pair never match each other's messages. Making a view connects nothing. When
// an epoch ends on a process, the pairs that held an unfinished operation (either end may
// hold its bytes) are closed and made anew before the next epoch; every other pair is kept.
// docs/resilience.md, "Kept connections".
#pragma once

#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "connection.hpp"

namespace commgrid::gloo_backend {

class ViewTransport;

/// The job's pairs on one process: process `process` of `processes`.
class ProcessMesh final : public std::enable_shared_from_this<ProcessMesh> {
 public:
  ProcessMesh(std::shared_ptr<Shared> shared, int process, int processes,
              std::chrono::milliseconds timeout);
  ~ProcessMesh();
  ProcessMesh(const ProcessMesh&) = delete;
  ProcessMesh& operator=(const ProcessMesh&) = delete;

  [[nodiscard]] int process() const noexcept { return process_; }
  [[nodiscard]] int processes() const noexcept { return processes_; }
  [[nodiscard]] const std::shared_ptr<Shared>& shared() const noexcept { return shared_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Every process of the job but this one, ascending.
  [[nodiscard]] const std::vector<int>& others() const noexcept { return others_; }

  /// Makes this process's pairs with `peers` (ascending, without this process) anew, each
  /// one's old pair closed first: both ends of every such pair call it with the same
  /// `generation` (the epoch) and `prefix` (the address keys), by `deadline`. The pairs are
  /// gated and proven as a group's are (pair_gate.hpp, pair_proofs.hpp).
  void connect(const std::string& prefix, const std::vector<int>& peers, std::uint32_t generation,
               std::chrono::steady_clock::time_point deadline);

  /// The mesh pair with `process` (for Gloo's check that a pair exists).
  std::unique_ptr<::gloo::transport::Pair>& pair(int process);
  /// A buffer of the mesh's transport (a view wraps it).
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer(void* ptr, std::size_t size);

  /// A namespace for a new view that this process leads (creates the key for): 1 +
  /// process + processes x n for its n-th view, unique in the job while the job lasts.
  /// Throws BackendError once 23 bits no longer hold it (the upper half of the 24 bits is
  /// the derived namespaces').
  std::uint32_t next_namespace();

  /// Derived namespaces, which every member computes alike without a rendezvous: epoch e's
  /// world view takes derived_base(e), and the n-th group of the first batch made from it
  /// derived_base(e) + 1 + n, for n < derived_span() - 1. nullopt once the epoch's span no
  /// longer fits the 24 bits (then the store names them, next_namespace).
  [[nodiscard]] std::optional<std::uint32_t> derived_base(std::int64_t epoch) const;
  [[nodiscard]] std::uint32_t derived_span() const noexcept;

  /// The epoch the views made now belong to; a notice of an earlier epoch's end is stale.
  void begin_epoch(std::int64_t epoch);
  /// Ends the current epoch on this process: every view's waits end at once (its
  /// operations throw AbortedError), every live peer gets a notice (a peer blocked on this
  /// process learns at once, whatever pair it waits on), and the pairs that held an
  /// unfinished operation are listed. Returns those peers (and any whose pair failed): their
  /// pairs with this process must be made anew. Idempotent within an epoch. A process that
  /// received a peer's notice of the epoch sends none: that peer sent one to every process,
  /// so an epoch's end costs the job a notice per pair of the processes that found the
  /// failure themselves, not W^2 (if that peer dies before its notices leave, a process
  /// it missed learns from another's, or from its own operation's deadline, as with any
  /// failure).
  std::vector<int> end_epoch();
  /// The notices end_epoch has sent so far.
  [[nodiscard]] std::int64_t notices_sent();

  // For views and their buffers.
  void add_view(ViewTransport* view);
  void remove_view(ViewTransport* view);
  /// Keeps the Gloo buffer (and its bytes) of an operation on the pair with `process` that
  /// never completed, until that pair is made anew; the pair is listed as unfinished.
  void bury(int process, std::unique_ptr<::gloo::transport::UnboundBuffer> buffer,
            std::unique_ptr<std::vector<char>> bytes);

 private:
  using Clock = std::chrono::steady_clock;
  void watch_notices();
  void post_watch();  // with m_ held
  std::shared_ptr<Shared> shared_;
  int process_, processes_;
  std::vector<int> others_;  // every process but this one
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::Context> ctx_;  // the mesh: a Gloo context over every process
  std::mutex m_;                          // guards everything below
  std::condition_variable watch_cv_;
  std::set<ViewTransport*> views_;
  std::set<int> unfinished_;  // peers of operations never completed
  struct Buried {
    int process;
    std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
    std::unique_ptr<std::vector<char>> bytes;
  };
  std::vector<Buried> buried_;  // their buffers
  std::set<int> broken_;        // peers whose pair is closed, until made anew
  std::uint32_t next_ns_ = 0;
  std::int64_t epoch_ = 0, ended_ = -1, peer_ended_ = -1;
  // The epoch of the last notice that arrived (its sender told every peer).
  std::int64_t noticed_ = -1;
  // An epoch's end notices: every epoch's receive (from any peer, 8 bytes: the epoch) has a
  // buffer kept while the mesh lives; the watcher thread waits on the newest.
  std::vector<std::unique_ptr<std::int64_t>> notice_in_;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> watch_;
  std::vector<std::unique_ptr<std::int64_t>> notice_out_;  // what this process sent, per end
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> notice_sends_;
  bool stopping_ = false;
  std::thread watcher_;  // last: started once the members above exist
};

/// One view's transport over the mesh: rank i is process processes[i].
class ViewTransport final : public ::gloo::transport::Context,
                            public std::enable_shared_from_this<ViewTransport> {
 public:
  ViewTransport(std::shared_ptr<ProcessMesh> mesh, std::vector<int> processes, int rank,
                std::uint32_t ns);
  ~ViewTransport() override;
  ViewTransport(const ViewTransport&) = delete;
  ViewTransport& operator=(const ViewTransport&) = delete;

  std::unique_ptr<::gloo::transport::Pair>& getPair(int rank) override;
  std::unique_ptr<::gloo::transport::Pair>& createPair(int rank) override;
  std::unique_ptr<::gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr,
                                                                        size_t size) override;

  /// Ends every wait of this view's operations now and fails every later one (its deadline
  /// passed, or the epoch ended). The pairs stay open.
  void abort(const std::string& why);
  [[nodiscard]] bool aborted() const noexcept { return aborted_.load(); }
  [[nodiscard]] std::string why() const;

  [[nodiscard]] int process_of(int rank) const;
  [[nodiscard]] int rank_of(int process) const;
  /// `slot` with this view's namespace in bits 8-23 and 48-55 (which must be zero in
  /// `slot`).
  [[nodiscard]] std::uint64_t slot(std::uint64_t slot) const;
  [[nodiscard]] ProcessMesh& mesh() const noexcept { return *mesh_; }
  [[nodiscard]] const std::vector<int>& processes() const noexcept { return processes_; }
  /// An epoch's world view: the base of its groups' derived namespaces
  /// (ProcessMesh::derived_base). take_derived() gives it to the first batch of groups
  /// made from the view, once; nullopt after, and for any other view.
  void set_derived(std::uint32_t base);
  [[nodiscard]] std::optional<std::uint32_t> take_derived();

 private:
  friend class ViewBuffer;
  std::shared_ptr<ProcessMesh> mesh_;
  std::vector<int> processes_;
  std::map<int, int> rank_of_;
  std::uint32_t ns_;
  std::optional<std::uint32_t> derived_;  // guarded by m_
  mutable std::mutex m_;
  std::set<class ViewBuffer*> buffers_;
  std::string why_;
  std::atomic<bool> aborted_{false};
};

/// A Gloo context whose transport is a view (what a GlooCommunicator over kept connections
/// holds).
class MeshViewContext final : public ::gloo::Context {
 public:
  MeshViewContext(std::shared_ptr<ProcessMesh> mesh, std::vector<int> processes, int rank,
                  std::uint32_t ns);
  [[nodiscard]] ViewTransport& view() const;
};

/// The namespaces of new views, one per key (each under its group's prefix): this process
/// picks and publishes those it leads (`leads[i]`: it is the view's first member), and reads
/// the others' with one store wait, by `deadline`. TimeoutError names a missing key.
std::vector<std::uint32_t> agree_namespaces(ProcessMesh& mesh, const std::vector<std::string>& keys,
                                            const std::vector<bool>& leads,
                                            std::chrono::steady_clock::time_point deadline,
                                            const std::string& op, const std::string& group);

/// The view of `ctx` when it is one; nullptr for a context with pairs of its own.
ViewTransport* view_of(const ::gloo::Context& ctx);

}  // namespace commgrid::gloo_backend
