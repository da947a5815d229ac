// The DSA lightning indexer (DeepSeek-V3.2, GLM-5): per query, the index_topk past keys its
// attention reads.
//
//   iq[h] = indexer.attn_q_b(q_latent)        [index_heads][index_dim]  (q_latent: the
//                                             normed q-LoRA latent of the MLA layer)
//   ik    = LayerNorm(indexer.attn_k(x))      [index_dim], cached per position (eps 1e-6)
//   RoPE on the first qk_rope_head_dim values of iq[h] and ik (interleaved for GLM-5,
//   half-split for DeepSeek-V3.2)
//   w[h]  = indexer.proj(x)[h] / sqrt(index_heads)
//   score_j = sum_h w[h] * relu(iq[h] . ik_j / sqrt(index_dim))
//
// The keys with the index_topk highest scores are kept (ties: the lower position), in
// ascending position order; with index_topk or fewer keys every key is kept, as the
// reference does. The selection is written in the attention kernels' sparse form
// (AttentionScratch::dsa_keys / dsa_offsets) for this layer and the "shared" ones after it.
#pragma once
#include <cstdint>

#include "model/attention_layer.hpp"

namespace colibri {

struct DsaWeights {
  const Tensor* q_b = nullptr;     // (index_heads*index_dim, q_lora)
  const Tensor* k = nullptr;       // (index_dim, hidden)
  const Tensor* k_norm = nullptr;  // (index_dim)
  const Tensor* k_norm_bias = nullptr;
  const Tensor* proj = nullptr;    // (index_heads, hidden)
};

class DsaIndexer {
 public:
  DsaIndexer(const ModelSpec& spec, const WeightStore& weights, int64_t layer);

  // For n queries at positions [pos0, pos0 + n): writes this layer's indexer keys (the V
  // side of its KV rows) and every query's selection. x: [n][hidden]; q_latent: [n][q_lora].
  void select(AttentionContext& ctx, const float* x, const float* q_latent, int64_t n, int64_t pos0, KvCache& kv,
              int64_t layer);

 private:
  const ModelSpec& s_;
  DsaWeights w_;
};

}  // namespace colibri
