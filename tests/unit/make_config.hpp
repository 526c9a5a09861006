// A ParallelConfig from its common sizes, for tests.
#pragma once

#include "commgrid/config.hpp"

namespace commgrid::test {

inline ParallelConfig make_config(std::int64_t w, std::int64_t tp, std::int64_t pp = 1,
                                  std::int64_t cp = 1, std::int64_t ep = 1,
                                  const char* order = kDefaultOrder) {
  ParallelConfig c;
  c.world_size = w;
  c.tp = tp;
  c.pp = pp;
  c.cp = cp;
  c.ep = ep;
  c.order = order;
  return c;
}

}  // namespace commgrid::test
