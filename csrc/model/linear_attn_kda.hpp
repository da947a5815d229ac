// Kimi Delta Attention (Kimi-Linear's linear layers), a unit beside Gated DeltaNet
// (linear_attn_gdn.hpp; the shared pieces in linear_attn_common.hpp). Per token: q, k, v
// projections (nh heads of d each: no grouped heads), a causal depthwise convolution over
// the last conv_kernel inputs of every q/k/v channel, then silu; q and k L2-normed per
// head, q scaled by 1/sqrt(d); beta = sigmoid(b) per head; the decay per key channel (not
// per head, as in Gated DeltaNet): g = -exp(A_log[h]) * softplus(f_b(f_a(x)) + dt_bias)
// (a low-rank projection through d values). Per head the delta rule on a (d x d) F32
// state S, row i of S decayed by its own channel's exp(g_i):
//   S = diag(exp(g)) S;  S += k (beta (v - S^T k))^T;  o = S^T q
// then o RMS-normed per head, times the norm weight and sigmoid(gate) (gate = g_b(g_a(x)),
// low-rank again), and projected back. That is transformers' recurrent_kimi_delta_attention;
// its chunked form (chunk_kimi_delta_attention, which transformers' prefill runs: the same
// values in another order) is here too, for forwards of at least
// ModelSpec::linear_chunked_min_tokens (0, recurrent only, as for Gated DeltaNet); both in
// linear_attn_rules.hpp on the SIMD kernels of linear_attn_kernels.hpp.
//
// The state (the convolution's last conv_kernel - 1 inputs of the 3 nh d channels, then
// every head's S) lives in the session's KvCache as Gated DeltaNet's does, the same size
// formula with nk = nv = nh and dk = dv = d.
#pragma once
#include <vector>

#include "model/attention_layer.hpp"

namespace colibri {

struct KdaWeights {
  const Tensor* in_q = nullptr;     // (nh * d, hidden): blk.{i}.attn_q
  const Tensor* in_k = nullptr;     // (nh * d, hidden): blk.{i}.attn_k
  const Tensor* in_v = nullptr;     // (nh * d, hidden): blk.{i}.attn_v
  const Tensor* conv = nullptr;     // (3 * nh * d, conv_kernel) as one vector, F32
  const Tensor* f_a = nullptr;      // (d, hidden)
  const Tensor* f_b = nullptr;      // (nh * d, d)
  const Tensor* a_log = nullptr;    // (nh,)
  const Tensor* dt_bias = nullptr;  // (nh * d,)
  const Tensor* in_b = nullptr;     // (nh, hidden)
  const Tensor* g_a = nullptr;      // (d, hidden)
  const Tensor* g_b = nullptr;      // (nh * d, d)
  const Tensor* norm = nullptr;     // (d,)
  const Tensor* out = nullptr;      // (hidden, nh * d): blk.{i}.attn_output
};

class KimiDeltaAttention final : public AttentionLayer {
 public:
  KimiDeltaAttention(const ModelSpec& spec, KdaWeights weights);

  // blk.{layer}.attn_{q,k,v,output} and blk.{layer}.kda_*, checked against the spec
  // (Error(Format) naming the tensor). The spec's linear key/value heads and sizes must
  // agree (nk = nv, dk = dv).
  static KdaWeights resolve(const ModelSpec& spec, const WeightStore& store, int64_t layer);

  KvLayerLayout kv_layout() const override;
  void forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv, int64_t layer,
               float* out) override;

 private:
  KdaWeights w_;
  int64_t hidden_, nh_, d_, kernel_;
  int64_t channels_;     // 3 * nh * d
  int64_t chunked_min_;  // forwards of at least this many tokens run the chunked form (0: never)
  float eps_;
  bool a_neg_exp_;  // ModelSpec::linear_a_neg_exp: kda_a_log holds -exp(A_log)
};

}  // namespace colibri
