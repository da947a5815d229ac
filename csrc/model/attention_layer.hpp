// The seam between the engine's layer loop and one layer's attention. Each attention kind
// (grouped-query attention, attn_gqa; multi-head latent attention with or without the DSA
// indexer, attn_mla + dsa_indexer; DeepSeek-V4's sliding and compressed layers, attn_v4 +
// attn_v4_compressed) is a small unit
// with its own weights struct, its own KV-cache layout and its own forward, chosen per
// layer from the spec when the model loads (make_attention). The engine only orchestrates:
// it norms the residual stream, calls the layer's unit, adds the result back.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/kv_cache.hpp"
#include "model/matmul.hpp"
#include "model/model_spec.hpp"
#include "model/weights.hpp"

namespace colibri {

class ThreadPool;

// RoPE (cos, sin) pairs per row of a forward, kept across its layers: every GQA layer of a
// model rotates row t at the same position with (usually) the same frequencies, and the
// pairs cost 2 libm calls per frequency (measured on Zen 4, session 29: the caller computed
// them for every row of every layer while the team waited). A row's pairs are reused only
// when its position, the frequencies and the factor are exactly the ones they were computed
// for (bits compared), so the values are the ones rope_cos_sin gives, never stale ones.
struct RopeRows {
  std::vector<float> inv_freq;  // the frequencies and factor the rows below were computed for
  float factor = 0.0f;
  std::vector<int64_t> pos;     // row t's position, -1 where none
  std::vector<float> pairs;     // row t's pairs at pairs[t * 2 * half ..]

  // Keys the table to (freq, factor) for rows [0, n): rows computed for other ones are dropped.
  void bind(const std::vector<float>& freq, float f, int64_t n);
  // Row t's pairs at `position` (computed now unless the table has them).
  const float* row(int64_t t, int64_t position);
};

// Float buffers shared by every layer of one engine (one forward runs at a time), grown on
// demand. Each unit uses the ones it needs; a new kind adds its own fields.
struct AttentionScratch {
  std::vector<float> q, k, v, attn;  // GQA: projections and the attention output per token
  std::vector<float> rope;           // RoPE (cos, sin) pairs for one position (MLA, DSA)
  RopeRows rope_rows;                // GQA: RoPE (cos, sin) pairs per row, across layers
  std::vector<float> kernel;         // working memory of the attention kernels (attention/)
  // MLA (attn_mla.cpp): q-LoRA latent, query, [latent | rope key], absorbed query rows,
  // latent outputs, value heads, one cache row.
  std::vector<float> mla_qa, mla_q, mla_kva, mla_qrow, mla_lat, mla_heads, mla_row;
  std::vector<std::vector<float>> gather;  // per team member: per-head products (head_matmul)
  std::vector<ScratchBuffer> thread_matmul;  // per team member: their quantized activations
  // DSA indexer (dsa_indexer.cpp): queries, keys, head weights, scores, cached keys as F32.
  std::vector<float> dsa_q, dsa_k, dsa_w, dsa_scores, dsa_keys_f32;
  // DSA: the key positions each query of this forward attends to, from the last layer that
  // ran its own indexer ("shared" layers reuse them): query t's ascending positions are
  // dsa_keys[dsa_offsets[t] .. dsa_offsets[t + 1]), the attention kernels' sparse form.
  // Cleared by the engine at the start of every forward.
  std::vector<int32_t> dsa_keys;
  std::vector<int64_t> dsa_offsets;
  std::vector<float> gdn;  // linear attention (linear_attn_gdn.cpp): projections, conv, outputs
  std::vector<float> gate;  // GQA with attention_output_gate: the gate per token
  // DeepSeek-V4 compressed layers (attn_v4_compressed.cpp): a compressor's projections, the
  // indexer's queries and head weights, a pass's window rows as F32; the entries query t
  // attends to, v4c_sel[v4c_off[t] .. v4c_off[t + 1]).
  std::vector<float> v4c_kv, v4c_gate, v4c_iq, v4c_iw, v4c_rows;
  std::vector<int32_t> v4c_sel;
  std::vector<int64_t> v4c_off;
};

// One session's rows in a batched forward (continuous batching): n tokens at positions
// [pos0, pos0 + n) of that session's KV cache.
struct AttnSegment {
  KvCache* kv = nullptr;
  int64_t pos0 = 0;
  int64_t n = 0;
};

// What a unit may use during its forward: the compute team and the shared buffers.
struct AttentionContext {
  ThreadPool& pool;
  ScratchBuffer& matmul;  // quantized activations for the projections
  ActPrecision precision;
  AttentionScratch& scratch;
};

class AttentionLayer {
 public:
  virtual ~AttentionLayer() = default;

  // What this layer keeps per position in a session's KV cache.
  virtual KvLayerLayout kv_layout() const = 0;

  // x: [n, hidden] (the normed residual stream of tokens at positions [pos0, pos0 + n)).
  // Appends this layer's keys and values for those positions to `kv` (positions already
  // reserved by the caller), attends causally over [0, pos0 + t] for token t, and writes
  // the output projected back to hidden size into out: [n, hidden].
  virtual void forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv,
                       int64_t layer, float* out) = 0;

  // The batched form: x holds the rows of every segment one after the other ([sum n,
  // hidden]), each segment its own session's positions and cache; out likewise. A row's
  // result must not depend on the other segments (docs/serving.md). The default runs
  // the segments one after the other through forward(); a unit that can share its
  // projections' weight reads over all rows (GQA) overrides it.
  virtual void forward_segments(AttentionContext& ctx, const float* x, const std::vector<AttnSegment>& segs,
                                int64_t layer, int64_t hidden, float* out);
};

// The unit for layer `layer` of a model, its tensors looked up in `weights` and checked
// against the spec (Error(Format) naming a missing or misshapen tensor).
std::unique_ptr<AttentionLayer> make_attention(const ModelSpec& spec, const WeightStore& weights, int64_t layer);

}  // namespace colibri
