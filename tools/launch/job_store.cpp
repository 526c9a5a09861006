#include "launch/job_store.hpp"

#include <span>

#include "commgrid/resilience_keys.hpp"

namespace commgrid::cli {
namespace {

// Launch's own keys (never a program's): one place spells them.
std::string node_key(int node, const std::string& what) {
  return "launch/node/" + std::to_string(node) + "/" + what;
}
const std::string kOverKey = "launch/over";

}  // namespace

JobStore::JobStore(const std::string& uri, const LaunchSettings& s)
    : uri_(uri), prefix_(kResiliencePrefix) {
  StoreOptions so;
  so.job_id = s.job.job_id;
  so.token = s.job.token;
  so.serve = s.job.node_rank == 0 && s.job.store_uri.empty();
  if (s.timeout) so.timeout = *s.timeout;
  store_ = open_store(uri, so);
}

bool JobStore::done() { return store_->has(job_done_key(prefix_)); }

std::vector<DecisionRecord> JobStore::decisions_after(std::int64_t epoch) {
  return read_decisions(*store_, prefix_, epoch);
}

std::optional<std::string> JobStore::ended() {
  try {
    return job_end_reason(*store_, prefix_);
  } catch (const Error&) { return std::nullopt; }
}

JobStore::Posted JobStore::post_death(std::int64_t process, int incarnation,
                                      const std::string& why) {
  const std::span<const char> v(why.data(), why.size());
  // The current epoch: the last one decided.
  while (store_->has(epoch_decision_key(prefix_, epoch_ + 1))) ++epoch_;
  Posted p;
  p.epoch = epoch_;
  p.first = store_->set_if_absent(dead_process_key(prefix_, process, incarnation), v);
  if (p.first) (void)store_->set_if_absent(epoch_failed_key(prefix_, epoch_), v);
  return p;
}

void JobStore::set_once(const std::string& key, const std::string& value) {
  (void)store_->set_if_absent(key, std::span<const char>(value.data(), value.size()));
}

void JobStore::post_idle(int node) { set_once(node_key(node, "idle"), "1"); }
bool JobStore::idle(int node) { return store_->has(node_key(node, "idle")); }
void JobStore::post_over() { set_once(kOverKey, "1"); }
bool JobStore::over() { return store_->has(kOverKey); }
void JobStore::post_exit(int node) { set_once(node_key(node, "exit"), "1"); }
bool JobStore::exited(int node) { return store_->has(node_key(node, "exit")); }

void JobStore::post_beat(int node, std::int64_t n) {
  set_once(node_key(node, "beat/" + std::to_string(n)), "1");
}

std::int64_t JobStore::latest_beat(int node, std::int64_t from) {
  while (store_->has(node_key(node, "beat/" + std::to_string(from + 1)))) ++from;
  return from;
}

}  // namespace commgrid::cli
