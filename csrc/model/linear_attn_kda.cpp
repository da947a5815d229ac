#include "model/linear_attn_kda.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "model/linear_attn_common.hpp"
#include "model/linear_attn_rules.hpp"

namespace colibri {

KimiDeltaAttention::KimiDeltaAttention(const ModelSpec& s, KdaWeights weights)
    : w_(weights), hidden_(s.hidden_size), nh_(s.linear_num_value_heads), d_(s.linear_value_head_dim),
      kernel_(s.linear_conv_kernel), channels_(3 * nh_ * d_), chunked_min_(s.linear_chunked_min_tokens),
      eps_(s.rms_norm_eps), a_neg_exp_(s.linear_a_neg_exp) {}

KdaWeights KimiDeltaAttention::resolve(const ModelSpec& s, const WeightStore& store, int64_t layer) {
  const int64_t nh = s.linear_num_value_heads, d = s.linear_value_head_dim, h = s.hidden_size;
  if (nh <= 0 || d <= 0 || s.linear_conv_kernel <= 0 || s.linear_num_key_heads != nh || s.linear_key_head_dim != d)
    fail(ErrorKind::Format, "model spec: Kimi Delta Attention layer " + std::to_string(layer) +
                                " needs heads and sizes > 0, as many key heads as value heads of the same size");
  const int64_t vd = nh * d;
  const std::string p = "blk." + std::to_string(layer) + ".";
  auto req = [&](const std::string& name, int64_t rows, int64_t cols) {
    const Tensor* t = &store.get(name);
    check_shape(t, rows, cols);
    return t;
  };
  KdaWeights w;
  w.in_q = req(p + "attn_q", vd, h);
  w.in_k = req(p + "attn_k", vd, h);
  w.in_v = req(p + "attn_v", vd, h);
  w.conv = req(p + "kda_conv", 1, 3 * vd * s.linear_conv_kernel);  // a vector: widened to F32
  w.f_a = req(p + "kda_f_a", d, h);
  w.f_b = req(p + "kda_f_b", vd, d);
  w.a_log = req(p + "kda_a_log", 1, nh);
  w.dt_bias = req(p + "kda_dt_bias", 1, vd);
  w.in_b = req(p + "kda_b", nh, h);
  w.g_a = req(p + "kda_g_a", d, h);
  w.g_b = req(p + "kda_g_b", vd, d);
  w.norm = req(p + "kda_norm", 1, d);
  w.out = req(p + "attn_output", h, vd);
  for (const Tensor* t : {w.conv, w.a_log, w.dt_bias, w.norm}) t->f32();  // F32 now, or Error
  return w;
}

KvLayerLayout KimiDeltaAttention::kv_layout() const {
  KvLayerLayout l;
  l.state_floats = (kernel_ - 1) * channels_ + nh_ * d_ * d_;
  return l;
}

void KimiDeltaAttention::forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv,
                                 int64_t layer, float* out) {
  const int64_t C = channels_, K = kernel_, vd = nh_ * d_, d = d_, hist = K - 1;
  float* state = begin_linear_state(kv, layer, pos0);
  float* conv_hist = state;         // [hist][C]: the last inputs, oldest first
  float* heads = state + hist * C;  // [nh][d][d]

  // Scratch: [hist + n][C] convolution input, [n][C] its output, [n][C] the q/k/v
  // projections (then the decays g, the output gate and the head outputs, vd each), f_a's
  // and g_a's d per token, beta.
  std::vector<float>& ws = ctx.scratch.gdn;
  const std::size_t need = static_cast<std::size_t>((hist + n) * C + 2 * n * C + 2 * n * d + n * nh_);
  if (ws.size() < need) ws.resize(need);
  float* ext = ws.data();
  float* conv = ext + (hist + n) * C;
  float* proj = conv + n * C;
  float* fa = proj + n * C;
  float* ga = fa + n * d;
  float* beta = ga + n * d;
  {
    const WeightView wv[6] = {w_.in_q->view(), w_.in_k->view(), w_.in_v->view(),
                              w_.f_a->view(),  w_.g_a->view(),  w_.in_b->view()};
    float* const outs[6] = {proj, proj + n * vd, proj + 2 * n * vd, fa, ga, beta};
    matmul_multi(ctx.pool, wv, outs, 6, x, n, ctx.matmul, ctx.precision);
  }
  for (int64_t t = 0; t < n; ++t)  // q, k, v side by side: the convolution's channel order
    for (int64_t part = 0; part < 3; ++part)
      std::memcpy(ext + (hist + t) * C + part * vd, proj + part * n * vd + t * vd,
                  static_cast<std::size_t>(vd) * sizeof(float));
  short_conv_silu(ctx.pool, w_.conv->f32(), conv_hist, ext, n, C, K, conv);

  float* g = proj;  // the projections are in ext now: their rows take g, the gate, outputs
  float* gate = proj + n * vd;
  float* o = proj + 2 * n * vd;
  matmul(ctx.pool, w_.f_b->view(), fa, n, g, ctx.matmul, ctx.precision);
  matmul(ctx.pool, w_.g_b->view(), ga, n, gate, ctx.matmul, ctx.precision);

  // Per token: q and k L2-normed per head (q also scaled), in place; the channel decays g
  // in place; beta per head.
  const float* a_log = w_.a_log->f32();
  const float* dt_bias = w_.dt_bias->f32();
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  ctx.pool.parallel_for(n, 0, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = conv + t * C;
      for (int64_t h = 0; h < nh_; ++h) {
        lin_l2_normalize(row + h * d, d);
        for (int64_t i = 0; i < d; ++i) row[h * d + i] *= q_scale;
        lin_l2_normalize(row + vd + h * d, d);
        // exp(A_log); a GGUF stores -exp(A_log) (ModelSpec::linear_a_neg_exp)
        const float rate = a_neg_exp_ ? -a_log[h] : std::exp(a_log[h]);
        float* gh = g + t * vd + h * d;
        for (int64_t i = 0; i < d; ++i) gh[i] = -rate * lin_softplus(gh[i] + dt_bias[h * d + i]);
        beta[t * nh_ + h] = 1.0f / (1.0f + std::exp(-beta[t * nh_ + h]));
      }
    }
  });

  // The delta rule, one head per task (its state is its own): the chunked form for a
  // forward of at least chunked_min_ tokens, the recurrent one otherwise (the same values).
  const bool chunked = chunked_min_ > 0 && n >= chunked_min_;
  const linattn::Kernels& kern = linattn::active();
  ctx.pool.parallel_for(nh_, 1, [&](int64_t h0, int64_t h1, int) {
    for (int64_t h = h0; h < h1; ++h) {
      const linattn::HeadRows r{conv + h * d, conv + vd + h * d, conv + 2 * vd + h * d, C, beta + h, nh_,
                                g + h * d,    vd,                true,                  o + h * d, vd, d, d};
      (chunked ? linattn::delta_rule_chunked : linattn::delta_rule_recurrent)(kern, r, n, heads + h * d * d);
    }
  });

  // Gated RMSNorm over each head's output: o / rms(o) * weight * sigmoid(gate).
  const float* nw = w_.norm->f32();
  ctx.pool.parallel_for(n * nh_, 0, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      float* oh = o + i * d;  // [t][h] rows of d: the same offsets as the gate's
      const float* zh = gate + i * d;
      double ss = 0.0;
      for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(oh[j]) * oh[j];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps_);
      for (int64_t j = 0; j < d; ++j) oh[j] = nw[j] * (oh[j] * inv) / (1.0f + std::exp(-zh[j]));
    }
  });
  matmul(ctx.pool, w_.out->view(), o, n, out, ctx.matmul, ctx.precision);
  kv.set_state_tokens(layer, pos0 + n);
}

}  // namespace colibri
