// Gated DeltaNet linear attention (Qwen3-Next's linear layers), a unit beside the
// attention kinds (attention_layer.hpp: make_attention picks it for the layers the spec's
// linear_layers marks). Per token: projections to q, k, v (one matrix, in the order of the
// short convolution's channels), the output gate z, and per value head b and a; a causal
// depthwise convolution over the last conv_kernel inputs of every q/k/v channel, then
// silu; q and k L2-normed per head, q scaled by 1/sqrt(key head dim); beta = sigmoid(b),
// decay g = -exp(A_log) * softplus(a + dt_bias); per value head h (key head h / (nv / nk),
// or h % nk for llama.cpp's tiled files: ModelSpec::linear_v_tiled)
// the delta rule on a (key dim x value dim) F32 state S:
//   S *= exp(g);  S += k (beta (v - S^T k))^T;  o = S^T q
// then o RMS-normed per head, times the norm weight and silu(z), and projected back.
// That is transformers' torch_recurrent_gated_delta_rule. Its chunked form
// (torch_chunk_gated_delta_rule: 64-token chunks, a triangular solve per chunk, then
// products with the state; the same values in another order) is here too, for forwards of
// at least ModelSpec::linear_chunked_min_tokens. Both are in linear_attn_rules.hpp, on the
// SIMD kernels of linear_attn_kernels.hpp; the recurrent one is the faster on a CPU (it
// does less arithmetic per token: docs/linear-attention.md), so colibri runs it throughout.
//
// The state a sequence carries (the convolution's last conv_kernel - 1 inputs, then every
// head's S) lives in the session's KvCache (KvLayerLayout::state_floats): fixed size,
// whatever the context. A forward at position 0 starts from zeros; at any other position
// the state must hold exactly pos0 tokens (the session replays its tokens otherwise).
#pragma once
#include <vector>

#include "model/attention_layer.hpp"

namespace colibri {

struct GdnWeights {
  const Tensor* in_qkv = nullptr;   // (2 * nk * dk + nv * dv, hidden)
  const Tensor* in_z = nullptr;     // (nv * dv, hidden)
  const Tensor* in_b = nullptr;     // (nv, hidden)
  const Tensor* in_a = nullptr;     // (nv, hidden)
  const Tensor* conv = nullptr;     // (2 * nk * dk + nv * dv, conv_kernel), F32
  const Tensor* a_log = nullptr;    // (nv,)
  const Tensor* dt_bias = nullptr;  // (nv,)
  const Tensor* norm = nullptr;     // (dv,)
  const Tensor* out = nullptr;      // (hidden, nv * dv)
};

class GatedDeltaNet final : public AttentionLayer {
 public:
  GatedDeltaNet(const ModelSpec& spec, GdnWeights weights);

  // blk.{layer}.gdn_*, checked against the spec (Error(Format) naming the tensor).
  static GdnWeights resolve(const ModelSpec& spec, const WeightStore& store, int64_t layer);

  // Floats of one sequence's state for these sizes (convolution history, then the heads').
  static int64_t state_floats(const ModelSpec& spec);

  KvLayerLayout kv_layout() const override;
  void forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv, int64_t layer,
               float* out) override;

 private:
  GdnWeights w_;
  int64_t hidden_, nk_, nv_, dk_, dv_, kernel_;
  int64_t channels_;  // 2 * nk * dk + nv * dv
  int64_t chunked_min_;  // forwards of at least this many tokens run the chunked form (0: never)
  float eps_;
  bool a_neg_exp_, v_tiled_;  // ModelSpec::linear_a_neg_exp / linear_v_tiled
};

}  // namespace colibri
