#include "launch/spare_keeper.hpp"

#include "commgrid/error.hpp"
#include "launch/posix.hpp"

namespace commgrid::cli {

SpareKeeper::SpareKeeper(const LaunchSettings& settings, std::unique_ptr<JobStore> store)
    : settings_(settings), store_(std::move(store)),
      view_(settings.world_size(), settings.num_processes()) {}

void SpareKeeper::follow() {
  try {
    for (const DecisionRecord& d : store_->decisions_after(view_.epoch()))
      view_.adopt(d.epoch, d.dead, d.revived, d.process_of);
  } catch (const Error&) {
    // The store is gone (the job is ending) or a decision is unreadable: the labels stay.
  }
}

bool SpareKeeper::done() {
  if (done_seen_) return true;
  try {
    done_seen_ = store_->done();
  } catch (const Error&) {
    // The store is gone: the job is not known to be done.
  }
  return done_seen_;
}

SpareKeeper::Verdict SpareKeeper::on_death(std::int64_t process, int incarnation,
                                           const std::string& who, int status, bool stopping) {
  const std::string why = who + " " + describe_end(status);
  const bool was_done = done();
  Verdict v;
  // Once the job cannot go on, its processes end one by one with the reason, which is said
  // once at the end, not per process.
  if (ended()) return v;
  v.note = "launch: note: " + why;
  try {
    const JobStore::Posted p = store_->post_death(process, incarnation, why);
    // A decision that had declared it dead already (a stopped process, fenced when it went
    // on): the epoch that replaced it is not failed by its exit.
    v.note += p.first
                  ? "; posted it to the job's store (epoch " + std::to_string(p.epoch) + ")"
                  : "; it had been declared dead already (epoch " + std::to_string(p.epoch) + ")";
    failed_after_done_ = failed_after_done_ || (was_done && p.first);
    if (p.first) v.failed_epoch = p.epoch;
  } catch (const Error& e) {
    v.note += std::string("; could not post it: ") + e.what();
    failed_after_done_ = failed_after_done_ || was_done;
  }
  if (restarts_ < settings_.job.max_restarts && !stopping && !was_done) {
    ++restarts_;
    v.restart = true;
    v.note += "; restarting it as a spare (restart " + std::to_string(restarts_) + " of " +
              std::to_string(settings_.job.max_restarts) + ")";
  } else {
    v.note += was_done ? "; the job was done" : "; the job goes on without it";
  }
  return v;
}

}  // namespace commgrid::cli
