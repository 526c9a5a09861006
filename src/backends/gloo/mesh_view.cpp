#include "mesh_view.hpp"

#include <gloo/common/error.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>
#include <span>
#include <utility>

#include "commgrid/store.hpp"
#include "gloo_errors.hpp"
#include "pair_gate.hpp"
#include "pair_proofs.hpp"
#include "store_adapter.hpp"
#include "time_text.hpp"

namespace commgrid::gloo_backend {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

// Waits on the mesh's buffers never time out in Gloo: a Gloo timeout closes every pair of
// the context, that is every kept connection. What bounds them is the operation's deadline
// (with_deadline, GlooP2PWork), which aborts the view.
constexpr auto kForever = std::chrono::duration_cast<Ms>(std::chrono::hours(24 * 365));

// Slot prefixes of the mesh's own messages (a view's carry commgrid's and Gloo's own
// prefixes, and its namespace): an epoch's end notices, 0x7e with the epoch.
constexpr std::uint64_t kNoticeSlot = std::uint64_t{0x7e} << 56;
// Where a view's namespace goes in a slot: bits 8-23 (its lower 16 bits) and 48-55 (its
// upper 8), which every slot commgrid or Gloo's collectives build leaves zero (Gloo: prefix
// in 56-63, tag << 24, a step in 0-7; gloo_communicator.hpp).
constexpr std::uint64_t kNamespaceBits = (std::uint64_t{0xff} << 48) | (std::uint64_t{0xffff} << 8);
// The first derived namespace (ProcessMesh::derived_base); the store's are below it.
constexpr std::uint64_t kDerived = std::uint64_t{1} << 23;

std::uint64_t notice_slot(std::int64_t epoch) {
  return kNoticeSlot | ((static_cast<std::uint64_t>(epoch) & 0xffffffu) << 32);
}

// A Gloo context over the mesh's transport (pair proofs and buffers use it).
class KeptMeshContext final : public ::gloo::Context {
 public:
  KeptMeshContext(int rank, int size, std::shared_ptr<::gloo::transport::Device> device, Ms timeout)
      : ::gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = device_->createContext(rank, size);
    setTimeout(timeout);
    transportContext_->setTimeout(timeout);
  }
  ::gloo::transport::Context& transport() { return *transportContext_; }
};

KeptMeshContext& mesh_of(::gloo::Context& ctx) { return static_cast<KeptMeshContext&>(ctx); }

[[noreturn]] void throw_aborted(const ViewTransport& view) {
  throw ::gloo::IoException("aborted: " + view.why());
}

}  // namespace

// ---- the mesh ----------------------------------------------------------------------------

ProcessMesh::ProcessMesh(std::shared_ptr<Shared> shared, int process, int processes, Ms timeout)
    : shared_(std::move(shared)), process_(process), processes_(processes), timeout_(timeout),
      ctx_(std::make_shared<KeptMeshContext>(process, processes, shared_->device, timeout)) {
  for (int p = 0; p < processes_; ++p)
    if (p != process_) others_.push_back(p);
  watcher_ = std::thread([this] { watch_notices(); });
}

ProcessMesh::~ProcessMesh() {
  {
    const std::lock_guard lock(m_);
    stopping_ = true;
    for (auto& b : watch_) b->abortWaitRecv();
  }
  watch_cv_.notify_all();
  watcher_.join();
}

std::unique_ptr<::gloo::transport::Pair>& ProcessMesh::pair(int process) {
  return ctx_->getPair(process);
}

std::unique_ptr<::gloo::transport::UnboundBuffer> ProcessMesh::buffer(void* ptr, std::size_t size) {
  return ctx_->createUnboundBuffer(ptr, size);
}

void ProcessMesh::connect(const std::string& prefix, const std::vector<int>& peers,
                          std::uint32_t generation, Clock::time_point deadline) {
  if (peers.empty()) return;
  const std::string op = "connect", group = "kept connections";
  std::vector<int> everyone(static_cast<std::size_t>(processes_));
  std::iota(everyone.begin(), everyone.end(), 0);
  RendezvousStore store(*shared_->store, prefix, op, group, everyone, timeout_, deadline);
  auto& transport = mesh_of(*ctx_).transport();
  try {
    guard(op, group,
          [&] { shared_->store->set(arrival_key(prefix, process_), std::vector<char>{'1'}); });
    PairGateScope gate(shared_->token, prefix, process_, peers, deadline);
    {
      const std::lock_guard lock(m_);  // the watcher posts on these pairs
      guard(op, group, [&] {
        for (int p : peers) transport.createPair(p);  // the old pair closes
        for (int p : peers)
          store.set(pair_key(process_, p), transport.getPair(p)->address().bytes());
      });
    }
    gate.leave();
    {
      const PairGateScope::Entered entered(gate);
      std::vector<std::string> theirs;
      theirs.reserve(peers.size());
      for (int p : peers) theirs.push_back(pair_key(p, process_));
      guard(op, group, [&] {
        store.wait(theirs);
        for (int p : peers) transport.getPair(p)->connect(store.take(pair_key(p, process_)));
      });
    }
    PeerProofs proofs(*ctx_, shared_->token, prefix, op, group, peers, generation);
    proofs.wait(deadline);
  } catch (...) {
    // Whatever state these pairs are in, they are made anew next time.
    const std::lock_guard lock(m_);
    for (int p : peers) broken_.insert(p);
    throw;
  }
  const std::lock_guard lock(m_);
  for (int p : peers) {
    broken_.erase(p);
    unfinished_.erase(p);
  }
  // The old pairs are gone, and with them every promise of bytes into a buried buffer.
  std::erase_if(buried_, [&](const Buried& b) {
    return std::binary_search(peers.begin(), peers.end(), b.process);
  });
}

std::uint32_t ProcessMesh::next_namespace() {
  const std::lock_guard lock(m_);
  const std::uint64_t ns =
      1 + static_cast<std::uint64_t>(process_) + static_cast<std::uint64_t>(processes_) * next_ns_;
  if (ns >= kDerived)
    throw BackendError("gloo kept connections: process " + std::to_string(process_) + " has made " +
                       std::to_string(next_ns_) +
                       " groups; their namespaces (23 bits) are used up");
  ++next_ns_;
  return static_cast<std::uint32_t>(ns);
}

std::uint32_t ProcessMesh::derived_span() const noexcept {
  // Room for every group of a layout: at most one group a process for each of a few dozen
  // kinds and levels (a layout with more takes the store's namespaces).
  return 64 * static_cast<std::uint32_t>(processes_);
}

std::optional<std::uint32_t> ProcessMesh::derived_base(std::int64_t epoch) const {
  const std::uint64_t span = derived_span();
  if (epoch < 0 || span > kDerived) return std::nullopt;
  const std::uint64_t base = kDerived + static_cast<std::uint64_t>(epoch) * span;
  if (base + span > 0x1000000u) return std::nullopt;
  return static_cast<std::uint32_t>(base);
}

void ProcessMesh::begin_epoch(std::int64_t epoch) {
  const std::lock_guard lock(m_);
  epoch_ = epoch;
  if (!watch_.empty()) watch_.back()->abortWaitRecv();  // the watcher moves to the new one
  post_watch();
}

void ProcessMesh::post_watch() {
  // A buffer per wait, kept while the mesh lives: a notice may still be on its way into an
  // earlier one (Gloo must find a buffer where it was promised one).
  notice_in_.push_back(std::make_unique<std::int64_t>(-1));
  auto b = ctx_->createUnboundBuffer(notice_in_.back().get(), sizeof(std::int64_t));
  try {
    b->recv(others_, notice_slot(epoch_));
  } catch (const std::exception&) {
    // A broken pair had sent its notice already: this epoch has ended.
    peer_ended_ = epoch_;
  }
  watch_.push_back(std::move(b));
  watch_cv_.notify_all();
}

void ProcessMesh::watch_notices() {
  std::unique_lock lock(m_);
  for (;;) {
    watch_cv_.wait(lock, [&] { return stopping_ || !watch_.empty(); });
    if (stopping_) return;
    ::gloo::transport::UnboundBuffer* b = watch_.back().get();
    const std::int64_t epoch = epoch_;
    lock.unlock();
    int from = -1;
    bool got = false, failed = false;
    try {
      got = b->waitRecv(&from, kForever);
    } catch (const std::exception&) {
      failed = true;  // the pair the notice came on failed before its bytes arrived
    }
    lock.lock();
    if (stopping_) return;
    if (got && epoch == epoch_) {
      peer_ended_ = std::max(peer_ended_, epoch);
      noticed_ = epoch;
      for (ViewTransport* v : views_)
        v->abort("process " + std::to_string(from) + " ended epoch " + std::to_string(epoch));
    }
    if (failed && epoch == epoch_ && b == watch_.back().get()) {
      post_watch();  // the other peers' notices of this epoch
      continue;
    }
    // One notice per epoch is all it takes: the next wait is on the next epoch's buffer.
    watch_cv_.wait(lock, [&] { return stopping_ || b != watch_.back().get(); });
  }
}

std::vector<int> ProcessMesh::end_epoch() {
  const std::lock_guard lock(m_);
  if (ended_ != epoch_) {
    ended_ = epoch_;
    for (ViewTransport* v : views_)
      v->abort("process " + std::to_string(process_) + " ended epoch " + std::to_string(epoch_));
    // A notice to every peer with a connected pair: one blocked on this process learns of
    // the end whatever pair it waits on. Not when a peer's notice of this epoch came first:
    // that peer sent one to every process already (end_epoch in mesh_view.hpp). The buffers
    // stay while the mesh lives (a peer may ask for the bytes of an old notice late: Gloo
    // must find them).
    if (noticed_ != epoch_) {
      notice_out_.push_back(std::make_unique<std::int64_t>(epoch_));
      for (int p = 0; p < processes_; ++p) {
        if (p == process_ || !ctx_->getPair(p) || broken_.count(p) != 0) continue;
        try {
          auto b = ctx_->createUnboundBuffer(notice_out_.back().get(), sizeof(std::int64_t));
          b->send(p, notice_slot(epoch_));
          notice_sends_.push_back(std::move(b));
        } catch (const std::exception&) {
          broken_.insert(p);  // closed: its peer died, or closed it
        }
      }
    }
    // The pairs that held an unfinished operation are made anew before the next epoch.
    // (Not closed now: the notice just sent on one must arrive, and it ends the peer's
    // operations all the same; making the pair anew closes the old one.)
    broken_.insert(unfinished_.begin(), unfinished_.end());
    unfinished_.clear();
  }
  return {broken_.begin(), broken_.end()};
}

std::int64_t ProcessMesh::notices_sent() {
  const std::lock_guard lock(m_);
  return static_cast<std::int64_t>(notice_sends_.size());
}

void ProcessMesh::add_view(ViewTransport* view) {
  const std::lock_guard lock(m_);
  views_.insert(view);
  if (peer_ended_ >= epoch_ || ended_ == epoch_)
    view->abort("epoch " + std::to_string(epoch_) + " ended before this group was made");
}

void ProcessMesh::remove_view(ViewTransport* view) {
  const std::lock_guard lock(m_);
  views_.erase(view);
}

void ProcessMesh::bury(int process, std::unique_ptr<::gloo::transport::UnboundBuffer> buffer,
                       std::unique_ptr<std::vector<char>> bytes) {
  const std::lock_guard lock(m_);
  unfinished_.insert(process);
  buried_.push_back({process, std::move(buffer), std::move(bytes)});
}

std::vector<std::uint32_t> agree_namespaces(ProcessMesh& mesh, const std::vector<std::string>& keys,
                                            const std::vector<bool>& leads,
                                            Clock::time_point deadline, const std::string& op,
                                            const std::string& group) {
  Store& store = *mesh.shared()->store;
  std::vector<std::uint32_t> ns(keys.size(), 0);
  std::vector<std::string> theirs;
  std::vector<std::size_t> waiting;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (leads[i]) {
      ns[i] = mesh.next_namespace();
      const std::string v = std::to_string(ns[i]);
      guard(op, group, [&] { store.set(keys[i], std::span<const char>(v.data(), v.size())); });
    } else {
      theirs.push_back(keys[i]);
      waiting.push_back(i);
    }
  }
  if (theirs.empty()) return ns;
  const auto left = std::max(Ms(1), std::chrono::duration_cast<Ms>(deadline - Clock::now()));
  const std::vector<std::string> missing = store.wait_for(theirs, left);
  if (!missing.empty())
    throw TimeoutError("gloo " + op + " on " + group + ": timed out after " +
                       seconds_text(mesh.timeout()) + " waiting for the first member of " +
                       std::to_string(missing.size()) + " group(s) to name it (key " +
                       missing.front() + ")");
  for (std::size_t k = 0; k < theirs.size(); ++k) {
    const std::vector<char> v = store.get(theirs[k]);
    ns[waiting[k]] = static_cast<std::uint32_t>(std::stoul(std::string(v.begin(), v.end())));
  }
  return ns;
}

// ---- a view ------------------------------------------------------------------------------

// A view's buffer. Each operation posted gets a Gloo buffer of the mesh over bytes of its
// own (a send's copied from the caller's memory when posted, a receive's copied into it
// when waited for): an operation that never completes (its view aborted, its caller gone)
// leaves its Gloo buffer and bytes to the mesh (ProcessMesh::bury), so that bytes arriving
// late land there, never in freed memory, and the pair never stalls on a buffer Gloo can
// no longer find. Waits take the operations in the order they were posted.
class ViewBuffer final : public ::gloo::transport::UnboundBuffer {
 public:
  ViewBuffer(std::shared_ptr<ViewTransport> view, void* ptr, size_t size)
      : UnboundBuffer(ptr, size), owner_(std::move(view)), view_(*owner_) {}
  ~ViewBuffer() override {
    {
      const std::lock_guard lock(view_.m_);
      view_.buffers_.erase(this);
    }
    for (auto* ops : {&recvs_, &sends_})
      for (Op& op : *ops) view_.mesh().bury(op.process, std::move(op.inner), std::move(op.bytes));
  }
  ViewBuffer(const ViewBuffer&) = delete;
  ViewBuffer& operator=(const ViewBuffer&) = delete;

  bool waitRecv(int* rank, Ms timeout) override { return wait(recvs_, true, rank, timeout); }
  bool waitSend(int* rank, Ms timeout) override { return wait(sends_, false, rank, timeout); }
  void abortWaitRecv() override { abort_all(recvs_, true); }
  void abortWaitSend() override { abort_all(sends_, false); }

  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override {
    Op& op = post(sends_, dst, offset, nbytes);
    if (op.nbytes > 0)  // (a barrier's messages are empty, from no memory at all)
      std::memcpy(op.bytes->data(), static_cast<char*>(ptr) + op.offset, op.nbytes);
    op.inner->send(op.process, view_.slot(slot), 0, op.nbytes);
  }
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override {
    Op& op = post(recvs_, src, offset, nbytes);
    op.inner->recv(op.process, view_.slot(slot), 0, op.nbytes);
  }
  void recv(std::vector<int> /*srcs*/, uint64_t /*slot*/, size_t /*offset*/,
            size_t /*nbytes*/) override {
    throw ::gloo::EnforceNotMet(__FILE__, __LINE__, "recv from any",
                                "a receive from any rank is not offered on kept connections");
  }

 private:
  struct Op {
    int process = -1;
    size_t offset = 0, nbytes = 0;
    std::unique_ptr<std::vector<char>> bytes;
    std::unique_ptr<::gloo::transport::UnboundBuffer> inner;
  };

  Op& post(std::deque<Op>& ops, int rank, size_t offset, size_t nbytes) {
    if (view_.aborted()) throw_aborted(view_);
    if (nbytes == kUnspecifiedByteCount) nbytes = offset <= size ? size - offset : 0;
    if (offset > size || nbytes > size - offset)
      throw ::gloo::EnforceNotMet(__FILE__, __LINE__, "offset + nbytes <= size",
                                  "an operation beyond the buffer");
    Op op;
    op.process = view_.process_of(rank);
    op.offset = offset;
    op.nbytes = nbytes;
    op.bytes = std::make_unique<std::vector<char>>(std::max<size_t>(nbytes, 1));
    op.inner = view_.mesh().buffer(op.bytes->data(), op.bytes->size());
    const std::lock_guard lock(m_);  // abort_all reads the lists from another thread
    if (view_.aborted()) {
      op.inner->abortWaitRecv();
      op.inner->abortWaitSend();
    }
    ops.push_back(std::move(op));
    return ops.back();
  }

  void abort_all(std::deque<Op>& ops, bool recv) {
    const std::lock_guard lock(m_);
    for (Op& op : ops) {
      if (recv) op.inner->abortWaitRecv();
      else op.inner->abortWaitSend();
    }
  }

  bool wait(std::deque<Op>& ops, bool recv, int* rank, Ms timeout) {
    // A zero timeout asks whether an operation has completed; Gloo cannot say without
    // waiting (and its timeout would close the mesh): not yet, until waited for.
    if (timeout == Ms(0)) return false;
    if (view_.aborted()) throw_aborted(view_);
    if (ops.empty())
      throw ::gloo::EnforceNotMet(__FILE__, __LINE__, "posted", "a wait with nothing posted");
    // Read without the lock: a deque moves no element on push_back or pop_front, and only
    // this thread pops.
    Op& op = ops.front();
    const bool ok =
        recv ? op.inner->waitRecv(nullptr, kForever) : op.inner->waitSend(nullptr, kForever);
    if (!ok) throw_aborted(view_);  // only the view's abort ends a wait
    if (recv && op.nbytes > 0)
      std::memcpy(static_cast<char*>(ptr) + op.offset, op.bytes->data(), op.nbytes);
    if (rank != nullptr) *rank = view_.rank_of(op.process);
    const std::lock_guard lock(m_);
    ops.pop_front();
    return true;
  }

  std::shared_ptr<ViewTransport> owner_;  // a Work may hold a buffer beyond its group
  ViewTransport& view_;
  std::mutex m_;                  // guards the lists' shape (abort_all runs on other threads)
  std::deque<Op> recvs_, sends_;  // posted, not yet waited for, in posting order
};

ViewTransport::ViewTransport(std::shared_ptr<ProcessMesh> mesh, std::vector<int> processes,
                             int rank, std::uint32_t ns)
    : ::gloo::transport::Context(rank, static_cast<int>(processes.size())), mesh_(std::move(mesh)),
      processes_(std::move(processes)), ns_(ns) {
  for (std::size_t i = 0; i < processes_.size(); ++i) rank_of_[processes_[i]] = static_cast<int>(i);
  setTimeout(mesh_->timeout());
  mesh_->add_view(this);
}

ViewTransport::~ViewTransport() { mesh_->remove_view(this); }

std::unique_ptr<::gloo::transport::Pair>& ViewTransport::getPair(int rank) {
  return mesh_->pair(process_of(rank));
}

std::unique_ptr<::gloo::transport::Pair>& ViewTransport::createPair(int /*rank*/) {
  throw ::gloo::EnforceNotMet(__FILE__, __LINE__, "createPair",
                              "a view over kept connections makes no pairs");
}

std::unique_ptr<::gloo::transport::UnboundBuffer> ViewTransport::createUnboundBuffer(void* ptr,
                                                                                     size_t size) {
  auto b = std::make_unique<ViewBuffer>(shared_from_this(), ptr, size);
  const std::lock_guard lock(m_);
  buffers_.insert(b.get());  // (an operation posted on an aborted view fails: ViewBuffer::post)
  return b;
}

void ViewTransport::abort(const std::string& why) {
  const std::lock_guard lock(m_);
  if (!aborted_.load()) why_ = why;
  aborted_.store(true);
  for (ViewBuffer* b : buffers_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

std::string ViewTransport::why() const {
  const std::lock_guard lock(m_);
  return why_;
}

void ViewTransport::set_derived(std::uint32_t base) {
  const std::lock_guard lock(m_);
  derived_ = base;
}

std::optional<std::uint32_t> ViewTransport::take_derived() {
  const std::lock_guard lock(m_);
  return std::exchange(derived_, std::nullopt);
}

int ViewTransport::process_of(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(processes_.size()))
    throw ::gloo::EnforceNotMet(__FILE__, __LINE__, "rank", "rank out of range of the view");
  return processes_[static_cast<std::size_t>(rank)];
}

int ViewTransport::rank_of(int process) const {
  const auto it = rank_of_.find(process);
  return it == rank_of_.end() ? -1 : it->second;
}

std::uint64_t ViewTransport::slot(std::uint64_t slot) const {
  if ((slot & kNamespaceBits) != 0)
    throw ::gloo::EnforceNotMet(__FILE__, __LINE__, "slot",
                                "slot uses bits 8-23 or 48-55, which a view over kept "
                                "connections takes");
  const auto ns = static_cast<std::uint64_t>(ns_);
  return slot | ((ns & 0xffffu) << 8) | ((ns >> 16) << 48);
}

MeshViewContext::MeshViewContext(std::shared_ptr<ProcessMesh> mesh, std::vector<int> processes,
                                 int rank, std::uint32_t ns)
    : ::gloo::Context(rank, static_cast<int>(processes.size())) {
  device_ = mesh->shared()->device;
  setTimeout(mesh->timeout());
  transportContext_ =
      std::make_shared<ViewTransport>(std::move(mesh), std::move(processes), rank, ns);
}

ViewTransport& MeshViewContext::view() const {
  return static_cast<ViewTransport&>(*transportContext_);
}

ViewTransport* view_of(const ::gloo::Context& ctx) {
  const auto* v = dynamic_cast<const MeshViewContext*>(&ctx);
  return v ? &v->view() : nullptr;
}

}  // namespace commgrid::gloo_backend
