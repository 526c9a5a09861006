// The resilient driver (resilient_driver.hpp): snapshots, buddy copies, and the recovery
// around a program's steps.
#include "commgrid/resilient_driver.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <new>
#include <numeric>

#include "commgrid/layout.hpp"
#include "commgrid/resilience_keys.hpp"
#include "snapshots.hpp"

namespace commgrid {
using detail::available_memory;
using detail::find;
using detail::held;
using detail::keep_two;
using detail::kNone;
using detail::kRowCopies;
using detail::kRowSize;
using detail::kRowSnapshots;
using detail::size_text;
using detail::Snapshot;

namespace {

using Clock = std::chrono::steady_clock;

// The CPU time of this process, every thread's, in seconds.
std::chrono::duration<double> process_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// Point-to-point tags of the buddy copies on an epoch's world.
constexpr int kSizeTag = 7301, kStateTag = 7302, kCopyTag = 7303;

std::int64_t min_over(Communicator& c, std::int64_t v) {
  c.allreduce(std::span<std::int64_t>(&v, 1), ReduceOp::min)->wait();
  return v;
}

void* data(StateBytes& b) { return b.data(); }
const void* data(const StateBytes& b) { return b.data(); }

}  // namespace

StateSource parse_state_source(std::string_view text) {
  if (text == "auto") return StateSource::automatic;
  if (text == "replica") return StateSource::replica;
  if (text == "buddy") return StateSource::buddy;
  throw InvalidValueError("state_from", "state_from: expected auto, replica or buddy, got \"" +
                                            std::string(text) + "\"");
}

std::string_view state_source_name(StateSource source) noexcept {
  switch (source) {
    case StateSource::automatic: return "auto";
    case StateSource::replica: return "replica";
    case StateSource::buddy: return "buddy";
  }
  return "auto";
}

std::int64_t buddy_shift_for(std::int64_t world_size, std::int64_t local_world_size,
                             std::int64_t nnodes) {
  if (nnodes > 1 && local_world_size > 0 && world_size > local_world_size &&
      world_size % local_world_size == 0)
    return local_world_size;
  return 1;
}

struct ResilientDriver::Impl {
  Impl(Recovery& r, ResilientOptions o) : rec(r), options(std::move(o)) {
    // Every process of the job runs the same driver options: a recovery's decision proves
    // it, and the epoch's groups skip the fingerprint exchange.
    rec.declare(options.layout, options.init);
  }

  Recovery& rec;
  ResilientOptions options;
  std::size_t memory_limit = 0;
  // The run.
  StateProvider* state = nullptr;
  const ResilientCallbacks* cb = nullptr;
  EpochGroups g;
  bool model_live = false;         // start_epoch called, stop_epoch not yet
  std::deque<Snapshot> snapshots;  // the last two of this rank's own
  // Buddy copies: the last two snapshots of logical rank (r - shift) mod W, received at
  // each snapshot.
  std::deque<Snapshot> copies;
  std::int64_t shipped = -1;  // the step whose snapshot this rank last shipped
  std::int64_t step = 0;
  // No state of its own: a spare until it takes a rank. A rank of the first epoch holds the
  // initial state (start_epoch's) before its first snapshot.
  bool fresh = true;
  std::int64_t own_rank = -1;  // the logical rank whose state this rank's snapshots hold
  bool first_after_recovery = false;
  // The current epoch's layout and where a replaced rank's state comes from.
  ParallelConfig epoch_layout;
  bool buddy = false;
  std::vector<EpochRecord> epochs;

  // ---- the epoch -----------------------------------------------------------------
  void follow_layout() {
    epoch_layout = rec.config().value_or(options.layout);
    buddy = options.state_from == StateSource::buddy || !options.replicated_over_dp ||
            epoch_layout.dp() < 2;
  }

  EpochRecord& record_decision(const EpochDecision& d) {
    EpochRecord r;
    r.epoch = d.epoch;
    r.layout = d.shrink ? d.shrink->config : epochs.back().layout;
    r.process_of = d.process_of;
    r.dead = d.dead;
    r.shrink = d.shrink.has_value();
    epochs.push_back(std::move(r));
    return epochs.back();
  }

  void start_model() {
    EpochContext ctx;
    ctx.epoch = rec.epoch();
    ctx.rank = *rec.logical_rank();
    ctx.layout = epoch_layout;
    ctx.world = g.world;
    ctx.groups = g.groups;
    model_live = true;
    cb->start_epoch(ctx);
  }

  void stop_model() {
    if (model_live && cb->stop_epoch) cb->stop_epoch();
    model_live = false;
  }

  // ---- the state provider ----------------------------------------------------------
  [[nodiscard]] std::string who() const {
    const auto r = rec.logical_rank();
    return "process " + std::to_string(rec.process()) +
           (r ? " (logical rank " + std::to_string(*r) + ")" : std::string());
  }

  [[noreturn]] void end(const RecoveryError& e) {
    (void)rec.end_job(e.what());
    throw e;
  }

  // The state provider's snapshot of the model now.
  StateBytes save_state() {
    return provider("save", [&] { return state->save(); });
  }

  template <class F>
  auto provider(const char* call, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::bad_alloc&) {
      std::size_t held = 0;
      for (const auto* list : {&snapshots, &copies})
        for (const Snapshot& s : *list) held += s.bytes.size();
      end(StateProviderError(who() + ": the state provider's " + call +
                             " ran out of memory at step " + std::to_string(step) +
                             " (the snapshots and copies kept hold " + size_text(held) + ")"));
    } catch (const std::exception& e) {
      end(StateProviderError(who() + ": the state provider's " + call + " failed at step " +
                             std::to_string(step) + ": " + e.what()));
    }
  }

  void take_snapshot() {
    StateBytes bytes = save_state();
    // What keeping snapshots of this size takes: two of its own and, with buddy copies, two
    // of its source's (about the same size).
    const std::size_t kept = bytes.size() * (buddy ? 4 : 2);
    if (kept > memory_limit)
      end(RecoveryError(who() + ": the snapshot of step " + std::to_string(step) + " is " +
                        size_text(bytes.size()) + "; keeping " +
                        (buddy ? "2 snapshots and 2 buddy copies" : "2 snapshots") + " takes " +
                        size_text(kept) + ", more than the " + size_text(memory_limit) +
                        " allowed (ResilientOptions::snapshot_memory_limit; by default the "
                        "memory available at the start)"));
    keep_two(snapshots, {step, std::move(bytes)});
  }

  void load(std::span<const std::byte> bytes) {
    provider("load", [&] {
      state->load(bytes);
      return 0;
    });
  }

  // ---- buddy copies -----------------------------------------------------------------
  [[nodiscard]] std::int64_t shift() const {
    const std::int64_t w = epoch_layout.world_size;
    return options.buddy_shift % w == 0 ? std::int64_t{1} : options.buddy_shift;
  }
  [[nodiscard]] std::int64_t buddy_of(std::int64_t r) const {
    return (r + shift()) % epoch_layout.world_size;
  }
  [[nodiscard]] std::int64_t buddy_source(std::int64_t r) const {
    const std::int64_t w = epoch_layout.world_size;
    return ((r - shift()) % w + w) % w;
  }

  // Ships this rank's latest snapshot to its buddy and receives its source's: two batches of
  // point-to-point operations on the world, the sizes (a state may grow, with the results it
  // keeps) and the states.
  void ship() {
    Communicator& world = *g.world;
    const int to = static_cast<int>(buddy_of(world.rank()));
    const int from = static_cast<int>(buddy_source(world.rank()));
    const Snapshot& own = snapshots.back();
    auto mine = static_cast<std::int64_t>(own.bytes.size());
    std::int64_t source_size = 0;
    const P2POp sizes[] = {P2POp::send(std::span<std::int64_t>(&mine, 1), to, kSizeTag),
                           P2POp::recv(std::span<std::int64_t>(&source_size, 1), from, kSizeTag)};
    world.batch_isend_irecv(sizes)->wait();
    StateBytes in(static_cast<std::size_t>(source_size));
    const P2POp ops[] = {
        P2POp::send(data(own.bytes), own.bytes.size(), DataType::uint8, to, kStateTag),
        P2POp::recv(data(in), in.size(), DataType::uint8, from, kStateTag)};
    world.batch_isend_irecv(ops)->wait();
    keep_two(copies, {own.step, std::move(in)});
    shipped = own.step;
  }

  // The step this rank can go back to: its latest snapshot's (a rank of the first epoch
  // without one: step 0, the initial state) and, with buddy copies, no later than its
  // latest copy's; kNone without state.
  [[nodiscard]] std::int64_t offer_step() const {
    if (fresh) return kNone;
    std::int64_t latest = snapshots.empty() ? 0 : snapshots.back().step;
    if (buddy && !copies.empty()) latest = std::min(latest, copies.back().step);
    return latest;
  }

  // Training resumes at step s of this epoch with `bytes` (already loaded): the only
  // snapshot, shipped again to the buddy (a spare's buddy, and a dead rank's, hold no copy).
  void resume_at(std::int64_t s, StateBytes bytes) {
    step = s;
    snapshots.clear();
    snapshots.push_back({s, std::move(bytes)});
    shipped = -1;
    fresh = false;
    own_rank = g.world->rank();
  }

  // This rank's resync row (snapshots.hpp).
  [[nodiscard]] std::vector<std::int64_t> record() const {
    return detail::resync_row(offer_step(), snapshots, copies);
  }

  // After a regroup: back to the latest step whose snapshot every survivor holds (with
  // buddy copies: and whose copies too), and every rank without state (a spare that took a
  // rank) gets that step's state of its logical rank: from its data-parallel group's lowest
  // survivor (replicas) or from its buddy (the rank that received its copies). At step 0 a
  // rank whose every holder died starts from the initial state (start_epoch's). Every
  // rank's row (from the decision, else one allgather) decides it all alike on every rank;
  // then only the states that move are sent, from their holder to the rank that lacks them
  // (a survivor loads its own snapshot).
  void resync() {
    Communicator& world = *g.world;
    // A survivor whose model had not started when it registered (the job's first groups
    // failed) takes step 0's snapshot now; it left no row, so the rows are allgathered below.
    if (!fresh && snapshots.empty()) snapshots.push_back({0, save_state()});
    const auto w = static_cast<std::size_t>(world.size());
    // Every rank's row: from the decision, which carries each registered process's (alike
    // on every rank), or, when one is missing there (a restarted process came back), one
    // allgather.
    std::vector<std::int64_t> all = rec.history().empty()
                                        ? std::vector<std::int64_t>{}
                                        : detail::rows_of(rec.history().back(), w);
    if (all.empty()) {
      const std::vector<std::int64_t> mine = record();
      all.resize(kRowSize * w);
      world.allgather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all))->wait();
    }
    auto row = [&](std::size_t r) { return all.data() + kRowSize * r; };
    auto stateless = [&](std::size_t r) { return row(r)[0] == kNone; };
    std::int64_t s = kNone;
    for (std::size_t r = 0; r < w; ++r) s = std::min(s, row(r)[0]);
    if (s == kNone) end(StateLostError("recovery: no survivor holds a snapshot"));
    const Snapshot* own = fresh ? nullptr : find(snapshots, s);
    if (!fresh && own == nullptr)
      throw InternalError("recovery: this rank kept no snapshot of step " + std::to_string(s));
    StateBytes bytes = own != nullptr ? own->bytes : StateBytes{};
    bool have = own != nullptr;
    const auto me = static_cast<std::size_t>(world.rank());
    std::vector<P2POp> ops;
    // Rank `to` gets step s's state from `from`'s snapshot (`at` = kRowSnapshots) or copy.
    auto move = [&](std::size_t from, std::size_t to, std::size_t at) {
      if (from == me) {
        const StateBytes& out = at == kRowSnapshots ? own->bytes : find(copies, s)->bytes;
        ops.push_back(
            P2POp::send(data(out), out.size(), DataType::uint8, static_cast<int>(to), kCopyTag));
      }
      if (to == me) {
        bytes.resize(static_cast<std::size_t>(held(row(from), at, s)));
        ops.push_back(P2POp::recv(data(bytes), bytes.size(), DataType::uint8,
                                  static_cast<int>(from), kCopyTag));
        have = true;
      }
    };
    if (!buddy) {
      // Replicas: each data-parallel group's lowest member with state is the source of its
      // members without (the survivors' states are equal).
      std::vector<std::size_t> source(w, w);
      const GroupList dps = g.groups->layout().groups(GroupKind::dp);
      for (std::size_t i = 0; i < dps.size(); ++i) {
        std::size_t first = w;
        for (const Rank m : dps[i])
          if (first == w && !stateless(static_cast<std::size_t>(m)))
            first = static_cast<std::size_t>(m);
        for (const Rank m : dps[i]) source[static_cast<std::size_t>(m)] = first;
      }
      for (std::size_t d = 0; d < w; ++d) {
        if (!stateless(d)) continue;
        if (source[d] == w) {
          if (s == 0) continue;  // step 0's state is the initial one
          end(StateLostError("the state of logical rank " + std::to_string(d) +
                             " is lost: every replica in its data-parallel group died"));
        }
        move(source[d], d, kRowSnapshots);
      }
    } else {
      // Buddy copies: rank d's copy of step s is held by its buddy.
      for (std::size_t d = 0; d < w; ++d) {
        if (!stateless(d) || s == 0) continue;  // step 0's state is the initial one
        const auto b = static_cast<std::size_t>(buddy_of(static_cast<std::int64_t>(d)));
        if (stateless(b) || held(row(b), kRowCopies, s) < 0)
          end(StateLostError("the state of logical rank " + std::to_string(d) + " is lost: " +
                             (stateless(b)
                                  ? "it and its buddy, logical rank " + std::to_string(b) + ", died"
                                  : "its buddy, logical rank " + std::to_string(b) +
                                        ", holds no copy of step " + std::to_string(s))));
        move(b, d, kRowCopies);
      }
    }
    if (!ops.empty()) world.batch_isend_irecv(ops)->wait();
    // A rank's copies of a later step than s are of a step not taken again yet.
    while (buddy && !copies.empty() && copies.back().step > s) copies.pop_back();
    if (have) load(bytes);
    else bytes = save_state();  // the initial state
    resume_at(s, std::move(bytes));
  }

  // ---- shrink -------------------------------------------------------------------------
  // What a shrink's transfer gave a rank of the smaller layout.
  struct Resharded {
    std::int64_t step = 0;
    std::optional<ReshardContext> context;  // nullopt on a process left without a rank
    std::vector<std::uint8_t> buffer;       // the states every process offered
    std::vector<ReshardPart> parts;         // spans into buffer
  };

  // A shrink (no spare left): every live process, the new world's ranks and the spares (the
  // survivors of dropped replicas among them), meets in a transfer world of the epoch and
  // offers the states it holds of the step every one of them can go back to: its own
  // snapshot and its buddy copy, each with the logical rank it belongs to. Each rank of the
  // shrunk world takes what its provider's reshard_needs asks for. Everything is offered to
  // everyone (an allgather): simple, and sized for small models.
  Resharded reshard(const ShrinkPlan& plan) {
    const RankMap& map = rec.map();
    std::vector<std::int64_t> live;
    for (std::int64_t p = 0; p < map.num_processes(); ++p)
      if (map.role(p) != ProcessRole::dead) live.push_back(p);
    const auto me =
        static_cast<int>(std::find(live.begin(), live.end(), rec.process()) - live.begin());
    Resharded out;
    if (me == static_cast<int>(live.size())) return out;  // declared dead by this decision
    auto transfer = options.factory(epoch_transfer_prefix(rec.options().prefix, rec.epoch()), me,
                                    static_cast<int>(live.size()));
    const std::int64_t s = min_over(*transfer, offer_step());
    if (s == kNone) end(StateLostError("recovery: no survivor holds a snapshot"));
    out.step = s;
    if (const auto rank = rec.logical_rank()) {
      ReshardContext ctx;
      ctx.old_layout = epoch_layout;
      ctx.new_layout = plan.config;
      ctx.rank = *rank;
      ctx.old_rank = plan.old_ranks()[static_cast<std::size_t>(*rank)];
      ctx.plan = plan;
      out.context = std::move(ctx);
    }
    if (s == 0) return out;  // the initial state: every new rank's start_epoch gives it
    // What this process offers: [owner, length, bytes...] per state it holds of step s.
    std::vector<std::uint8_t> offer;
    auto add = [&](std::int64_t owner, const StateBytes& bytes) {
      const std::int64_t header[2] = {owner, static_cast<std::int64_t>(bytes.size())};
      const auto* h = reinterpret_cast<const std::uint8_t*>(header);
      offer.insert(offer.end(), h, h + sizeof header);
      const auto* b = reinterpret_cast<const std::uint8_t*>(bytes.data());
      offer.insert(offer.end(), b, b + bytes.size());
    };
    if (const Snapshot* mine = fresh ? nullptr : find(snapshots, s)) add(own_rank, mine->bytes);
    if (const Snapshot* copy = (fresh || !buddy) ? nullptr : find(copies, s))
      add(buddy_source(own_rank), copy->bytes);
    const auto n = static_cast<std::size_t>(transfer->size());
    auto length = static_cast<std::int64_t>(offer.size());
    std::vector<std::int64_t> lengths(n);
    transfer->allgather(std::span<const std::int64_t>(&length, 1), std::span<std::int64_t>(lengths))
        ->wait();
    const std::vector<std::size_t> counts(lengths.begin(), lengths.end());
    out.buffer.resize(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    transfer->allgatherv(offer.data(), offer.size(), out.buffer.data(), counts, DataType::uint8)
        ->wait();
    std::map<Rank, std::span<const std::byte>> held;  // old logical rank -> its state at s
    for (std::size_t at = 0; at + 16 <= out.buffer.size();) {
      std::int64_t header[2];
      std::memcpy(header, out.buffer.data() + at, sizeof header);
      const auto len = static_cast<std::size_t>(header[1]);
      held.emplace(header[0],
                   std::span<const std::byte>(
                       reinterpret_cast<const std::byte*>(out.buffer.data() + at + 16), len));
      at += 16 + len;
    }
    // Whether every rank of the new world finds what it needs: the verdict is the transfer
    // world's, so that every process ends alike.
    std::int64_t missing = kNone;
    if (out.context) {
      const std::vector<ReshardNeed> needs =
          provider("reshard_needs", [&] { return state->reshard_needs(*out.context); });
      for (const ReshardNeed& need : needs) {
        std::optional<ReshardPart> found;
        for (const std::vector<Rank>& alternative : need.alternatives) {
          ReshardPart part;
          for (Rank r : alternative) {
            const auto it = held.find(r);
            if (it == held.end()) break;
            part.ranks.push_back(r);
            part.states.push_back(it->second);
          }
          if (part.ranks.size() == alternative.size()) {
            found = std::move(part);
            break;
          }
        }
        if (!found) {
          for (const std::vector<Rank>& alternative : need.alternatives)
            for (Rank r : alternative)
              if (!held.count(r) && missing == kNone) missing = r;
          if (missing == kNone) missing = out.context->old_rank;  // a need without alternatives
          continue;
        }
        out.parts.push_back(std::move(*found));
      }
    }
    const std::int64_t lost = min_over(*transfer, missing);
    if (lost != kNone)
      end(StateLostError("the state of logical rank " + std::to_string(lost) +
                         " is lost: no live process holds it to reshard to the shrunk layout of "
                         "epoch " +
                         std::to_string(rec.epoch())));
    return out;
  }

  // ---- recovery ---------------------------------------------------------------------
  // Recovery::recover, in parts: agree, (a shrink's transfer), the epoch's world and
  // groups, the program's model, the state; all of it again from the next decision when a
  // process dies on the way (every failure ends at least one process, so the attempts are
  // bounded). A shrink's epoch is not retried: the states held are of the old layout's
  // ranks (a failure while resharding ends the job).
  void recover() {
    const auto cpu0 = process_cpu();
    for (std::int64_t attempt = 1;; ++attempt) {
      const auto t0 = Clock::now();
      // A rank that failed before its first snapshot holds step 0's state while its model
      // still runs (the state is the initial one: every step begins with its snapshot).
      if (!fresh && snapshots.empty() && model_live) snapshots.push_back({0, save_state()});
      stop_model();
      g = EpochGroups{};  // closes this epoch's connections: blocked peers fail now
      // This rank's resync row travels with its registration: the decision gives every
      // process of the next epoch every row, without a collective. One whose model never
      // started (the job's first groups failed) has no state to describe yet: it leaves no
      // row, and resync allgathers the rows once every model runs.
      rec.set_note(!fresh && snapshots.empty() ? std::string() : join_numbers(record()));
      const EpochDecision& decision = rec.agree();
      const auto agreed = Clock::now();
      EpochRecord* record = &record_decision(decision);
      if (cb->decided) cb->decided(decision);
      std::optional<Resharded> resharded;
      if (decision.shrink) {
        try {
          resharded = reshard(*decision.shrink);  // over the old layout: before follow_layout
        } catch (const FencedError&) { throw; } catch (const BackendError& e) {
          end(
              RecoveryError("recovery: a process failed during the state transfer of the "
                            "shrink into epoch " +
                            std::to_string(rec.epoch()) + ": " + e.what()));
        }
      }
      follow_layout();
      const auto moved = Clock::now();
      try {
        g = rec.build(options.factory, epoch_layout, options.init);
        const auto t1 = Clock::now();
        record = &epochs.back();
        record->agreement = agreed - t0;
        record->groups = t1 - moved;
        record->cpu = process_cpu() - cpu0;
        if (!g.world) {  // a spare (again, or a survivor of a dropped replica)
          if (resharded) {
            fresh = true;
            snapshots.clear();
            copies.clear();
          }
          return;
        }
        try {
          start_model();
        } catch (const ConfigError& e) {
          if (!resharded) throw;
          end(RecoveryError("the program cannot run the shrunk layout of epoch " +
                            std::to_string(rec.epoch()) + ": " + e.what()));
        }
        const auto t2 = Clock::now();
        if (resharded) {
          if (resharded->step > 0)
            provider("reshard", [&] {
              state->reshard(*resharded->context, resharded->parts);
              return 0;
            });
          copies.clear();  // of the old layout's ranks
          resume_at(resharded->step, save_state());
        } else {
          resync();
        }
        record = &epochs.back();
        record->model = t2 - t1;
        record->state = (moved - agreed) + (Clock::now() - t2);
        record->cpu = process_cpu() - cpu0;
        record->resumed_at = step;
        first_after_recovery = true;
        if (cb->recovered) cb->recovered(*record);
        return;
      } catch (const FencedError&) { throw; } catch (const BackendError& e) {
        if (resharded || attempt >= rec.map().num_processes()) throw;
        rec.mark_failed(e.what());
      }
    }
  }

  std::optional<Rank> run(std::int64_t steps) {
    follow_layout();
    fresh = !rec.logical_rank().has_value();
    own_rank = rec.logical_rank().value_or(-1);
    if (!epochs.empty() && rec.logical_rank()) epochs.back().resumed_at = 0;
    try {
      g = rec.build(options.factory, epoch_layout, options.init);
      if (g.world) start_model();
    } catch (const FencedError&) {
      throw;
    } catch (const BackendError& e) {  // a process died while the job started
      rec.mark_failed(e.what());
      recover();
    }
    while (step < steps) {
      if (!g.world) {
        if (!rec.wait_for_failure()) return std::nullopt;  // finished without this spare
        recover();
        continue;
      }
      if (cb->begin_step) cb->begin_step(step);
      try {
        if (step % options.snapshot_every == 0) {
          if (snapshots.empty() || snapshots.back().step != step) {
            take_snapshot();
            // The per-snapshot check: one store read every K steps.
            if (rec.failed())
              throw BackendError("epoch " + std::to_string(rec.epoch()) +
                                 " failed: " + rec.failure_reason());
          }
          if (buddy && shipped != step) ship();
        }
        cb->step(step);
        ++step;
        const bool first = first_after_recovery;
        first_after_recovery = false;
        if (cb->stepped) cb->stepped(step - 1, first);
      } catch (const FencedError&) { throw; } catch (const BackendError& e) {
        rec.mark_failed(e.what());
        recover();
      }
    }
    // Every rank has finished before logical rank 0 lets the spares go.
    g.world->barrier()->wait();
    const Rank rank = *rec.logical_rank();
    stop_model();
    if (rank == 0) rec.mark_done();
    return rank;
  }
};

ResilientDriver::ResilientDriver(std::unique_ptr<Recovery> recovery, ResilientOptions options)
    : recovery_(std::move(recovery)) {
  if (!recovery_) throw ConfigError("recovery", "ResilientDriver: no Recovery given");
  if (!options.factory) throw ConfigError("factory", "ResilientDriver: no world factory given");
  if (options.snapshot_every < 1)
    throw InvalidValueError("snapshot_every", "ResilientDriver: snapshot_every must be >= 1, got " +
                                                  std::to_string(options.snapshot_every));
  options.layout.validate();
  const Recovery& rec = *recovery_;
  const std::int64_t w = options.layout.world_size;
  if (rec.epoch() == 0 && w != rec.map().world_size())
    throw IncompatibleError("layout", "ResilientDriver: the layout's world_size " +
                                          std::to_string(w) + " is not the job's world of " +
                                          std::to_string(rec.map().world_size()));
  if (options.state_from == StateSource::replica &&
      (!options.replicated_over_dp || options.layout.dp() < 2))
    throw IncompatibleError(
        "state_from", std::string("ResilientDriver: state_from replica needs a full "
                                  "data-parallel replica of every rank, and ") +
                          (options.layout.dp() < 2 ? "dp is " + std::to_string(options.layout.dp())
                                                   : std::string("the state is not replicated "
                                                                 "over dp")));
  const bool buddy = options.state_from == StateSource::buddy || !options.replicated_over_dp ||
                     options.layout.dp() < 2;
  if (buddy && (options.buddy_shift <= 0 || options.buddy_shift % w == 0))
    throw IncompatibleError("buddy_shift",
                            "ResilientDriver: buddy copies need another rank to hold each rank's "
                            "state, and world size " +
                                std::to_string(w) + " with buddy shift " +
                                std::to_string(options.buddy_shift) + " gives every rank itself");
  if (options.shrink && options.layout.compat == Compat::seed && !rec.options().shrink)
    throw IncompatibleError("shrink",
                            "ResilientDriver: shrink is on but the Recovery was made without "
                            "RecoveryOptions::shrink (make_resilient_driver sets it)");
  impl_ = std::make_unique<Impl>(*recovery_, std::move(options));
  impl_->memory_limit = impl_->options.snapshot_memory_limit > 0
                            ? impl_->options.snapshot_memory_limit
                            : available_memory();
  // Epoch 0 (logical rank r on process r) and every decision already made (a restarted
  // process replays them).
  EpochRecord first;
  first.layout = impl_->options.layout;
  for (Rank r = 0; r < w; ++r) first.process_of.push_back(r);
  impl_->epochs.push_back(std::move(first));
  for (const EpochDecision& d : rec.history()) (void)impl_->record_decision(d);
  impl_->follow_layout();
}

ResilientDriver::~ResilientDriver() = default;

std::optional<Rank> ResilientDriver::run(std::int64_t steps, StateProvider& state,
                                         const ResilientCallbacks& callbacks) {
  if (!callbacks.start_epoch || !callbacks.step)
    throw ConfigError("callbacks", "ResilientDriver::run: start_epoch and step are required");
  if (steps < 0)
    throw InvalidValueError(
        "steps", "ResilientDriver::run: steps must be >= 0, got " + std::to_string(steps));
  impl_->state = &state;
  impl_->cb = &callbacks;
  struct Release {
    Impl& impl;
    ~Release() {
      try {
        impl.stop_model();
      } catch (...) {}
      impl.g = EpochGroups{};
      impl.state = nullptr;
      impl.cb = nullptr;
    }
  } release{*impl_};
  return impl_->run(steps);
}

const ParallelConfig& ResilientDriver::layout() const noexcept { return impl_->epoch_layout; }

StateSource ResilientDriver::source() const noexcept {
  return impl_->buddy ? StateSource::buddy : StateSource::replica;
}

const std::vector<EpochRecord>& ResilientDriver::epochs() const noexcept { return impl_->epochs; }

std::unique_ptr<ResilientDriver> make_resilient_driver(const SpareLaunch& launch,
                                                       ResilientOptions options,
                                                       RecoveryOptions recovery) {
  // dp' must divide the global batch (when given); plan_shrink lays out the seed edition
  // only: a HEAD layout ends the job when no spare is left.
  if (options.shrink && options.layout.compat == Compat::seed)
    recovery.shrink = ShrinkOptions{options.layout, options.global_batch};
  auto rec = make_recovery(launch, recovery);
  return std::make_unique<ResilientDriver>(std::move(rec), std::move(options));
}

}  // namespace commgrid
