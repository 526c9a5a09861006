// What the model learns about the layout from ModelCommProcessGroups, and the tensor,
// sequence and context parallel communication of its layers.
#pragma once

#include <commgrid/commgrid.hpp>
#include <vector>

#include "tensor.hpp"

namespace train_gpt {

/// The model-parallel groups of one rank and the operations over them. Built from the
/// collection alone: sizes and ranks are the groups' own, and the order of the context
/// parallel blocks comes from the members of the hcp (or cp) groups.
class ModelParallel {
 public:
  /// Reads tp, cp, pp, mp, embd, pos_embd (UnsetFieldError if one was not set) and hcp
  /// (optional) from the collection. Collective over cp (and hcp): exchanges the members'
  /// global ranks once to learn the order of gathered blocks.
  ModelParallel(const commgrid::ModelCommProcessGroups& groups, bool sequence_parallel);

  commgrid::Communicator& tp() const { return *tp_; }
  commgrid::Communicator& cp() const { return *cp_; }
  commgrid::Communicator& pp() const { return *pp_; }
  commgrid::Communicator& mp() const { return *mp_; }
  /// nullptr on a rank that is in no embd / pos_embd group (a middle stage).
  commgrid::Communicator* embd() const { return embd_; }
  commgrid::Communicator* pos_embd() const { return pos_embd_; }

  int tp_size() const { return tp_size_; }
  int tp_rank() const { return tp_rank_; }
  int cp_size() const { return cp_size_; }
  int cp_rank() const { return cp_rank_; }
  int pp_size() const { return pp_size_; }
  /// The pipeline stage: the rank in pp, whose members are ascending along the pp axis.
  int pp_rank() const { return pp_rank_; }
  bool sequence_parallel() const { return sequence_parallel_; }

  // ---- tensor parallel regions (Megatron's mappings) ----------------------------
  // Rows are tokens in sequence-major order, so a contiguous block of rows is a slice of
  // the sequence: with sequence parallelism, tp rank r holds block r.
  /// Entering a column-parallel layer: identity, or allgather over tp with sequence
  /// parallelism.
  Mat copy_to_tp(const Mat& x) const;
  /// Its backward: allreduce of the partial input gradient over tp, or reduce-scatter with
  /// sequence parallelism.
  Mat copy_to_tp_backward(const Mat& dx_partial) const;
  /// Leaving a row-parallel layer: allreduce of the partial sums over tp, or
  /// reduce-scatter with sequence parallelism.
  Mat reduce_from_tp(const Mat& partial) const;
  /// Its backward: identity, or allgather over tp with sequence parallelism.
  Mat reduce_from_tp_backward(const Mat& dy) const;

  // ---- context parallel -----------------------------------------------------------
  /// Allgathers this rank's rows over cp, level by level through hcp when it has levels.
  /// The result holds cp_size() blocks of local.rows() rows, block t from cp rank
  /// cp_block_owner()[t].
  Mat gather_cp(const Mat& local) const;
  /// The backward of gather_cp: reduce-scatters (sums) a gradient of the gathered shape
  /// back to the owners, level by level in reverse.
  Mat reduce_scatter_cp(const Mat& full) const;
  /// The cp rank whose rows each block of gather_cp holds.
  const std::vector<int>& cp_block_owner() const { return block_owner_; }
  /// Global sequence positions held by cp rank `r` for a sequence of `seq` tokens: the
  /// sequence cut into 2*cp chunks, rank r holding chunks r and 2cp-1-r (load balance of
  /// causal attention).
  std::vector<int> positions_of(int r, int seq) const;

 private:
  commgrid::Communicator* tp_;
  commgrid::Communicator* cp_;
  commgrid::Communicator* pp_;
  commgrid::Communicator* mp_;
  commgrid::Communicator* embd_;
  commgrid::Communicator* pos_embd_;
  std::vector<commgrid::Communicator*> cp_levels_;
  std::vector<int> block_owner_;
  int tp_size_, tp_rank_, cp_size_, cp_rank_, pp_size_, pp_rank_;
  bool sequence_parallel_;
};

}  // namespace train_gpt
