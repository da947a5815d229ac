// Grouped-query attention (Llama, Qwen, Mixtral, OLMoE ...): q/k/v projections (+ bias),
// optional QK-norm, RoPE, KV-cache append, causal softmax attention (optionally over a
// sliding window, with a sink logit per head), output projection (+ bias).
// n_heads query heads share n_kv_heads key/value heads in groups of n_heads / n_kv_heads.
// A sliding layer may override the KV heads, the RoPE frequencies and whether it has sinks
// (ModelSpec's sliding_* fields; MiMo-V2-Flash), and value heads may be narrower than
// query/key heads (v_head_dim).
#pragma once
#include <vector>

#include "model/attention_layer.hpp"

namespace colibri {

struct GqaWeights {
  const Tensor* q = nullptr;       // (n_heads * head_dim, hidden)
  const Tensor* k = nullptr;       // (n_kv_heads * head_dim, hidden)
  const Tensor* v = nullptr;       // (n_kv_heads * v_dim, hidden)
  const Tensor* o = nullptr;       // (hidden, n_heads * v_dim)
  const Tensor* q_bias = nullptr;  // attention_bias only
  const Tensor* k_bias = nullptr;
  const Tensor* v_bias = nullptr;
  const Tensor* q_norm = nullptr;  // qk_norm only: (head_dim,) per head or (n * head_dim,) full
  const Tensor* k_norm = nullptr;
  const Tensor* sinks = nullptr;   // attention_sinks only: (n_heads,)
  const Tensor* o_bias = nullptr;  // attention_out_bias only: (hidden,)
  const Tensor* gate = nullptr;    // attention_output_gate only: (n_heads * v_dim, hidden)
};

class GqaAttention final : public AttentionLayer {
 public:
  // `layer` picks the sliding window (spec.sliding_layers) and the sliding overrides.
  GqaAttention(const ModelSpec& spec, GqaWeights weights, int64_t layer);

  // blk.{layer}.attn_{q,k,v,output}[.bias], attn_{q,k}_norm, attn_sinks, checked against
  // the spec.
  static GqaWeights resolve(const ModelSpec& spec, const WeightStore& store, int64_t layer);

  KvLayerLayout kv_layout() const override;
  void forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv, int64_t layer,
               float* out) override;
  // q, k, v and the output projection over every segment's rows at once (each weight read
  // once per step); RoPE, the cache append and the attention itself per segment.
  void forward_segments(AttentionContext& ctx, const float* x, const std::vector<AttnSegment>& segs,
                        int64_t layer, int64_t hidden, float* out) override;

 private:
  void store_row(AttentionScratch& ws, int64_t t, int64_t pos, KvCache& kv, int64_t layer);
  void attend(AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t t0, int64_t pos0, int64_t n);
  void apply_output_gate(AttentionContext& ctx, const float* x, int64_t n, int64_t qd);

  GqaWeights w_;
  int64_t hidden_, n_heads_, n_kv_heads_, head_dim_, v_dim_;
  QkNorm qk_norm_;
  float eps_;
  float scale_;                    // softmax scale
  int64_t window_;                 // this layer's sliding window (0: none)
  std::vector<float> rope_inv_freq_;
  float rope_factor_;
  float v_scale_;                  // attention_value_scale (1: none)
};

// Whether `layer` is a sliding-window layer, its KV heads and its value head size.
bool gqa_sliding(const ModelSpec& spec, int64_t layer);
int64_t gqa_kv_heads(const ModelSpec& spec, int64_t layer);
int64_t gqa_v_dim(const ModelSpec& spec);

}  // namespace colibri
