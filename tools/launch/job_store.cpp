#include "launch/job_store.hpp"

#include <span>

#include "commgrid/resilience_keys.hpp"

namespace commgrid::cli {

JobStore::JobStore(const std::string& uri, const LaunchSettings& s)
    : uri_(uri), prefix_(kResiliencePrefix) {
  StoreOptions so;
  so.job_id = s.job.job_id;
  so.token = s.job.token;
  so.serve = s.job.node_rank == 0 && s.job.store_uri.empty();
  if (s.timeout) so.timeout = *s.timeout;
  store_ = open_store(uri, so);
}

bool JobStore::done() {
  try {
    return store_->has(job_done_key(prefix_));
  } catch (const Error&) { return false; }
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

}  // namespace commgrid::cli
