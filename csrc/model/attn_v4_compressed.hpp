// DeepSeek-V4's compressed layers: the sliding-window branch of attn_v4.hpp (its queries,
// key-value rows and output, with the "compress" RoPE), whose queries also attend to
// compressed entries of the whole past (model/v4_compressor.hpp), in one softmax with the
// window's keys and the sink:
//  - heavily compressed attention (HCA, "heavily_compressed_attention"): one entry per
//    `rate` positions; a query at position p sees every entry whose window has closed,
//    w < (p + 1) / rate;
//  - compressed sparse attention (CSA, "compressed_sparse_attention"): overlapping entries
//    (2 * rate positions, stride rate) and a lightning indexer with its own overlapping
//    compressor at index_head_dim: for a query at p, iq = indexer.attn_q_b(q latent)
//    (index_n_heads heads, "compress" RoPE at p), w_h = indexer.proj(x)_h / sqrt(heads),
//    score_s = sum_h w_h * relu(iq_h . ik_s) / sqrt(index_head_dim) over the closed
//    entries s; the query attends to the index_topk best (ties to the lower entry), all of
//    them when there are no more than index_topk.
// An entry is the same key and value (K = V, as the window's rows).
//
// State (kv_cache.hpp, KvLayerLayout::comp_rate): the compressors' pending projections and
// every entry so far, F32, in the layer's state, with the count of positions consumed. A
// forward must start where the state ends; the session replays its tokens otherwise (after
// a rollback, an import, a copy: Session::replay_state).
#pragma once
#include <memory>

#include "model/attn_v4.hpp"
#include "model/v4_compressor.hpp"

namespace colibri {

class V4CompressedAttention final : public V4SlidingAttention {
 public:
  // blk.{layer}.attn_compressor_{kv,gate,ape,norm}; a CSA layer also
  // blk.{layer}.indexer_compressor_{kv,gate,ape,norm}, blk.{layer}.indexer.attn_q_b
  // (heads * index_head_dim, q_lora_rank) and blk.{layer}.indexer.proj (heads, hidden).
  V4CompressedAttention(const ModelSpec& spec, const WeightStore& weights, int64_t layer);

  KvLayerLayout kv_layout() const override;
  void forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv, int64_t layer,
               float* out) override;

 private:
  // The entries each of the n queries at positions pos0.. attends to (ws.v4c_sel).
  void select(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, const float* entries);
  // Queries [t0, t0 + n) at positions pos0.. over their window and their entries.
  void attend(AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t t0, int64_t pos0, int64_t n,
              const float* entries);

  int64_t rate_;
  bool csa_;
  std::unique_ptr<V4Compressor> comp_, index_comp_;
  const Tensor *index_q_b_ = nullptr, *index_proj_ = nullptr;
  int64_t index_heads_ = 0, index_dim_ = 0, index_topk_ = 0;
  int64_t entry_floats_;  // one entry's values in the state: head_dim (+ index_head_dim)
};

}  // namespace colibri
