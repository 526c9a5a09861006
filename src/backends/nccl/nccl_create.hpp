// Making NCCL communicators: from a unique id (a world, a member-only group) or as the child
// of a parent (ncclCommSplit, ncclCommShrink), each bounded by a timeout. Private to the
// backend.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nccl_cuda.hpp"
#include "nccl_host.hpp"
#include "nccl_state.hpp"
#include "nccl_types.hpp"

namespace commgrid::nccl_backend {

/// A new NCCL unique id; BackendError with NCCL's text.
nccl_host::UniqueId make_unique_id();

// Initializes one NCCL communicator from a unique id, nonblocking, polled until the
// deadline; on timeout aborts it and throws TimeoutError naming the group and members. The
// caller keeps `cfg` (its name) for as long as the returned communicator lives.
OwnedComm init_comm(int nranks, const nccl_host::UniqueId& id, int rank, int device,
                    const std::string& op, const std::string& parent,
                    const nccl_backend::CommConfig& cfg, Ms timeout,
                    const std::vector<std::int64_t>& members);

// The state of a communicator made from `parent`; it owns `comm` (aborted if this throws)
// and the name NCCL was given.
std::shared_ptr<State> new_state(OwnedComm comm, const State& parent, const std::string& name,
                                 std::shared_ptr<const std::string> nccl_name);

// Starts a child's creation on its parent (into `slot`) and returns NCCL's result.
using ChildCall = std::function<ncclResult_t(ncclComm_t parent, ncclComm_t* slot)>;

// Waits for a child that `call(parent, &slot)` makes from `s` (ncclCommSplit, ncclCommShrink):
// NCCL runs it as a job of the parent and writes the child into `slot` from that job's thread
// when the job ends, failed or not (NCCL 2.28 init.cc, ncclCommInitRankFunc; ncclCommShrink
// goes through the same ncclCommInitChildComm as ncclCommSplit). Until the job is known to
// have ended, every way out of here aborts the parent, which joins the job (ncclCommAbort
// waits for it), so that NCCL never writes into a slot that is gone; and a child NCCL wrote
// is aborted unless it is returned. Returns the child, initialized (nullptr when NCCL gave
// this rank none: a split without color). `target` names the child in messages.
// With `stopping` the parent was stop()ped (a shrink: nobody else may use it, and its pending
// operations report it aborted): it is called and polled through use_stopping().
OwnedComm make_child(State& s, const std::string& op, const std::string& target,
                     const std::string& child_name, Ms timeout, bool stopping,
                     const ChildCall& call);

}  // namespace commgrid::nccl_backend
