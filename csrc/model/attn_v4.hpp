// DeepSeek-V4's sliding-window attention ("sliding_attention" layers; the CSA / HCA layers
// add compressed keys to this branch: attn_v4_compressed.hpp, which derives from it): a q-LoRA query (latent,
// RMSNorm, up-projection, then an RMSNorm without weight over each head), one shared
// key-value head (K = V: one projection, RMSNorm, RoPE), partial interleaved RoPE on the
// trailing qk_rope_head_dim values of each head, a learned sink logit per head, a window of
// sliding_window positions (the query's own included), the rotation undone on each head's
// output (RoPE at minus the query's position, since the values carried it), and the grouped
// output projection: o_groups groups of heads each projected to o_lora_rank values
// (attn_output_a, one block of rows per group), then mixed to hidden (attn_output_b).
#pragma once
#include <vector>

#include "model/attention_layer.hpp"

namespace colibri {

struct V4AttnWeights {
  const Tensor* q_a = nullptr;       // (q_lora_rank, hidden)
  const Tensor* q_a_norm = nullptr;  // (q_lora_rank,)
  const Tensor* q_b = nullptr;       // (n_heads * head_dim, q_lora_rank)
  const Tensor* kv = nullptr;        // (head_dim, hidden)
  const Tensor* kv_norm = nullptr;   // (head_dim,)
  const Tensor* o_a = nullptr;       // (o_groups * o_lora_rank, n_heads * head_dim / o_groups)
  const Tensor* o_b = nullptr;       // (hidden, o_groups * o_lora_rank)
  const Tensor* sinks = nullptr;     // (n_heads,)
};

class V4SlidingAttention : public AttentionLayer {
 public:
  // blk.{layer}.attn_{q_a,q_a_norm,q_b,kv,kv_norm,output_a,output_b,sinks}, checked
  // against the spec.
  V4SlidingAttention(const ModelSpec& spec, const WeightStore& weights, int64_t layer);

  // One head of head_dim values (K = V), a ring of the window's positions.
  KvLayerLayout kv_layout() const override;
  void forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv, int64_t layer,
               float* out) override;

 protected:
  // The pieces a compressed layer reuses: the projections (ws.mla_qa: the normed q latent,
  // ws.q: the queries, ws.k: the key-value rows, both normed and rotated), and the output
  // (the rotation undone on ws.attn, the grouped projection to out).
  void project(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0);
  void project_out(AttentionContext& ctx, int64_t n, int64_t pos0, float* out);

  V4AttnWeights w_;
  int64_t hidden_, n_heads_, head_dim_, rope_dim_, q_lora_, groups_, group_rank_, window_;
  float eps_, scale_;
  std::vector<float> rope_inv_freq_;  // "main" RoPE, or "compress" on a compressed layer
  float rope_factor_;

 private:
  void attend(AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t t0, int64_t pos0, int64_t n);
};

}  // namespace colibri
