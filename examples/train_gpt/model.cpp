#include "model.hpp"

namespace train_gpt {

MlpFactory dense_mlp_factory(const ModelConfig& config, const ModelParallel& mp) {
  return [&config, &mp](int /*layer*/, const std::string& name) -> std::unique_ptr<Mlp> {
    return std::make_unique<DenseMlp>(name, config, mp);
  };
}

Block::Block(int layer, const ModelConfig& config, const ModelParallel& mp,
             std::unique_ptr<Mlp> mlp)
    : norm1_("layers." + std::to_string(layer) + ".norm1", config.hidden, config,
             mp.sequence_parallel()),
      norm2_("layers." + std::to_string(layer) + ".norm2", config.hidden, config,
             mp.sequence_parallel()),
      attn_("layers." + std::to_string(layer) + ".attn", config, mp), mlp_(std::move(mlp)) {}

Mat Block::forward(const Mat& x, const TokenRows& rows, Cache& c) const {
  Mat h = x + attn_.forward(norm1_.forward(x, c.norm1), rows, c.attn);
  return h + mlp_->forward(norm2_.forward(h, c.norm2), c.mlp);
}

Mat Block::backward(const Mat& dy, const TokenRows& rows, const Cache& c) {
  Mat dh = dy + norm2_.backward(mlp_->backward(dy, *c.mlp), c.norm2);
  return dh + norm1_.backward(attn_.backward(dh, rows, c.attn), c.norm1);
}

void Block::collect(std::vector<Param*>& out) {
  norm1_.collect(out);
  attn_.collect(out);
  norm2_.collect(out);
  mlp_->collect(out);
}

ModelChunk::ModelChunk(const ModelConfig& config, const ModelParallel& mp, int chunk,
                       int num_chunks, Param* tied_word, const MlpFactory& make_mlp)
    : chunk_(chunk) {
  if (chunk == 0) embedding_ = std::make_unique<Embedding>(config, mp);
  const int per_chunk = config.layers / num_chunks;
  for (int l = chunk * per_chunk; l < (chunk + 1) * per_chunk; ++l)
    blocks_.emplace_back(l, config, mp, make_mlp(l, "layers." + std::to_string(l) + ".mlp"));
  if (chunk == num_chunks - 1) {
    if (embedding_) tied_word = &embedding_->word();
    head_ = std::make_unique<LossHead>(config, mp, tied_word);
  }
}

Mat ModelChunk::forward(int micro_batch, const MicroBatch& mb, const Mat& input, double& loss_sum) {
  Cache& c = caches_[micro_batch];
  c.rows = mb.rows;
  c.blocks.resize(blocks_.size());
  Mat x = embedding_ ? embedding_->forward(mb.tokens, c.rows, c.embedding) : input;
  for (std::size_t i = 0; i < blocks_.size(); ++i) x = blocks_[i].forward(x, c.rows, c.blocks[i]);
  if (!head_) return x;
  loss_sum += head_->forward(x, mb.labels, c.head);
  return {};
}

Mat ModelChunk::backward(int micro_batch, const Mat& grad, double loss_scale) {
  auto it = caches_.find(micro_batch);
  Cache& c = it->second;
  Mat d = head_ ? head_->backward(c.head, loss_scale) : grad;
  for (std::size_t i = blocks_.size(); i-- > 0;) d = blocks_[i].backward(d, c.rows, c.blocks[i]);
  if (embedding_) {
    embedding_->backward(d, c.rows, c.embedding);
    d = Mat();
  }
  caches_.erase(it);
  return d;
}

void ModelChunk::collect(std::vector<Param*>& out) {
  if (embedding_) embedding_->collect(out);
  for (Block& b : blocks_) b.collect(out);
  if (head_) head_->collect(out);
}

GptModel::GptModel(const ModelConfig& config, const ModelParallel& mp, int vpp,
                   const MlpFactory& make_mlp) {
  const MlpFactory factory = make_mlp ? make_mlp : dense_mlp_factory(config, mp);
  const int num_chunks = mp.pp_size() * vpp;
  for (int v = 0; v < vpp; ++v) {
    const int chunk = v * mp.pp_size() + mp.pp_rank();
    // With pp = 1 the first and last chunk are on this rank: one tied parameter.
    Param* tied = (chunk == num_chunks - 1 && !chunks_.empty() && chunks_.front()->is_first())
                      ? &chunks_.front()->embedding()->word()
                      : nullptr;
    chunks_.push_back(std::make_unique<ModelChunk>(config, mp, chunk, num_chunks, tied, factory));
  }
}

std::vector<Param*> GptModel::params() {
  std::vector<Param*> out;
  for (auto& c : chunks_) c->collect(out);
  return out;
}

void GptModel::zero_grad() {
  for (Param* p : params()) p->grad.setZero();
}

}  // namespace train_gpt
