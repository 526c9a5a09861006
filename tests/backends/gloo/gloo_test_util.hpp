// Helpers for the Gloo tests: typed buffers of any DataType and short timeouts.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/gloo.hpp"
#include "commgrid/local_ranks.hpp"
#include "commgrid/store.hpp"
#include "store_test_util.hpp"

namespace commgrid::test {

/// What a HookedMemoryStore calls: on_set before a write (it may delay it, record it, or
/// return false to drop it: a rank whose writes never arrive); on_get before a read.
struct StoreHooks {
  // Default member initializers: a test sets only the hooks it needs (.on_get = ...).
  std::function<bool(const std::string& key, const std::vector<char>& value)> on_set = {};
  std::function<void(const std::string& key)> on_get = {};
};

/// An in-memory store (keys written once, like every commgrid store) with test hooks.
class HookedMemoryStore final : public Store {
 public:
  explicit HookedMemoryStore(StoreHooks hooks) : hooks_(std::move(hooks)) {}
  std::string uri() const override { return "memory"; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (hooks_.on_set && !hooks_.on_set(key, value)) return;
    std::lock_guard lock(mutex_);
    if (map_.count(key) != 0) throw BackendError("key '" + key + "' is already set");
    map_[key] = value;
  }
  std::vector<char> do_get(const std::string& key) override {
    if (hooks_.on_get) hooks_.on_get(key);
    std::lock_guard lock(mutex_);
    return map_.at(key);
  }
  bool do_has(const std::string& key) override {
    std::lock_guard lock(mutex_);
    return map_.count(key) != 0;
  }

 private:
  StoreHooks hooks_;
  std::mutex mutex_;
  std::map<std::string, std::vector<char>> map_;
};

/// Seconds since t0 (steady clock), for tests that bound how long something took.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline constexpr DataType kAllTypes[] = {DataType::float32, DataType::float64, DataType::bfloat16,
                                         DataType::int32, DataType::int64};
inline constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::prod};

/// Options for tests: a timeout that turns any hang into a failure within seconds.
inline GlooOptions test_options(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  GlooOptions o;
  o.timeout = timeout;
  return o;
}

/// `options` placing this rank: rank `rank` of `size` ranks meeting in `store`.
inline GlooOptions placed(std::shared_ptr<Store> store, Rank rank, Rank size,
                          GlooOptions options = test_options()) {
  options.store = std::move(store);
  options.rank = rank;
  options.size = size;
  return options;
}

/// A buffer of `count` elements of `type`, read and written as doubles. Test values are
/// small integers, exact in every type including bfloat16.
class Buffer {
 public:
  Buffer(DataType type, size_t count) : type_(type), bytes_(count * element_size(type)) {}
  void* data() { return bytes_.data(); }
  [[nodiscard]] size_t count() const { return bytes_.size() / element_size(type_); }
  void set(size_t i, double v) {
    std::uint8_t* p = bytes_.data() + i * element_size(type_);
    switch (type_) {
      case DataType::float32: {
        float x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::float64: std::memcpy(p, &v, 8); break;
      case DataType::bfloat16: {
        std::uint16_t x = float_to_bf16(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        break;
      }
      case DataType::int32: {
        auto x = static_cast<std::int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::int64: {
        auto x = static_cast<std::int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      case DataType::float16: {
        std::uint16_t x = float_to_fp16(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        break;
      }
      case DataType::int8: {
        auto x = static_cast<std::int8_t>(v);
        std::memcpy(p, &x, 1);
        break;
      }
      case DataType::uint8: {
        auto x = static_cast<std::uint8_t>(v);
        std::memcpy(p, &x, 1);
        break;
      }
    }
  }
  [[nodiscard]] double get(size_t i) const {
    const std::uint8_t* p = bytes_.data() + i * element_size(type_);
    switch (type_) {
      case DataType::float32: {
        float x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DataType::float64: {
        double x;
        std::memcpy(&x, p, 8);
        return x;
      }
      case DataType::bfloat16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return bf16_to_float(x);
      }
      case DataType::int32: {
        std::int32_t x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DataType::int64: {
        std::int64_t x;
        std::memcpy(&x, p, 8);
        return static_cast<double>(x);
      }
      case DataType::float16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return fp16_to_float(x);
      }
      case DataType::int8: {
        std::int8_t x;
        std::memcpy(&x, p, 1);
        return x;
      }
      case DataType::uint8: {
        std::uint8_t x;
        std::memcpy(&x, p, 1);
        return x;
      }
    }
    return 0;
  }

 private:
  DataType type_;
  std::vector<std::uint8_t> bytes_;
};

/// The reduction of a and b as the backends define it (exact for the test values).
inline double apply(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::sum: return a + b;
    case ReduceOp::prod: return a * b;
    case ReduceOp::max: return a > b ? a : b;
    case ReduceOp::min: return a < b ? a : b;
    case ReduceOp::avg: break;  // not elementwise: tests/backends/comm_suite.hpp covers it
  }
  return 0;
}

/// Rank r's value for element i under op: 1..5 for sums/min/max; 1 or 2 for products so
/// that a product over 16 ranks (at most 2^16) stays exact even in bfloat16.
inline double test_value(ReduceOp op, Rank rank, size_t i) {
  if (op == ReduceOp::prod) return 1.0 + static_cast<double>((static_cast<size_t>(rank) + i) % 2);
  return 1.0 + static_cast<double>((static_cast<size_t>(rank) * 7 + i * 3) % 5);
}

/// Each of `fds` (strangers' connections to Gloo pair listeners) was closed by the
/// connection gate after the listener's proof alone (64 bytes): nothing from Gloo reached it.
/// Closes them.
inline void expect_refused_by_the_gate(std::vector<int>& fds) {
  for (int fd : fds) {
    const long got = bytes_until_closed(fd);
    EXPECT_GE(got, 0) << "a stranger's connection was left open";
    EXPECT_LE(got, 64) << "a stranger got more than the listener's proof";
    ::close(fd);
  }
  fds.clear();
}

/// Runs fn on n rank-threads and fails the test with the first failure's message.
inline void run_ranks(Rank n, const std::function<void(Communicator&)>& fn,
                      GlooOptions options = test_options()) {
  auto r = run_local_ranks_collect(n, fn, options);
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
}

}  // namespace commgrid::test
