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
// ascending position order; with index_topk or fewer keys every key is kept (an empty
// list), as the reference does.
#pragma once
#include <cstdint>

#include "model/mla_attention.hpp"
#include "model/model_spec.hpp"
#include "model/weights.hpp"

namespace colibri {

class KvCache;

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

  // For n queries at positions [pos0, pos0 + n): writes this layer's indexer keys (KV
  // plane 1) and the selection of every query. h: [n][hidden]; q_latent: [n][q_lora].
  void select(const AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t pos0, int64_t n, const float* h,
              const float* q_latent, KeySelection& out);

 private:
  const ModelSpec& s_;
  DsaWeights w_;
};

}  // namespace colibri
