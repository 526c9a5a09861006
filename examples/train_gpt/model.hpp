// The GPT: transformer blocks grouped into model chunks. Pipeline stage p holds chunks
// p, p + pp, ..., p + (vpp-1) pp (Megatron's interleaved assignment; one chunk without
// vpp). Chunk 0 starts with the embedding, the last chunk ends with the loss head.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data.hpp"
#include "layers.hpp"
#include "mlp.hpp"
#include "model_config.hpp"
#include "parallel.hpp"

namespace train_gpt {

/// Makes the MLP of layer `layer` (named `name`): the dense MLP, or an MoE layer.
using MlpFactory = std::function<std::unique_ptr<Mlp>(int layer, const std::string& name)>;

/// The dense MLP for every layer.
MlpFactory dense_mlp_factory(const ModelConfig& config, const ModelParallel& mp);

/// Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(.)).
class Block {
 public:
  struct Cache {
    LayerNorm::Cache norm1, norm2;
    Attention::Cache attn;
    std::unique_ptr<Mlp::Cache> mlp;
  };
  Block(int layer, const ModelConfig& config, const ModelParallel& mp, std::unique_ptr<Mlp> mlp);
  Mat forward(const Mat& x, const TokenRows& rows, Cache& cache) const;
  Mat backward(const Mat& dy, const TokenRows& rows, const Cache& cache);
  void collect(std::vector<Param*>& out);
  const Mlp& mlp() const { return *mlp_; }

 private:
  LayerNorm norm1_, norm2_;
  Attention attn_;
  std::unique_ptr<Mlp> mlp_;
};

/// One model chunk: its blocks, with the embedding on chunk 0 and the loss head on the
/// last chunk. Keeps each micro-batch's activations from forward until its backward.
class ModelChunk {
 public:
  /// `tied_word`: the word embedding when this rank also holds chunk 0 and this is the
  /// last chunk (one parameter serves both); nullptr otherwise.
  ModelChunk(const ModelConfig& config, const ModelParallel& mp, int chunk, int num_chunks,
             Param* tied_word, const MlpFactory& make_mlp);
  bool is_first() const { return embedding_ != nullptr; }
  bool is_last() const { return head_ != nullptr; }
  int index() const { return chunk_; }
  /// The first chunk embeds mb.tokens (input unused); the others take the previous
  /// chunk's output. Returns this chunk's output, or (last chunk) an empty matrix after
  /// adding the sum of the cross-entropy over this rank's rows to loss_sum.
  Mat forward(int micro_batch, const MicroBatch& mb, const Mat& input, double& loss_sum);
  /// The last chunk starts from d(loss_scale * loss sum); the others from the next
  /// chunk's input gradient. Returns the gradient of this chunk's input (empty for the
  /// first chunk) and frees the micro-batch's activations.
  Mat backward(int micro_batch, const Mat& grad, double loss_scale);
  void collect(std::vector<Param*>& out);
  Embedding* embedding() { return embedding_.get(); }

 private:
  struct Cache {
    TokenRows rows;
    Embedding::Cache embedding;
    std::vector<Block::Cache> blocks;
    LossHead::Cache head;
  };
  int chunk_;
  std::unique_ptr<Embedding> embedding_;
  std::vector<Block> blocks_;
  std::unique_ptr<LossHead> head_;
  std::map<int, Cache> caches_;
};

/// This rank's chunks of the model, virtual stage v at index v.
class GptModel {
 public:
  /// Layers must divide by pp * vpp, heads and vocab by tp (checked by the caller).
  GptModel(const ModelConfig& config, const ModelParallel& mp, int vpp,
           const MlpFactory& make_mlp = {});
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  ModelChunk& chunk(int v) { return *chunks_[static_cast<std::size_t>(v)]; }
  /// Every parameter of this rank, in a fixed order (chunk, then layer, then name).
  std::vector<Param*> params();
  void zero_grad();

 private:
  std::vector<std::unique_ptr<ModelChunk>> chunks_;
};

}  // namespace train_gpt
