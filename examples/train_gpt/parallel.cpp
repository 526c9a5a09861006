#include "parallel.hpp"

#include <cstdint>

namespace train_gpt {

using commgrid::Communicator;
using commgrid::ReduceOp;

ModelParallel::ModelParallel(const commgrid::ModelCommProcessGroups& groups, bool sequence_parallel)
    : tp_(&*groups.tp()), cp_(&*groups.cp()), pp_(&*groups.pp()), mp_(&*groups.mp()),
      embd_(groups.embd().get()), pos_embd_(groups.pos_embd().get()), tp_size_(tp_->size()),
      tp_rank_(tp_->rank()), cp_size_(cp_->size()), cp_rank_(cp_->rank()), pp_size_(pp_->size()),
      pp_rank_(pp_->rank()), sequence_parallel_(sequence_parallel) {
  // hcp, when the layout has it, replaces the one cp gather by one gather per level. A
  // collection built by hand may leave it unset: then cp is gathered in one call.
  if (groups.is_set("hcp") && groups.hcp().has_group())
    for (const auto& h : groups.hcp().handles()) cp_levels_.push_back(h.get());
  else cp_levels_.push_back(cp_);
  // Which cp rank each gathered block comes from: gather the global ranks the same way.
  std::vector<std::int64_t> ids{cp_->global_rank(cp_rank_)};
  for (Communicator* level : cp_levels_) {
    std::vector<std::int64_t> next(ids.size() * static_cast<std::size_t>(level->size()));
    level->allgather(std::span<const std::int64_t>(ids), std::span<std::int64_t>(next))->wait();
    ids = std::move(next);
  }
  for (std::int64_t g : ids) block_owner_.push_back(cp_->group_rank(g));
}

Mat ModelParallel::copy_to_tp(const Mat& x) const {
  if (!sequence_parallel_ || tp_size_ == 1) return x;
  Mat full(x.rows() * tp_size_, x.cols());
  tp_->allgather(elements(x), elements(full))->wait();
  return full;
}

Mat ModelParallel::copy_to_tp_backward(const Mat& dx_partial) const {
  if (tp_size_ == 1) return dx_partial;
  if (!sequence_parallel_) {
    Mat sum = dx_partial;
    tp_->allreduce(elements(sum), ReduceOp::sum)->wait();
    return sum;
  }
  Mat part(dx_partial.rows() / tp_size_, dx_partial.cols());
  tp_->reduce_scatter(elements(dx_partial), elements(part), ReduceOp::sum)->wait();
  return part;
}

Mat ModelParallel::reduce_from_tp(const Mat& partial) const { return copy_to_tp_backward(partial); }

Mat ModelParallel::reduce_from_tp_backward(const Mat& dy) const { return copy_to_tp(dy); }

Mat ModelParallel::gather_cp(const Mat& local) const {
  if (cp_size_ == 1) return local;
  Mat buf = local;
  for (Communicator* level : cp_levels_) {
    Mat next(buf.rows() * level->size(), buf.cols());
    level->allgather(elements(buf), elements(next))->wait();
    buf = std::move(next);
  }
  return buf;
}

Mat ModelParallel::reduce_scatter_cp(const Mat& full) const {
  if (cp_size_ == 1) return full;
  Mat buf = full;
  for (auto it = cp_levels_.rbegin(); it != cp_levels_.rend(); ++it) {
    Mat part(buf.rows() / (*it)->size(), buf.cols());
    (*it)->reduce_scatter(elements(buf), elements(part), ReduceOp::sum)->wait();
    buf = std::move(part);
  }
  return buf;
}

std::vector<int> ModelParallel::positions_of(int r, int seq) const {
  std::vector<int> pos;
  if (cp_size_ == 1) {
    for (int j = 0; j < seq; ++j) pos.push_back(j);
    return pos;
  }
  const int chunk = seq / (2 * cp_size_);
  pos.reserve(static_cast<std::size_t>(2 * chunk));
  for (int c : {r, 2 * cp_size_ - 1 - r})
    for (int j = 0; j < chunk; ++j) pos.push_back(c * chunk + j);
  return pos;
}

}  // namespace train_gpt
