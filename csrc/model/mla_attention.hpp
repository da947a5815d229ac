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
// the same prompt fed token by token (DESIGN.md: attention); absorbed attention reads
// 576 values per key for DeepSeek-V3 instead of 128 heads x 256.
//
// With a DSA indexer (dsa_indexer.hpp) each query attends only to the key positions the
// layer's KeySelection lists.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/matmul.hpp"
#include "model/model_spec.hpp"
#include "model/weights.hpp"

namespace colibri {

class KvCache;
class ThreadPool;
class DsaIndexer;

// Work buffers of the MLA layers (and their indexers), shared by all layers: the engine
// runs one forward at a time. Grown on demand, never shrunk.
struct MlaWorkspace {
  std::vector<float> qa, q, kva, qrow, lat, heads, scores;
  std::vector<float> iq, ik, iw, iscores;        // DSA indexer
  std::vector<std::vector<float>> gather;         // per team member
  std::vector<ScratchBuffer> thread_scratch;      // per team member (matmuls inside a region)
};

// What a layer's attention needs from the engine for one forward call.
struct AttentionContext {
  ThreadPool& pool;
  ActPrecision precision;
  ScratchBuffer& scratch;  // the caller thread's matmul scratch
  MlaWorkspace& ws;
};

// DSA: the key positions each query of a forward call attends to, ascending. An empty list
// means every position up to the query's own (no selection, or fewer keys than index_topk).
struct KeySelection {
  std::vector<std::vector<int32_t>> keys;  // [n_tokens]
};

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

class MlaAttention {
 public:
  // Resolves blk.{layer}.* and checks every shape against the spec (Error(Format) naming
  // the tensor); `indexer` when the layer runs its own DSA indexer.
  MlaAttention(const ModelSpec& spec, const WeightStore& weights, int64_t layer, bool indexer);
  ~MlaAttention();
  MlaAttention(MlaAttention&&) noexcept;

  // Attention of n tokens at positions [pos0, pos0 + n): h [n][hidden] (normed), out
  // [n][hidden]. Writes the layer's cache rows. `selection` is the DSA selection: filled
  // by this layer's own indexer, or reused as given by a "shared" layer; ignored without DSA.
  void forward(const AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t pos0, int64_t n,
               const float* h, float* out, KeySelection& selection);

  // Floats per position this layer keeps in the KV cache, per plane.
  std::vector<int64_t> kv_planes() const;

 private:
  void project(const AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t pos0, int64_t n, const float* h);
  void absorb_and_attend(const AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t pos0, int64_t n,
                         const KeySelection* selection);

  const ModelSpec& s_;
  MlaWeights w_;
  std::unique_ptr<DsaIndexer> indexer_;
};

// y[t][h] = W_h x[t][h] for every token t and head h, W_h the rows [h*R, (h+1)*R) of w
// (R = w.rows / n_heads): one parallel region over the heads, each head's product computed
// by one member with the regular matmul kernels. Strides are in floats.
void head_matmul(const AttentionContext& ctx, const WeightView& w, int64_t n_heads, const float* x,
                 int64_t x_token_stride, int64_t x_head_stride, int64_t n, float* y, int64_t y_token_stride,
                 int64_t y_head_stride);

}  // namespace colibri
