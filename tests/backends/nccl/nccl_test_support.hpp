// What the NCCL test files share: the text of an exception, and the base of the fixtures
// whose tests need CUDA devices (one rank-thread per device), which skip saying why.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "commgrid/nccl.hpp"

namespace commgrid::nccl_test {

/// What f throws, as what() says it; "(no exception)" when it throws nothing.
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) { return e.what(); }
  return "(no exception)";
}

/// `options` with `boot` as the bootstrap, lent (the caller keeps it alive longer).
inline NcclOptions over(Communicator& boot, NcclOptions options = {}) {
  options.bootstrap = std::shared_ptr<Communicator>(std::shared_ptr<void>(), &boot);
  return options;
}

/// How many rank-threads the device tests use: COMMGRID_NCCL_RANKS, else the devices this
/// process sees (at most 8).
inline int ranks_for_tests() {
  if (const char* env = std::getenv("COMMGRID_NCCL_RANKS"); env && *env) return std::atoi(env);
  return std::min(cuda_device_count(), 8);
}

/// Skips without a CUDA device, with more ranks asked for than devices, and with fewer
/// ranks than min_ranks_ (NCCL refuses two ranks on one GPU).
class DeviceRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
    n_ = ranks_for_tests();
    if (n_ < 1 || n_ > cuda_device_count())
      GTEST_SKIP() << "COMMGRID_NCCL_RANKS=" << n_
                   << " needs that many CUDA devices; this process sees " << cuda_device_count();
    if (n_ < min_ranks_)
      GTEST_SKIP() << "needs " << min_ranks_ << " ranks (" << min_ranks_
                   << " GPUs): NCCL refuses two ranks on one GPU";
  }
  int n_ = 1;
  int min_ranks_ = 1;
};

}  // namespace commgrid::nccl_test
