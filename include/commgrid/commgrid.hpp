// commgrid: the whole public API this build has, in one include.
//
//   #include <commgrid/commgrid.hpp>
//
// brings the layout core (ParallelConfig, Layout, RankGrid, topology), the Communicator
// interface, ProcessGroups and the two collections, and every backend this build of
// commgrid was compiled with (see commgrid/backends.hpp): MPI (commgrid::mpi), Gloo with
// its stores and rank-threads runner. The MPI declarations come with <mpi.h>, that is in
// programs that link commgrid::mpi.
#pragma once

#include "commgrid/backends.hpp"
#include "commgrid/collections.hpp"
#include "commgrid/communicator.hpp"
#include "commgrid/config.hpp"
#include "commgrid/error.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/hyper_grid.hpp"
#include "commgrid/layout.hpp"
#include "commgrid/process_group_collection.hpp"
#include "commgrid/process_groups.hpp"
#include "commgrid/rank_grid.hpp"
#include "commgrid/topology.hpp"

// The MPI part needs <mpi.h>, which a program gets by linking commgrid::mpi.
#if COMMGRID_HAS_MPI && __has_include(<mpi.h>)
#include "commgrid/mpi.hpp"
#endif
#if COMMGRID_HAS_GLOO
#include "commgrid/gloo.hpp"
#include "commgrid/local_ranks.hpp"
#include "commgrid/store.hpp"
#endif
#if COMMGRID_HAS_NCCL
#include "commgrid/nccl.hpp"
#endif
