// Multi-module job files (`commgrid plan --job job.json`): several HyperGrids on disjoint
// rank spans of one world. Schema in docs/megatron-head.md ("Multi-module jobs").
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "commgrid/hyper_grid.hpp"

namespace commgrid::cli {

/// One module of a job: its grid and the dim sets whose groups it uses.
struct JobModule {
  std::string name;
  HyperGrid grid;
  std::vector<std::vector<std::string>> groups;  ///< each a set of dims
};

/// A parsed, checked job file.
struct Job {
  std::int64_t world_size = 1;
  std::vector<JobModule> modules;
};

/// Reads and checks a job file. Throws ConfigError whose message names the field
/// ("job.modules[1].dims[0].size: expected an integer >= 1, got \"x\"").
[[nodiscard]] Job read_job(const std::string& path);

/// `plan --job`: a table (one line per module and group set) or JSON.
void write_job_plan(std::ostream& out, const Job& job, bool json);

}  // namespace commgrid::cli
