// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash, GLM-5), in the
// absorbed form for every token, prefill and decode alike:
//
//   q      = q_b(rmsnorm(q_a(x)))  (q-LoRA)  or  attn_q(x)        [heads][nope | rope]
//   [c|kr] = kv_a_mqa(x); c = rmsnorm(c); kr, q_rope get RoPE         latent + shared rope key
//   cache  <- [c | kr]                      (kv_lora_rank + qk_rope_head_dim per token)
//   q_abs  = W_UK^T q_nope  (attn_k_b)      the key up-projection folded into the query
//   score  = (q_abs . c_j + q_rope . kr_j) * scale,   softmax over the keys
//   o_h    = W_UV (sum_j p_j c_j)  (attn_v_b), out = attn_output(o)
//
// which equals the expanded form (k_j = [W_UK c_j | kr_j], v_j = W_UV c_j) up to summation
// order. One form for prefill and decode keeps a prompt processed at once bit-identical to
// the same prompt fed token by token (docs/deepseek.md); absorbed attention reads one
// row of 576 values per key for DeepSeek-V3 instead of 128 heads x 256. The attention itself
// is the kernels' MQA case (attention/attention.hpp): one KV "head", every query head in its
// group, key dim kv_lora + rope, value dim kv_lora (a prefix of the key row).
//
// KV layout: K = [c | kr] (one row of kv_lora_rank + qk_rope_head_dim); on a layer that runs
// its own DSA indexer (dsa_indexer.hpp), V = the indexer's key (index_head_dim), else none.
// With an indexer each query attends only to the positions the layer's (or, on a "shared"
// layer, the last full layer's) selection lists.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/attention_layer.hpp"

namespace colibri {

class DsaIndexer;

struct MlaWeights {
  const Tensor* q = nullptr;         // without q-LoRA: (heads*qk, hidden)
  const Tensor* q_a = nullptr;       // with q-LoRA: (q_lora, hidden)
  const Tensor* q_a_norm = nullptr;  // (q_lora)
  const Tensor* q_b = nullptr;       // (heads*qk, q_lora)
  const Tensor* kv_a = nullptr;      // (kv_lora + rope, hidden)
  const Tensor* kv_a_norm = nullptr; // (kv_lora)
  const Tensor* k_b = nullptr;       // (heads*kv_lora, nope): W_UK^T per head
  const Tensor* v_b = nullptr;       // (heads*v, kv_lora): W_UV per head
  const Tensor* o = nullptr;         // (hidden, heads*v)
};

class MlaAttention final : public AttentionLayer {
 public:
  // Resolves blk.{layer}.* and checks every shape against the spec (Error(Format) naming
  // the tensor). The layer runs its own indexer when the spec has one and marks the layer
  // full (indexer_full; multi-token-prediction layers always do).
  MlaAttention(const ModelSpec& spec, const WeightStore& weights, int64_t layer);
  ~MlaAttention() override;

  KvLayerLayout kv_layout() const override;
  void forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv, int64_t layer,
               float* out) override;

 private:
  void project(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv, int64_t layer);

  const ModelSpec& s_;
  MlaWeights w_;
  std::unique_ptr<DsaIndexer> indexer_;  // a full DSA layer
  bool sparse_ = false;                  // the model has DSA: attend to the selection
};

// y[t][h] = W_h x[t][h] for every token t and head h, W_h the rows [h*R, (h+1)*R) of w
// (R = w.rows / n_heads): one parallel region over the heads, each head's product computed
// by one member with the regular matmul kernels. Strides are in floats.
void head_matmul(AttentionContext& ctx, const WeightView& w, int64_t n_heads, const float* x,
                 int64_t x_token_stride, int64_t x_head_stride, int64_t n, float* y, int64_t y_token_stride,
                 int64_t y_head_stride);

}  // namespace colibri
