// commgrid launch: starts N processes of one program on this machine, like torchrun: alone
// with a file store in a fresh temporary folder, or as one node of several (--nnodes) with
// the TCP store that rank 0 serves at --master-addr:--master-port (with --spares, launch
// serves it). Each process gets commgrid's variables and torchrun's (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, ...), so a torch program's init_process_group("gloo") starts
// with env:// under it. The pieces: launch_flags (flags), child_env (variables), supervisor
// (processes), output_relay (their output), spare_keeper and job_store (--spares).
#include <iostream>
#include <memory>

#include "command.hpp"
#include "launch/launch_flags.hpp"
#include "launch/supervisor.hpp"

namespace commgrid::cli {

Command add_launch_command(CLI::App& root) {
  auto flags = std::make_shared<LaunchFlags>();
  CLI::App* app = root.add_subcommand(
      "launch",
      "Start N processes of PROGRAM on this machine, like torchrun: each gets COMMGRID_RANK, "
      "COMMGRID_WORLD_SIZE, COMMGRID_STORE, COMMGRID_JOB_ID, COMMGRID_TOKEN and torchrun's "
      "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ... (alone: a "
      "file store in a fresh temporary folder; with --nnodes or --master-port: the TCP store "
      "rank 0 serves); prefix their output with [rank i]; stop all if one fails");
  add_launch_flags(*app, *flags);
  app->footer(
      "Examples: commgrid launch -n 8 -- commgrid verify --tp 2 --pp 2 --ep 2\n"
      "          commgrid launch -n 8 -- python3 train.py   (init_process_group(\"gloo\"), env://)\n"
      "          commgrid launch --output rank0 -n 4 -- commgrid-train-gpt --pp 2 --format json\n"
      "Exit codes: 0 every rank exited 0, 1 a rank failed, 2 bad usage or every rank exited 2, "
      "124 --timeout, 128+N interrupted by signal N.");
  return {app, [flags]() -> int {
            LaunchSettings settings = parse_launch_flags(*flags);
            std::cout.flush();
            return Supervisor(std::move(settings)).run();
          }};
}

}  // namespace commgrid::cli
