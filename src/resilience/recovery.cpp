// Recovery: the agreement on each next epoch through the job's store (docs/resilience.md).
#include "commgrid/recovery.hpp"

#include "commgrid/launch_env.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace commgrid {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

std::span<const char> bytes(const std::string& s) { return {s.data(), s.size()}; }
std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

}  // namespace

// Notices when this process did not run for longer than the job's timeout: a thread that
// ticks a few times a second sees the monotonic clock jump (SIGSTOP, a paused machine).
struct Recovery::StallWatch {
  explicit StallWatch(Ms timeout)
      : thread([this, timeout](const std::stop_token& stop) {
          const Ms period = std::clamp(timeout / 8, Ms(10), Ms(250));
          std::mutex m;
          std::condition_variable_any cv;
          auto last = Clock::now();
          std::unique_lock lock(m);
          while (!stop.stop_requested()) {
            cv.wait_for(lock, stop, period, [] { return false; });
            const auto now = Clock::now();
            if (now - last > timeout) {
              gap_ms.store(std::chrono::duration_cast<Ms>(now - last).count());
              ended_ns.store(now.time_since_epoch().count());
            }
            last = now;
          }
        }) {}
  std::atomic<long long> ended_ns{0};  // when the last stall longer than the timeout ended
  std::atomic<long long> gap_ms{0};    // and how long it was
  std::jthread thread;
};

Recovery::~Recovery() = default;

void Recovery::saw_healthy(Clock::time_point observed) {
  long long ended = stall_->ended_ns.load();
  if (ended != 0 && ended <= observed.time_since_epoch().count())
    (void)stall_->ended_ns.compare_exchange_strong(ended, 0);
}

std::string Recovery::identity(std::int64_t process, int incarnation) {
  return process_identity(process, incarnation);
}

Recovery::Recovery(std::shared_ptr<Store> store, RankMap map, std::int64_t process,
                   RecoveryOptions options)
    : store_(std::move(store)), map_(std::move(map)), process_(process),
      options_(std::move(options)), incarnation_(static_cast<std::size_t>(map_.num_processes()), 0),
      stall_(std::make_unique<StallWatch>(options_.timeout)) {
  if (!store_) throw ConfigError("store", "recovery: no store");
  if (process < 0 || process >= map_.num_processes())
    throw RankOutOfRangeError("process", "recovery: process " + std::to_string(process) +
                                             " is outside the job's " +
                                             std::to_string(map_.num_processes()) + " processes");
  if (options_.decision_window <= 0 || options_.decision_window > 4)
    throw InvalidValueError("decision_window", "recovery: decision_window must be in (0, 4], got " +
                                                   std::to_string(options_.decision_window));
  if (options_.incarnation < 0)
    throw InvalidValueError("incarnation", "recovery: incarnation must be >= 0, got " +
                                               std::to_string(options_.incarnation));
  if (const auto& shrink = options_.shrink) {
    // What plan_shrink would refuse at the first failure, refused now.
    const ParallelConfig& c = shrink->config;
    if (c.compat != Compat::seed)
      throw IncompatibleError("shrink",
                              "recovery: shrink needs a compat seed layout (plan_shrink's)");
    c.validate();
    if (c.world_size != map_.world_size())
      throw IncompatibleError(
          "shrink", "recovery: the shrink layout's world_size " + std::to_string(c.world_size) +
                        " is not the map's world of " + std::to_string(map_.world_size()));
    if (const auto batch = shrink->global_batch; batch && (*batch < 1 || *batch % c.dp() != 0))
      throw InvalidValueError("global_batch", "recovery: global_batch " + std::to_string(*batch) +
                                                  " is not a positive multiple of dp " +
                                                  std::to_string(c.dp()));
    config_ = c;
  }
  // Every decision so far, replayed: a restarted process learns the job's current epoch
  // (and the fresh process of epoch 0 finds none).
  while (store_->has(epoch_decision_key(options_.prefix, epoch() + 1)))
    adopt(text(store_->get(epoch_decision_key(options_.prefix, epoch() + 1))));
  // A restarted process first waits for the decision that declares its previous
  // incarnation dead (launch restarts it at once), then asks to come back as a spare at
  // the next decision (adopt registers it).
  if (options_.incarnation > incarnation_[static_cast<std::size_t>(process_)]) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Ms>(
                                             options_.timeout * (1.0 + options_.decision_window));
    while (map_.role(process_) != ProcessRole::dead) {
      const std::string k = epoch_decision_key(options_.prefix, epoch() + 1);
      if (!store_->wait_for(std::vector<std::string>{k}, Ms(1000)).empty()) {
        if (Clock::now() >= deadline)
          throw TimeoutError("recovery: restarted process " + std::to_string(process_) +
                             " saw no decision on its previous incarnation within the timeout");
        continue;
      }
      adopt(text(store_->get(k)));
    }
  }
}

void Recovery::set_note(std::string note) {
  for (const char c : note)
    if (!((c >= '0' && c <= '9') || c == ',' || c == '-'))
      throw InvalidValueError("note",
                              "Recovery::set_note: a note holds digits, ',' and '-' only; "
                              "got \"" +
                                  note + "\"");
  note_ = std::move(note);
}

void Recovery::declare(const ParallelConfig& config, const InitOptions& init) {
  declared_ = ProcessGroups::fingerprint(config, init);
}

void Recovery::keep_connections(KeptConnections kept) {
  if (!kept.end_epoch || !kept.world)
    throw ConfigError("kept", "recovery: kept connections need end_epoch and world");
  kept_ = std::move(kept);
}

std::string Recovery::world_prefix() const { return epoch_world_prefix(options_.prefix, epoch()); }

void Recovery::mark_failed(const std::string& reason) {
  (void)store_->set_if_absent(epoch_failed_key(options_.prefix, epoch()),
                              bytes("process " + std::to_string(process_) + ": " + reason));
}

bool Recovery::failed() {
  const auto asked = Clock::now();
  const bool f = store_->has(epoch_failed_key(options_.prefix, epoch()));
  if (!f) saw_healthy(asked);
  return f;
}

std::string Recovery::failure_reason() {
  const std::string k = epoch_failed_key(options_.prefix, epoch());
  return store_->has(k) ? text(store_->get(k)) : std::string();
}

void Recovery::mark_done() {
  (void)store_->set_if_absent(job_done_key(options_.prefix), bytes("1"));
}

bool Recovery::done() { return store_->has(job_done_key(options_.prefix)); }

bool Recovery::end_job(const std::string& reason) {
  const bool first = store_->set_if_absent(job_ended_key(options_.prefix), bytes(reason));
  // Every process blocked on this epoch (a collective's watcher, a spare, a world being
  // created) wakes on its failure key.
  (void)store_->set_if_absent(epoch_failed_key(options_.prefix, epoch()),
                              bytes("process " + std::to_string(process_) + ": " + reason));
  return first;
}

std::optional<std::string> Recovery::job_ended() {
  return job_end_reason(*store_, options_.prefix);
}

void Recovery::check_ended() {
  if (auto reason = job_ended()) throw RecoveryError(*reason);
}

bool Recovery::wait_for_failure() {
  const std::vector<std::string> keys{epoch_failed_key(options_.prefix, epoch())};
  for (;;) {
    if (done()) return false;
    // Slices of a second: a finished job is seen within one.
    const auto asked = Clock::now();
    if (!store_->wait_for(keys, Ms(1000)).empty()) {
      saw_healthy(asked);
    } else {
      check_ended();
      return true;
    }
  }
}

std::set<std::int64_t> Recovery::deaths_known(const std::vector<std::int64_t>& processes) {
  std::vector<std::string> keys;
  std::vector<std::int64_t> asked;
  for (std::int64_t p : processes) {
    if (p == process_) continue;
    keys.push_back(dead_process_key(options_.prefix, p, incarnation_[static_cast<std::size_t>(p)]));
    asked.push_back(p);
  }
  // A wait of no time answers which keys are missing: every death key in one request.
  const std::vector<std::string> absent = store_->wait_for(keys, Ms(0));
  const std::set<std::string> alive(absent.begin(), absent.end());
  std::set<std::int64_t> dead;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (alive.count(keys[i]) == 0) dead.insert(asked[i]);
  return dead;
}

EpochChange Recovery::change(const RankMap& map, const std::vector<std::int64_t>& dead) const {
  if (dead.empty()) return {map, std::nullopt};
  if (!options_.shrink) return {map.replace(dead), std::nullopt};
  return replace_or_shrink(map, dead, *config_, options_.shrink->global_batch);
}

namespace {
// The process of each logical rank of `map`.
std::vector<std::int64_t> processes_of(const RankMap& map) {
  std::vector<std::int64_t> out;
  for (Rank r = 0; r < map.world_size(); ++r) out.push_back(map.process_of(r));
  return out;
}
}  // namespace

std::string Recovery::decide(const std::vector<std::int64_t>& dead,
                             const std::vector<std::int64_t>& revived,
                             const std::set<std::pair<std::int64_t, std::int64_t>>& renew,
                             std::optional<std::uint64_t> fingerprint,
                             std::map<std::int64_t, std::string> notes) {
  DecisionRecord d;
  d.notes = std::move(notes);
  d.epoch = epoch() + 1;
  d.decider = process_;
  d.dead = dead;
  d.renew.assign(renew.begin(), renew.end());
  RankMap revived_map = map_;
  for (std::int64_t p : revived) {
    const std::string k = epoch_alive_key(options_.prefix, d.epoch, p);
    d.revived.emplace_back(p,
                           static_cast<int>(parse_registration(text(store_->get(k))).incarnation));
    revived_map = revived_map.revive(p);
  }
  // The world size a shrink leads to, which every process checks against its own plan, and
  // the process of each logical rank (what commgrid launch follows).
  try {
    const EpochChange step = change(revived_map, dead);
    if (step.shrink) d.shrink_world = step.shrink->config.world_size;
    d.process_of = processes_of(step.map);
    // Proven alike on every process of the epoch: each registered with it, none comes
    // back from a restart (it did not register with the others), and the layout is the
    // declared one (no shrink, now or before).
    if (fingerprint && revived.empty() && !step.shrink && !shrunk_) d.fingerprint = fingerprint;
  } catch (const RecoveryError&) {
    // No next epoch: every process throws the same error when it adopts the decision.
  } catch (const ConfigError&) {
    // (plan_shrink's: no valid smaller layout.)
  }
  return format_decision(d);
}

void Recovery::adopt(const std::string& decision) {
  const DecisionRecord record = parse_decision(decision);
  if (record.epoch != epoch() + 1)
    throw BackendError("recovery: the decision for epoch " + std::to_string(epoch() + 1) +
                       " says epoch " + std::to_string(record.epoch));
  EpochDecision d;
  d.epoch = record.epoch;
  d.decider = record.decider;
  d.dead = record.dead;
  d.text = decision;
  d.renew = record.renew;
  d.fingerprint = record.fingerprint;
  d.notes = record.notes;
  RankMap next = map_;
  for (auto [p, inc] : record.revived) {
    next = next.revive(p);
    incarnation_[static_cast<std::size_t>(p)] = inc;
    d.revived.push_back(p);
  }
  history_.push_back(d);
  // A decision that leaves a rank without a spare (and, with shrink, without a smaller
  // layout) ends the job on every process alike: each throws the same error, and the first
  // posts it as the job's end.
  EpochChange step{map_, std::nullopt};
  try {
    step = change(next, d.dead);
  } catch (const NoSpareError& e) {
    const std::string message = std::string("recovery: cannot go on without a spare: ") + e.what();
    (void)end_job(message);
    throw NoSpareError(message, e.ranks());
  } catch (const ConfigError& e) {
    std::vector<Rank> ranks;
    for (std::int64_t p : d.dead)
      if (const auto r = next.logical_rank(p)) ranks.push_back(*r);
    std::sort(ranks.begin(), ranks.end());
    const std::string message = std::string("recovery: cannot go on without a spare: ") + e.what();
    (void)end_job(message);
    throw NoSpareError(message, std::move(ranks));
  }
  const auto world = [](std::optional<std::int64_t> w) {
    return w ? "shrinks the world to " + std::to_string(*w) : std::string("keeps the world");
  };
  const std::optional<std::int64_t> mine =
      step.shrink ? std::optional<std::int64_t>(step.shrink->config.world_size) : std::nullopt;
  if (mine != record.shrink_world)
    throw BackendError("recovery: the decision for epoch " + std::to_string(d.epoch) + " " +
                       world(record.shrink_world) + ", this process's plan " + world(mine) +
                       " (RecoveryOptions::shrink differs between processes)");
  const std::vector<std::int64_t> ranks = processes_of(step.map);
  if (!record.process_of.empty() && record.process_of != ranks)
    throw BackendError("recovery: the decision for epoch " + std::to_string(d.epoch) +
                       " gives the logical ranks to processes " + join_numbers(record.process_of) +
                       ", this process's map to " + join_numbers(ranks));
  if (step.shrink) {
    config_ = step.shrink->config;
    shrunk_ = true;
  }
  history_.back().shrink = std::move(step.shrink);
  history_.back().process_of = ranks;
  map_ = step.map.at_epoch(d.epoch);
  if (map_.role(process_) == ProcessRole::dead &&
      incarnation_[static_cast<std::size_t>(process_)] == options_.incarnation)
    throw FencedError("process " + std::to_string(process_) + " was declared dead in epoch " +
                      std::to_string(d.epoch) + " and is fenced: it may not rejoin; exiting");
  // A restarted process not taken back yet asks again at the next decision.
  if (map_.role(process_) == ProcessRole::dead) {
    RegistrationRecord again;
    again.incarnation = options_.incarnation;
    (void)store_->set_if_absent(epoch_alive_key(options_.prefix, d.epoch + 1, process_),
                                bytes(format_registration(again)));
  }
}

Recovery::Registered Recovery::registered(const std::vector<std::int64_t>& waiting,
                                          const std::vector<std::string>& keys,
                                          const std::set<std::string>& missing,
                                          const std::vector<std::int64_t>& own_renew,
                                          std::vector<std::int64_t>& dead, std::size_t round) {
  Registered out;
  auto asks = [&](std::int64_t p, const std::vector<std::int64_t>& peers) {
    for (std::int64_t q : peers)
      if (q != p) out.renew.emplace(std::min(p, q), std::max(p, q));
  };
  // The candidates' common fingerprint: this process's own to begin with (a candidate
  // without one, or with another, clears it for good).
  bool same = declared_.has_value();
  out.fingerprint = declared_;
  auto declared = [&](const std::optional<std::uint64_t>& f) {
    if (!f || f != out.fingerprint) same = false;
  };
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    if (out.candidates.size() > round && out.candidates[round] != process_) {
      out.complete = false;  // another process decides this round
      return out;
    }
    // A registration by another incarnation (a restart of a process that died) is not
    // this incarnation's: the one the map knows is dead.
    bool here = missing.count(keys[i]) == 0;
    if (here && waiting[i] != process_) {
      const RegistrationRecord r = parse_registration(text(store_->get(keys[i])));
      here = r.incarnation == incarnation_[static_cast<std::size_t>(waiting[i])];
      if (here) {
        asks(waiting[i], r.renew);
        declared(r.fingerprint);
        if (!r.note.empty()) out.notes[waiting[i]] = r.note;
      }
    }
    (here ? out.candidates : dead).push_back(waiting[i]);
  }
  // A restarted process (dead in the map, registered to come back) is a candidate too,
  // after every process of the epoch: when none of those is left, it decides (and finds
  // what the job can still do). So the list is never empty.
  if (map_.role(process_) == ProcessRole::dead) out.candidates.push_back(process_);
  if (std::find(out.candidates.begin(), out.candidates.end(), process_) != out.candidates.end())
    asks(process_, own_renew);
  if (!same) out.fingerprint.reset();
  if (!note_.empty()) out.notes[process_] = note_;
  return out;
}

bool Recovery::decided_below(std::int64_t next, std::size_t round,
                             const std::vector<std::int64_t>& expected, Clock::time_point until) {
  // A restarted process is a candidate after every process of the epoch, whatever its
  // number: the full reading decides for it.
  if (map_.role(process_) == ProcessRole::dead) return false;
  const std::string decision_key = epoch_decision_key(options_.prefix, next);
  const std::string ended_key = job_ended_key(options_.prefix);
  std::size_t below = 0;
  Ms slice(5);
  for (std::int64_t q : expected) {
    if (q >= process_) return false;
    const int incarnation = incarnation_[static_cast<std::size_t>(q)];
    const std::string key = epoch_alive_key(options_.prefix, next, q);
    const std::string death = dead_process_key(options_.prefix, q, incarnation);
    for (;;) {
      if (store_->has(death)) break;
      if (store_->has(key)) {
        if (parse_registration(text(store_->get(key))).incarnation == incarnation &&
            ++below > round)
          return true;
        break;
      }
      const auto left = std::chrono::duration_cast<Ms>(until - Clock::now());
      if (left <= Ms(0) || store_->has(decision_key) || store_->has(ended_key)) return false;
      (void)store_->wait_for(std::span<const std::string>(&key, 1), std::min(left, slice));
      slice = std::min(slice * 2, Ms(200));
    }
  }
  return false;
}

const EpochDecision& Recovery::agree() {
  const std::int64_t next = epoch() + 1;
  const std::string decision_key = epoch_decision_key(options_.prefix, next);
  const std::string ended_key = job_ended_key(options_.prefix);
  check_ended();
  if (stall_->ended_ns.load() != 0) {
    // This process did not run for longer than a timeout, and the job went on without it
    // (its epoch failed): by the failure model it is dead. It says so itself, at once, so
    // that nobody waits for it, and may not rejoin.
    char text[96];
    std::snprintf(text, sizeof text, "%.1f s, longer than the job's timeout of %.1f s",
                  static_cast<double>(stall_->gap_ms.load()) / 1000.0,
                  static_cast<double>(options_.timeout.count()) / 1000.0);
    const std::string why = "process " + std::to_string(process_) + " did not run for " + text +
                            ", and the job went on without it (epoch " + std::to_string(epoch()) +
                            " failed): it is fenced: it may not rejoin; exiting";
    (void)store_->set_if_absent(dead_process_key(options_.prefix, process_, options_.incarnation),
                                bytes(why));
    mark_failed(why);
    (void)store_->fence(identity(process_, options_.incarnation), why);
    throw FencedError(why);
  }
  mark_failed("joined the agreement on epoch " + std::to_string(next));
  RegistrationRecord registration;
  registration.incarnation = options_.incarnation;
  registration.fingerprint = declared_;
  registration.note = note_;
  // With kept connections this epoch ends here first (its blocked peers fail now); the
  // pairs it could not keep travel with the registration.
  if (kept_) registration.renew = kept_->end_epoch();
  const std::vector<std::int64_t>& own_renew = registration.renew;
  (void)store_->set_if_absent(epoch_alive_key(options_.prefix, next, process_),
                              bytes(format_registration(registration)));
  const Ms window(
      std::max<long long>(1, static_cast<long long>(static_cast<double>(options_.timeout.count()) *
                                                    options_.decision_window)));
  std::vector<std::int64_t> expected;
  for (std::int64_t p = 0; p < map_.num_processes(); ++p)
    if (map_.role(p) != ProcessRole::dead) expected.push_back(p);
  for (int round = 0;; ++round) {
    if (store_->has(decision_key)) {
      adopt(text(store_->get(decision_key)));
      return history_.back();
    }
    check_ended();
    // Most processes find within a few reads that a lower-numbered one decides this round;
    // they wait for its decision alone. One window a round, whichever way it is spent.
    const auto window_end = Clock::now() + window;
    if (decided_below(next, static_cast<std::size_t>(round), expected, window_end)) {
      // Decided, or not within the window: the next round (whose candidate is one further;
      // the rounds end, decided_below needing more registrations below each time).
      (void)store_->wait_for(std::vector<std::string>{decision_key}, window);
      continue;
    }
    // Wait for the registrations in short slices, re-reading the deaths launch posts
    // between them: a death is often posted moments after a survivor detected it, so the
    // slices start at 5 ms and double up to 200 ms (a registration ends a slice at once; a
    // death does not, the store's wait being for every key).
    std::vector<std::int64_t> known_dead, waiting;
    std::vector<std::string> keys, missing_keys;
    Ms slice(5);
    for (;;) {
      known_dead.clear();
      waiting.clear();
      keys.clear();
      const std::set<std::int64_t> deaths = deaths_known(expected);
      for (std::int64_t p : expected) (deaths.count(p) != 0 ? known_dead : waiting).push_back(p);
      for (std::int64_t p : waiting) keys.push_back(epoch_alive_key(options_.prefix, next, p));
      const auto left = std::chrono::duration_cast<Ms>(window_end - Clock::now());
      missing_keys = store_->wait_for(keys, std::clamp(left, Ms(0), slice));
      if (missing_keys.empty() || Clock::now() >= window_end || store_->has(decision_key) ||
          store_->has(ended_key))
        break;
      slice = std::min(slice * 2, Ms(200));
    }
    const std::set<std::string> missing_set(missing_keys.begin(), missing_keys.end());
    std::vector<std::int64_t> dead = known_dead;
    const Registered reg =
        registered(waiting, keys, missing_set, own_renew, dead, static_cast<std::size_t>(round));
    const std::vector<std::int64_t>& candidates = reg.candidates;
    // Candidates in registration order's stand-in, the process number: round k's is the
    // k-th registered; the ones before it did not decide within their window: dead.
    const std::size_t idx =
        std::min<std::size_t>(static_cast<std::size_t>(round), candidates.size() - 1);
    if (candidates[idx] == process_ && !store_->has(decision_key)) {
      for (std::size_t i = 0; i < idx; ++i)
        if (map_.role(candidates[i]) != ProcessRole::dead) dead.push_back(candidates[i]);
      std::sort(dead.begin(), dead.end());
      std::vector<std::int64_t> revived;
      for (std::int64_t p = 0; p < map_.num_processes(); ++p) {
        if (map_.role(p) != ProcessRole::dead) continue;
        const std::string k = epoch_alive_key(options_.prefix, next, p);
        if (store_->has(k) && parse_registration(text(store_->get(k))).incarnation >
                                  incarnation_[static_cast<std::size_t>(p)])
          revived.push_back(p);
      }
      if (store_->set_if_absent(
              decision_key, bytes(decide(dead, revived, reg.renew, reg.fingerprint, reg.notes))))
        for (std::int64_t p : dead) {
          const int incarnation = incarnation_[static_cast<std::size_t>(p)];
          // Its death is posted too (unless launch did first): when the declared-dead
          // process exits later (a stopped one continued and fenced), launch finds the death
          // known and does not fail the epoch that already replaced it.
          (void)store_->set_if_absent(dead_process_key(options_.prefix, p, incarnation),
                                      bytes("declared dead in epoch " + std::to_string(next)));
          (void)store_->fence(identity(p, incarnation),
                              "process " + std::to_string(p) + " was declared dead in epoch " +
                                  std::to_string(next) +
                                  " and is fenced: it may not rejoin; exiting");
        }
      continue;  // adopt the winner, whoever it is
    }
    if (store_->wait_for(std::vector<std::string>{decision_key}, window).empty()) continue;
    // Every candidate had its window, and none decided.
    if (static_cast<std::size_t>(round) >= candidates.size())
      throw TimeoutError("recovery: no decision for epoch " + std::to_string(next) +
                         " after every registered process's window of " +
                         std::to_string(window.count()) +
                         " ms (processes registered: " + join_numbers(candidates) + ")");
  }
}

EpochGroups Recovery::build(const WorldFactory& factory, const ParallelConfig& config,
                            const InitOptions& init) {
  EpochGroups out;
  out.epoch = epoch();
  const std::optional<Rank> rank = logical_rank();
  if (!rank) return out;
  try {
    // A process that dies before the world exists (launch posts the epoch failed, or a peer
    // marks it) ends every wait for it at once instead of at the timeout.
    const WaitWatch watch(epoch_failed_key(options_.prefix, epoch()));
    if (kept_) {
      std::vector<std::int64_t> renew;
      if (!history_.empty())
        for (const auto& [a, b] : history_.back().renew) {
          if (a == process_) renew.push_back(b);
          if (b == process_) renew.push_back(a);
        }
      out.world = kept_->world(world_prefix(), epoch(), processes_of(map_), renew);
    } else {
      out.world =
          factory(world_prefix(), static_cast<int>(*rank), static_cast<int>(map_.world_size()));
    }
    out.groups = std::make_shared<ProcessGroups>();
    InitOptions options = init;
    // Every process of this epoch declared the same layout and options: no exchange.
    if (!history_.empty() && history_.back().fingerprint) {
      if (shrunk_ || ProcessGroups::fingerprint(config, init) != *history_.back().fingerprint)
        throw ConfigMismatchError(
            "config", "recovery: process " + std::to_string(process_) + " builds epoch " +
                          std::to_string(epoch()) +
                          " with another layout or options than it declared (Recovery::declare)");
      options.proven_fingerprint = history_.back().fingerprint;
    }
    out.groups->initialize(out.world, shrunk_ ? *config_ : config, options);
  } catch (const FencedError&) { throw; } catch (const BackendError& e) {
    mark_failed(std::string("creating the world of epoch ") + std::to_string(epoch()) +
                " failed: " + e.what());
    throw;
  }
  return out;
}

EpochGroups Recovery::recover(const WorldFactory& factory, const ParallelConfig& config,
                              const InitOptions& init) {
  // Each attempt loses at least one process, so the job's process count bounds them.
  for (std::int64_t attempt = 0;; ++attempt) {
    agree();
    try {
      return build(factory, config, init);
    } catch (const FencedError&) { throw; } catch (const BackendError&) {
      if (attempt + 1 >= map_.num_processes()) throw;
    }
  }
}

std::optional<SpareLaunch> read_spare_launch() {
  // The variables are read and checked by the launch environment (launch_env.hpp).
  const LaunchEnv env = read_launch_env();
  const std::optional<SpareEnv> spare = read_spare_env(env);
  if (!spare) return std::nullopt;
  SpareLaunch l;
  l.process = spare->process;
  l.num_processes = spare->num_processes;
  l.spares = spare->spares;
  l.incarnation = static_cast<int>(spare->incarnation);
  l.store = env.store.value_or("");
  l.job_id = env.job_id.value_or("default");
  l.token = env.token.value_or("");
  l.timeout = env.timeout;
  return l;
}

std::unique_ptr<Recovery> make_recovery(const SpareLaunch& launch, RecoveryOptions options) {
  StoreOptions so;
  so.job_id = launch.job_id;
  so.token = launch.token;
  if (launch.timeout) so.timeout = *launch.timeout;
  so.process = Recovery::identity(launch.process, launch.incarnation);
  if (launch.timeout) options.timeout = *launch.timeout;
  options.incarnation = launch.incarnation;
  SparePlacement placement;
  placement.spares = launch.spares;
  return std::make_unique<Recovery>(open_store(launch.store, so),
                                    RankMap(launch.world_size(), placement), launch.process,
                                    options);
}

}  // namespace commgrid
