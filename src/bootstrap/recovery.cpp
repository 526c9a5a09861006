// Recovery: the agreement on each next epoch through the job's store (docs/resilience.md).
#include "commgrid/recovery.hpp"

#include "commgrid/launch_env.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>
#include <sstream>
#include <thread>

namespace commgrid {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

std::span<const char> bytes(const std::string& s) { return {s.data(), s.size()}; }
std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

std::string join(const std::vector<std::int64_t>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::int64_t parse_number(std::string_view s, const std::string& where) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    throw BackendError("recovery: malformed " + where + " '" + std::string(s) + "'");
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const auto at = s.find(sep);
    out.push_back(s.substr(0, at));
    if (at == std::string_view::npos) break;
    s.remove_prefix(at + 1);
  }
  return out;
}

}  // namespace

std::string dead_process_key(const std::string& prefix, std::int64_t process, int incarnation) {
  return prefix + "/process/" + std::to_string(process) + "/" + std::to_string(incarnation) +
         "/dead";
}
std::string epoch_failed_key(const std::string& prefix, std::int64_t epoch) {
  return prefix + "/epoch/" + std::to_string(epoch) + "/failed";
}
std::string epoch_decision_key(const std::string& prefix, std::int64_t epoch) {
  return prefix + "/epoch/" + std::to_string(epoch) + "/decision";
}

std::string Recovery::identity(std::int64_t process, int incarnation) {
  return "process/" + std::to_string(process) + "/" + std::to_string(incarnation);
}

Recovery::Recovery(std::shared_ptr<Store> store, RankMap map, std::int64_t process,
                   RecoveryOptions options)
    : store_(std::move(store)), map_(std::move(map)), process_(process),
      options_(std::move(options)),
      incarnation_(static_cast<std::size_t>(map_.num_processes()), 0) {
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
  while (store_->has(epoch_decision_key(options_.prefix, epoch_ + 1)))
    adopt(text(store_->get(epoch_decision_key(options_.prefix, epoch_ + 1))));
  // A restarted process first waits for the decision that declares its previous
  // incarnation dead (launch restarts it at once), then asks to come back as a spare at
  // the next decision (adopt registers it).
  if (options_.incarnation > incarnation_[static_cast<std::size_t>(process_)]) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Ms>(
                                             options_.timeout * (1.0 + options_.decision_window));
    while (map_.role(process_) != ProcessRole::dead) {
      const std::string k = epoch_decision_key(options_.prefix, epoch_ + 1);
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

std::string Recovery::key(std::int64_t epoch, const std::string& name) const {
  return options_.prefix + "/epoch/" + std::to_string(epoch) + "/" + name;
}

std::string Recovery::world_prefix() const { return key(epoch_, "world"); }

void Recovery::mark_failed(const std::string& reason) {
  (void)store_->set_if_absent(epoch_failed_key(options_.prefix, epoch_),
                              bytes("process " + std::to_string(process_) + ": " + reason));
}

bool Recovery::failed() { return store_->has(epoch_failed_key(options_.prefix, epoch_)); }

std::string Recovery::failure_reason() {
  const std::string k = epoch_failed_key(options_.prefix, epoch_);
  return store_->has(k) ? text(store_->get(k)) : std::string();
}

void Recovery::mark_done() { (void)store_->set_if_absent(options_.prefix + "/done", bytes("1")); }

bool Recovery::done() { return store_->has(options_.prefix + "/done"); }

bool Recovery::wait_for_failure() {
  const std::vector<std::string> keys{epoch_failed_key(options_.prefix, epoch_)};
  for (;;) {
    if (done()) return false;
    // Slices of a second: a finished job is seen within one.
    if (store_->wait_for(keys, Ms(1000)).empty()) return true;
  }
}

bool Recovery::dead_known(std::int64_t p) {
  return store_->has(
      dead_process_key(options_.prefix, p, incarnation_[static_cast<std::size_t>(p)]));
}

EpochChange Recovery::change(const RankMap& map, const std::vector<std::int64_t>& dead) const {
  if (dead.empty()) return {map, std::nullopt};
  if (!options_.shrink) return {map.replace(dead), std::nullopt};
  return replace_or_shrink(map, dead, *config_, options_.shrink->global_batch);
}

std::string Recovery::decide(const std::vector<std::int64_t>& dead,
                             const std::vector<std::int64_t>& revived) {
  std::string out = "epoch=" + std::to_string(epoch_ + 1) +
                    "\ndecider=" + std::to_string(process_) + "\ndead=" + join(dead) + "\nrevived=";
  RankMap revived_map = map_;
  for (std::size_t i = 0; i < revived.size(); ++i) {
    const std::string k = key(epoch_ + 1, "alive/" + std::to_string(revived[i]));
    out += (i ? "," : "") + std::to_string(revived[i]) + ":" + text(store_->get(k));
    revived_map = revived_map.revive(revived[i]);
  }
  out += "\n";
  // The world size a shrink leads to, which every process checks against its own plan.
  try {
    if (const auto plan = change(revived_map, dead).shrink)
      out += "shrink=" + std::to_string(plan->config.world_size) + "\n";
  } catch (const ConfigError&) {
    // No next epoch: every process throws the same error when it adopts the decision.
  }
  return out;
}

void Recovery::adopt(const std::string& decision) {
  EpochDecision d;
  d.text = decision;
  std::vector<std::pair<std::int64_t, int>> revive;
  std::optional<std::int64_t> shrink_world;
  for (std::string_view line : split(decision, '\n')) {
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string_view::npos)
      throw BackendError("recovery: malformed decision line '" + std::string(line) + "'");
    const std::string_view name = line.substr(0, eq), value = line.substr(eq + 1);
    if (name == "epoch") d.epoch = parse_number(value, "epoch");
    else if (name == "decider") d.decider = parse_number(value, "decider");
    else if (name == "dead") {
      for (auto p : split(value, ',')) d.dead.push_back(parse_number(p, "dead process"));
    } else if (name == "revived") {
      for (auto item : split(value, ',')) {
        const auto colon = item.find(':');
        if (colon == std::string_view::npos)
          throw BackendError("recovery: malformed revived '" + std::string(item) + "'");
        revive.emplace_back(parse_number(item.substr(0, colon), "revived process"),
                            static_cast<int>(parse_number(item.substr(colon + 1), "incarnation")));
        d.revived.push_back(revive.back().first);
      }
    } else if (name == "shrink") {
      shrink_world = parse_number(value, "shrink");
    }
  }
  if (d.epoch != epoch_ + 1)
    throw BackendError("recovery: the decision for epoch " + std::to_string(epoch_ + 1) +
                       " says epoch " + std::to_string(d.epoch));
  RankMap next = map_;
  for (auto [p, inc] : revive) {
    next = next.revive(p);
    incarnation_[static_cast<std::size_t>(p)] = inc;
  }
  epoch_ = d.epoch;
  history_.push_back(d);
  // A decision that leaves a rank without a spare (and, with shrink, without a smaller
  // layout) still ends the epoch on every process alike: each throws the same error.
  EpochChange step = change(next, d.dead);
  const auto world = [](std::optional<std::int64_t> w) {
    return w ? "shrinks the world to " + std::to_string(*w) : std::string("keeps the world");
  };
  const std::optional<std::int64_t> mine =
      step.shrink ? std::optional<std::int64_t>(step.shrink->config.world_size) : std::nullopt;
  if (mine != shrink_world)
    throw BackendError("recovery: the decision for epoch " + std::to_string(epoch_) + " " +
                       world(shrink_world) + ", this process's plan " + world(mine) +
                       " (RecoveryOptions::shrink differs between processes)");
  if (step.shrink) {
    config_ = step.shrink->config;
    shrunk_ = true;
  }
  history_.back().shrink = std::move(step.shrink);
  map_ = std::move(step.map);
  if (map_.role(process_) == ProcessRole::dead &&
      incarnation_[static_cast<std::size_t>(process_)] == options_.incarnation)
    throw FencedError("process " + std::to_string(process_) + " was declared dead in epoch " +
                      std::to_string(epoch_) + " and is fenced: it may not rejoin; exiting");
  // A restarted process not taken back yet asks again at the next decision.
  if (map_.role(process_) == ProcessRole::dead)
    (void)store_->set_if_absent(key(epoch_ + 1, "alive/" + std::to_string(process_)),
                                bytes(std::to_string(options_.incarnation)));
}

const EpochDecision& Recovery::agree() {
  const std::int64_t next = epoch_ + 1;
  const std::string decision_key = epoch_decision_key(options_.prefix, next);
  mark_failed("joined the agreement on epoch " + std::to_string(next));
  (void)store_->set_if_absent(key(next, "alive/" + std::to_string(process_)),
                              bytes(std::to_string(options_.incarnation)));
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
    // Wait for the registrations in short slices, re-reading the deaths launch posts
    // between them: a death is often posted moments after a survivor detected it.
    std::vector<std::int64_t> known_dead, waiting;
    std::vector<std::string> keys, missing_keys;
    const auto window_end = Clock::now() + window;
    for (;;) {
      known_dead.clear();
      waiting.clear();
      keys.clear();
      for (std::int64_t p : expected)
        (p != process_ && dead_known(p) ? known_dead : waiting).push_back(p);
      for (std::int64_t p : waiting) keys.push_back(key(next, "alive/" + std::to_string(p)));
      const auto left = std::chrono::duration_cast<Ms>(window_end - Clock::now());
      missing_keys = store_->wait_for(keys, std::clamp(left, Ms(0), Ms(200)));
      if (missing_keys.empty() || Clock::now() >= window_end || store_->has(decision_key)) break;
    }
    const std::set<std::string> missing_set(missing_keys.begin(), missing_keys.end());
    std::vector<std::int64_t> registered, dead = known_dead;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      // A registration by another incarnation (a restart of a process that died) is not
      // this incarnation's: the one the map knows is dead.
      const bool here =
          missing_set.count(keys[i]) == 0 &&
          (waiting[i] == process_ || parse_number(text(store_->get(keys[i])), "incarnation") ==
                                         incarnation_[static_cast<std::size_t>(waiting[i])]);
      (here ? registered : dead).push_back(waiting[i]);
    }
    // Candidates in registration order's stand-in, the process number: round k's is the
    // k-th registered; the ones before it did not decide within their window: dead.
    const std::size_t idx =
        std::min<std::size_t>(static_cast<std::size_t>(round), registered.size() - 1);
    if (registered[idx] == process_ && !store_->has(decision_key)) {
      dead.insert(dead.end(), registered.begin(),
                  registered.begin() + static_cast<std::ptrdiff_t>(idx));
      std::sort(dead.begin(), dead.end());
      std::vector<std::int64_t> revived;
      for (std::int64_t p = 0; p < map_.num_processes(); ++p) {
        if (map_.role(p) != ProcessRole::dead) continue;
        const std::string k = key(next, "alive/" + std::to_string(p));
        if (store_->has(k) && parse_number(text(store_->get(k)), "incarnation") >
                                  incarnation_[static_cast<std::size_t>(p)])
          revived.push_back(p);
      }
      if (store_->set_if_absent(decision_key, bytes(decide(dead, revived))))
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
    // Every registered process had its window as the candidate, and none decided.
    if (static_cast<std::size_t>(round) >= registered.size())
      throw TimeoutError("recovery: no decision for epoch " + std::to_string(next) +
                         " after every registered process's window of " +
                         std::to_string(window.count()) +
                         " ms (processes registered: " + join(registered) + ")");
  }
}

EpochGroups Recovery::build(const WorldFactory& factory, const ParallelConfig& config,
                            const InitOptions& init) {
  EpochGroups out;
  out.epoch = epoch_;
  const std::optional<Rank> rank = logical_rank();
  if (!rank) return out;
  try {
    // A process that dies before the world exists (launch posts the epoch failed, or a peer
    // marks it) ends every wait for it at once instead of at the timeout.
    const WaitWatch watch(epoch_failed_key(options_.prefix, epoch_));
    out.world =
        factory(world_prefix(), static_cast<int>(*rank), static_cast<int>(map_.world_size()));
    out.groups = std::make_shared<ProcessGroups>();
    out.groups->initialize(*out.world, shrunk_ ? *config_ : config, init);
  } catch (const FencedError&) { throw; } catch (const BackendError& e) {
    mark_failed(std::string("creating the world of epoch ") + std::to_string(epoch_) +
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
