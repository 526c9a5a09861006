#include "schedule.hpp"

#include <algorithm>
#include <deque>
#include <memory>

namespace train_gpt {

using commgrid::P2POp;
using commgrid::Work;

std::vector<ScheduleOp> pipeline_schedule(int pp, int stage, int vpp, int micro_batches) {
  std::vector<ScheduleOp> ops;
  const int total = micro_batches * vpp;
  // Virtual micro-batch k -> (chunk, micro-batch): groups of pp micro-batches go through
  // chunk 0, then chunk 1, ...; backward visits the chunks in reverse.
  auto op = [&](int k, bool forward) {
    const int group = k / (pp * vpp);
    const int in_group = k % (pp * vpp);
    int v = in_group / pp;
    if (!forward) v = vpp - 1 - v;
    return ScheduleOp{forward, v, group * pp + in_group % pp};
  };
  int warmup;
  if (vpp == 1) warmup = std::min(pp - stage - 1, micro_batches);
  else if (micro_batches == pp)
    warmup = total;  // all forwards first, as Megatron does when M == pp
  else warmup = std::min((pp - stage - 1) * 2 + (vpp - 1) * pp, total);
  for (int k = 0; k < warmup; ++k) ops.push_back(op(k, true));
  const int steady = total - warmup;
  for (int k = 0; k < steady; ++k) {
    ops.push_back(op(warmup + k, true));
    ops.push_back(op(k, false));
  }
  for (int k = steady; k < total; ++k) ops.push_back(op(k, false));
  return ops;
}

namespace {

/// Sends in flight: the buffer must live until the send completes.
struct PendingSend {
  std::unique_ptr<Mat> buffer;
  std::unique_ptr<Work> work;
};

}  // namespace

double run_pipeline(GptModel& model, const ModelParallel& mp, const DataLoader& data, int step,
                    int micro_batches, int vpp, double loss_scale) {
  const int pp = mp.pp_size();
  const int num_chunks = pp * vpp;
  const int next = (mp.pp_rank() + 1) % pp;
  const int prev = (mp.pp_rank() + pp - 1) % pp;
  // A tag per (receiving chunk, micro-batch, direction): unique within a step, so that
  // messages that arrive early are matched to the right pass.
  auto tag = [&](int chunk, int m, bool forward) {
    return 2 * (chunk * micro_batches + m) + (forward ? 0 : 1);
  };

  std::deque<PendingSend> sends;
  // Sends are posted and left in flight (completed at the end of the step): a stage never
  // waits for its successor to take an activation, only for the inputs it needs, so any
  // valid schedule order runs without deadlock, whatever the backend's send semantics.
  auto send = [&](Mat m, int peer, int t) {
    PendingSend s{std::make_unique<Mat>(std::move(m)), nullptr};
    const P2POp op = P2POp::send(elements(*s.buffer), peer, t);
    s.work = mp.pp().batch_isend_irecv(std::span<const P2POp>(&op, 1));
    sends.push_back(std::move(s));
  };
  auto recv = [&](Eigen::Index rows, Eigen::Index cols, int peer, int t) {
    Mat m(rows, cols);
    const P2POp op = P2POp::recv(elements(m), peer, t);
    mp.pp().batch_isend_irecv(std::span<const P2POp>(&op, 1))->wait();
    return m;
  };

  double loss = 0;
  Eigen::Index rows = 0;
  for (const ScheduleOp& op : pipeline_schedule(pp, mp.pp_rank(), vpp, micro_batches)) {
    ModelChunk& chunk = model.chunk(op.vstage);
    const int c = chunk.index();
    const MicroBatch mb = data.get(step, op.micro_batch);
    if (rows == 0) {
      // Activations between chunks: this rank's rows (its sequence slice with sequence
      // parallelism) by hidden.
      rows = mb.rows.rows() / (mp.sequence_parallel() ? mp.tp_size() : 1);
    }
    if (op.forward) {
      Mat input;
      if (c > 0) input = recv(rows, data.hidden(), prev, tag(c, op.micro_batch, true));
      Mat out = chunk.forward(op.micro_batch, mb, input, loss);
      if (c < num_chunks - 1) send(std::move(out), next, tag(c + 1, op.micro_batch, true));
    } else {
      Mat grad;
      if (c < num_chunks - 1) grad = recv(rows, data.hidden(), next, tag(c, op.micro_batch, false));
      Mat d = chunk.backward(op.micro_batch, grad, loss_scale);
      if (c > 0) send(std::move(d), prev, tag(c - 1, op.micro_batch, false));
    }
  }
  for (PendingSend& s : sends) s.work->wait();
  return loss;
}

}  // namespace train_gpt
