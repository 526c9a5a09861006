// Ranks as threads of one process over an in-memory store.
#include "commgrid/rank_threads.hpp"

#include <atomic>
#include <mutex>
#include <thread>

namespace commgrid {
namespace {

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) { return x.what(); } catch (...) {
    return "unknown exception";
  }
}

bool is_consequence(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const AbortedError&) { return true; } catch (...) {
    return false;
  }
}

}  // namespace

LocalRunResult run_rank_threads_collect(int size, const RankThreadWorldFactory& make_world,
                                        const std::function<void(Communicator& world)>& fn) {
  if (size < 1)
    throw InvalidValueError(
        "ranks", "local ranks: the number of ranks must be >= 1, got " + std::to_string(size));
  auto store = make_memory_store();
  LocalRunResult result;
  result.errors.resize(static_cast<size_t>(size));
  std::vector<long> order(static_cast<size_t>(size), -1);
  std::atomic<long> next_order{0};
  std::mutex mutex;
  {
    std::vector<std::jthread> threads;
    threads.reserve(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        // The world outlives the try block so that the failure is recorded (and the store
        // aborted) before this rank's connections close and its peers start failing.
        std::unique_ptr<Communicator> world;
        try {
          world = make_world(store, r, size);
          fn(*world);
        } catch (...) {
          auto e = std::current_exception();
          {
            std::lock_guard lock(mutex);
            result.errors[static_cast<size_t>(r)] = e;
            order[static_cast<size_t>(r)] = next_order++;
          }
          store->abort("aborted: rank " + std::to_string(r) +
                       " of the local job failed: " + message_of(e));
        }
        world.reset();
      });
    }
  }  // joins every thread
  // The first failure in time that is not a consequence of another (an abort, a lost peer);
  // if every failure is a consequence, the first one.
  long best = -1;
  for (bool need_real : {true, false}) {
    for (int r = 0; r < size; ++r) {
      const auto& e = result.errors[static_cast<size_t>(r)];
      if (!e || (need_real && is_consequence(e))) continue;
      if (best < 0 || order[static_cast<size_t>(r)] < best) {
        best = order[static_cast<size_t>(r)];
        result.first_failed_rank = r;
      }
    }
    if (result.first_failed_rank >= 0) break;
  }
  if (result.first_failed_rank >= 0)
    result.first_failure = "rank " + std::to_string(result.first_failed_rank) + ": " +
                           message_of(result.errors[static_cast<size_t>(result.first_failed_rank)]);
  return result;
}

void throw_first_failure(const LocalRunResult& r) {
  if (r.first_failed_rank >= 0)
    throw RankFailedError(r.first_failed_rank, r.errors[static_cast<size_t>(r.first_failed_rank)],
                          r.first_failure);
}

}  // namespace commgrid
