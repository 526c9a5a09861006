// The NCCL backend's Communicator object: adoption of a state, and what it answers
// without NCCL work (rank, size, device, stream, abort).
#include "commgrid/nccl.hpp"
#include "nccl_state.hpp"

namespace commgrid {

using nccl_backend::Ms;

NcclCommunicator::NcclCommunicator(std::string name, std::shared_ptr<State> state, Ms timeout)
    : Communicator(std::move(name), timeout), state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() = default;

std::unique_ptr<NcclCommunicator> NcclCommunicator::adopt(std::shared_ptr<State> state, Ms timeout,
                                                          std::vector<std::int64_t> members) {
  std::string name = state->name;
  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(std::move(name), std::move(state), timeout));
  if (!members.empty()) {
    c->state_->members = members;
    c->set_members(std::move(members));
  }
  return c;
}

Rank NcclCommunicator::rank() const noexcept { return state_->rank; }
Rank NcclCommunicator::size() const noexcept { return state_->size; }
void NcclCommunicator::timeout_changed(Ms timeout) { state_->timeout = timeout; }
int NcclCommunicator::device() const noexcept { return state_->device; }
CUstream_st* NcclCommunicator::stream() const noexcept { return state_->stream; }
void NcclCommunicator::set_stream(CUstream_st* stream) noexcept {
  state_->stream = stream != nullptr ? stream : state_->own_stream;
}
ncclComm* NcclCommunicator::native() const noexcept { return state_->native(); }
bool NcclCommunicator::aborted() const noexcept { return state_->is_aborted(); }
std::string NcclCommunicator::abort_reason() const { return state_->reason(); }
void NcclCommunicator::abort(const std::string& reason) noexcept { state_->abort(reason); }

}  // namespace commgrid
