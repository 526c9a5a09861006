// commgrid: the whole public API this build has, in one include.
//
//   #include <commgrid/commgrid.hpp>
//
// brings the layout (ParallelConfig, Layout, RankGrid, topology, HyperGrid), the runtime
// (the Communicator contract, ProcessGroups and the collections) and, where the program
// links them, the bootstrap (launchers, stores, rank-threads), resilience (recovery and the
// resilient driver) and every backend this build
// of commgrid was compiled with (see commgrid/backends.hpp): MPI (commgrid::mpi), Gloo
// (commgrid::gloo: make_gloo_world, make_gloo_world_from_env for a launched process, and the
// rank-threads runner) and NCCL (commgrid::nccl). The world factories are make_mpi_world,
// make_gloo_world, make_gloo_world_from_env and make_nccl_world.
// A part is included when its header is visible to the program: in the build tree when
// the program links that part's target; in an install, always (the MPI part also needs
// <mpi.h>, which linking commgrid::mpi provides).
#pragma once

#include "commgrid/backends.hpp"

// Layout (commgrid::layout).
#include "commgrid/config.hpp"
#include "commgrid/creation_order.hpp"
#include "commgrid/error.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/hyper_grid.hpp"
#include "commgrid/layout.hpp"
#include "commgrid/rank_grid.hpp"
#include "commgrid/rank_map.hpp"
#include "commgrid/topology.hpp"

// Runtime (commgrid::runtime).
#include "commgrid/collections.hpp"
#include "commgrid/communicator.hpp"
#include "commgrid/hyper_grid_groups.hpp"
#include "commgrid/process_group_collection.hpp"
#include "commgrid/process_groups.hpp"

// Bootstrap (commgrid::bootstrap).
#if __has_include("commgrid/store.hpp")
#include "commgrid/launch_info.hpp"
#include "commgrid/rank_threads.hpp"
#include "commgrid/store.hpp"
#endif

// Resilience (commgrid::resilience).
#if __has_include("commgrid/recovery.hpp")
#include "commgrid/recovery.hpp"
#include "commgrid/resilience_keys.hpp"
#include "commgrid/resilient_driver.hpp"
#include "commgrid/state_provider.hpp"
#endif

// Backends.
#if COMMGRID_HAS_MPI && __has_include("commgrid/mpi.hpp") && __has_include(<mpi.h>)
#include "commgrid/mpi.hpp"
#endif
#if COMMGRID_HAS_GLOO && __has_include("commgrid/gloo.hpp")
#include "commgrid/gloo.hpp"
#include "commgrid/local_ranks.hpp"
#endif
#if COMMGRID_HAS_NCCL && __has_include("commgrid/nccl.hpp")
#include "commgrid/nccl.hpp"
#endif

// World (commgrid::world): make_world, this process's world from whichever launcher started it.
#if __has_include("commgrid/world.hpp")
#include "commgrid/world.hpp"
#endif
