#include "launch/job_end.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "commgrid/error.hpp"
#include "launch/posix.hpp"

namespace commgrid::cli {
namespace {

using std::chrono::milliseconds;

// The store's timeout when --timeout is not given (StoreOptions' default).
constexpr milliseconds kDefaultTimeout{30000};

// "12 s", "1.5 s".
std::string seconds(milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

JobEnd::JobEnd(JobStore& store, const LaunchSettings& s)
    : store_(store), node_(s.job.node_rank), nnodes_(s.job.nnodes),
      period_(std::clamp(s.timeout.value_or(kDefaultTimeout) / 4, milliseconds(250),
                         milliseconds(5000))),
      lost_after_(std::max(8 * period_, s.timeout.value_or(kDefaultTimeout))),
      nodes_(static_cast<std::size_t>(s.job.nnodes)) {
  if (node_ != 0) beats_ = std::thread([this] { beat_loop(); });
}

JobEnd::~JobEnd() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (beats_.joinable()) beats_.join();
}

// Beats 1, 2, 3, ... every period until destroyed or the store fails (then node 0 is gone,
// or will call this node lost: either way nothing is left to tell).
void JobEnd::beat_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (std::int64_t n = 1; !stop_; ++n) {
    lock.unlock();
    try {
      store_.post_beat(node_, n);
    } catch (const Error&) { return; }
    lock.lock();
    wake_.wait_for(lock, period_, [this] { return stop_; });
  }
}

void JobEnd::local_idle() {
  try {
    store_.post_idle(node_);
  } catch (const Error&) {
    // The store is gone: check() says so.
  }
}

std::optional<JobEnd::Verdict> JobEnd::check() {
  try {
    return node_ == 0 ? check_as_node0() : check_as_other();
  } catch (const Error& e) {
    Verdict v;
    v.done = done_seen_;
    v.problem = std::string("the job's store failed: ") + e.what();
    return v;
  }
}

std::optional<JobEnd::Verdict> JobEnd::check_as_other() {
  done_seen_ = done_seen_ || store_.done();
  if (!done_seen_ && !store_.over()) return std::nullopt;
  store_.post_exit(node_);
  return Verdict{done_seen_, ""};
}

std::optional<JobEnd::Verdict> JobEnd::check_as_node0() {
  const Clock::time_point now = Clock::now();
  if (!watching_) {
    // Every other node has lost_after from now to show its next beat.
    watching_ = true;
    for (Node& n : nodes_) n.heard = now;
  }
  if (!acks_until_) {
    bool all = true;
    for (int k = 1; k < nnodes_; ++k) {
      Node& n = nodes_[static_cast<std::size_t>(k)];
      if (n.idle || n.lost) continue;
      n.idle = store_.idle(k);
      if (n.idle) continue;
      const std::int64_t beat = store_.latest_beat(k, n.beat);
      if (beat > n.beat) {
        n.beat = beat;
        n.heard = now;
      } else if (now - n.heard > lost_after_) {
        n.lost = true;
        lost_text_ += (lost_text_.empty() ? "" : ", ") + std::to_string(k);
        write_all(STDERR_FILENO, "launch: note: node " + std::to_string(k) +
                                     "'s launcher sent no beat for " + seconds(lost_after_) +
                                     ": its host or launcher is gone\n");
        continue;
      }
      all = false;
    }
    if (!all) return std::nullopt;
    // Every node is idle or gone: the job is over. The idle ones leave once they read it.
    store_.post_over();
    acks_until_ = now + lost_after_;
  }
  bool acked = true;
  for (int k = 1; k < nnodes_; ++k) {
    Node& n = nodes_[static_cast<std::size_t>(k)];
    if (n.idle && !n.exited) n.exited = store_.exited(k);
    acked = acked && (!n.idle || n.exited);
  }
  if (!acked && now < *acks_until_) return std::nullopt;
  Verdict v;
  v.done = store_.done();
  if (!lost_text_.empty())
    v.problem = std::string("the launcher of node") +
                (lost_text_.find(',') != std::string::npos ? "s " : " ") + lost_text_ +
                " stopped beating (host or launcher lost)";
  return v;
}

}  // namespace commgrid::cli
