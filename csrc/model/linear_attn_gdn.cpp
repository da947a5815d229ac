#include "model/linear_attn_gdn.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "model/linear_attn_common.hpp"
#include "model/linear_attn_rules.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

GatedDeltaNet::GatedDeltaNet(const ModelSpec& s, GdnWeights weights)
    : w_(weights), hidden_(s.hidden_size), nk_(s.linear_num_key_heads), nv_(s.linear_num_value_heads),
      dk_(s.linear_key_head_dim), dv_(s.linear_value_head_dim), kernel_(s.linear_conv_kernel),
      channels_(2 * nk_ * dk_ + nv_ * dv_), chunked_min_(s.linear_chunked_min_tokens), eps_(s.rms_norm_eps),
      a_neg_exp_(s.linear_a_neg_exp), v_tiled_(s.linear_v_tiled) {}

int64_t GatedDeltaNet::state_floats(const ModelSpec& s) {
  const int64_t channels = 2 * s.linear_num_key_heads * s.linear_key_head_dim +
                           s.linear_num_value_heads * s.linear_value_head_dim;
  return (s.linear_conv_kernel - 1) * channels +
         s.linear_num_value_heads * s.linear_key_head_dim * s.linear_value_head_dim;
}

GdnWeights GatedDeltaNet::resolve(const ModelSpec& s, const WeightStore& store, int64_t layer) {
  const int64_t nk = s.linear_num_key_heads, nv = s.linear_num_value_heads;
  const int64_t dk = s.linear_key_head_dim, dv = s.linear_value_head_dim, d = s.hidden_size;
  if (nk <= 0 || nv <= 0 || dk <= 0 || dv <= 0 || s.linear_conv_kernel <= 0 || nv % nk != 0)
    fail(ErrorKind::Format, "model spec: linear-attention layer " + std::to_string(layer) +
                                " needs key/value heads and sizes > 0, value heads a multiple of key heads");
  const int64_t channels = 2 * nk * dk + nv * dv;
  const std::string p = "blk." + std::to_string(layer) + ".";
  auto req = [&](const std::string& name, int64_t rows, int64_t cols) {
    const Tensor* t = &store.get(name);
    check_shape(t, rows, cols);
    return t;
  };
  GdnWeights w;
  w.in_qkv = req(p + "gdn_in_qkv", channels, d);
  w.in_z = req(p + "gdn_in_z", nv * dv, d);
  w.in_b = req(p + "gdn_in_b", nv, d);
  w.in_a = req(p + "gdn_in_a", nv, d);
  w.conv = req(p + "gdn_conv", 1, channels * s.linear_conv_kernel);  // a vector: widened to F32
  w.a_log = req(p + "gdn_a_log", 1, nv);
  w.dt_bias = req(p + "gdn_dt_bias", 1, nv);
  w.norm = req(p + "gdn_norm", 1, dv);
  w.out = req(p + "gdn_out", d, nv * dv);
  for (const Tensor* t : {w.conv, w.a_log, w.dt_bias, w.norm}) t->f32();  // F32 now, or Error
  return w;
}

KvLayerLayout GatedDeltaNet::kv_layout() const {
  KvLayerLayout l;
  l.state_floats = (kernel_ - 1) * channels_ + nv_ * dk_ * dv_;
  return l;
}

void GatedDeltaNet::forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv,
                            int64_t layer, float* out) {
  const int64_t C = channels_, K = kernel_, vd = nv_ * dv_, hist = K - 1;
  float* state = begin_linear_state(kv, layer, pos0);
  float* conv_hist = state;                 // [hist][C]: the last inputs, oldest first
  float* heads = state + hist * C;          // [nv][dk][dv]

  // Scratch: [hist + n][C] convolution input, [n][C] its output, z, b, a, head outputs.
  std::vector<float>& ws = ctx.scratch.gdn;
  const std::size_t need = static_cast<std::size_t>((hist + n) * C + n * C + n * vd + 2 * n * nv_ + n * vd);
  if (ws.size() < need) ws.resize(need);
  float* ext = ws.data();
  float* qkv = ext + hist * C;
  float* conv = ext + (hist + n) * C;
  float* z = conv + n * C;
  float* b = z + n * vd;
  float* a = b + n * nv_;
  float* o = a + n * nv_;
  {
    const WeightView wv[4] = {w_.in_qkv->view(), w_.in_z->view(), w_.in_b->view(), w_.in_a->view()};
    float* const proj[4] = {qkv, z, b, a};
    matmul_multi(ctx.pool, wv, proj, 4, x, n, ctx.matmul, ctx.precision);
  }

  // Causal depthwise convolution over [history, new inputs], then silu.
  short_conv_silu(ctx.pool, w_.conv->f32(), conv_hist, ext, n, C, K, conv);

  // Per token: q and k L2-normed per key head (q also scaled), in place; beta and the log
  // decay g per value head, in place of b and a.
  const float* a_log = w_.a_log->f32();
  const float* dt_bias = w_.dt_bias->f32();
  const int64_t kd = nk_ * dk_;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk_));
  ctx.pool.parallel_for(n, 0, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = conv + t * C;
      for (int64_t j = 0; j < nk_; ++j) {
        lin_l2_normalize(row + j * dk_, dk_);
        for (int64_t i = 0; i < dk_; ++i) row[j * dk_ + i] *= q_scale;
        lin_l2_normalize(row + kd + j * dk_, dk_);
      }
      for (int64_t h = 0; h < nv_; ++h) {
        b[t * nv_ + h] = 1.0f / (1.0f + std::exp(-b[t * nv_ + h]));
        const float A = a_neg_exp_ ? a_log[h] : -std::exp(a_log[h]);
        a[t * nv_ + h] = A * lin_softplus(a[t * nv_ + h] + dt_bias[h]);
      }
    }
  });

  // The delta rule, one value head per task (its state is its own): the chunked form for a
  // forward of at least chunked_min_ tokens, the recurrent one otherwise (the same values).
  const int64_t group = nv_ / nk_;
  const bool chunked = chunked_min_ > 0 && n >= chunked_min_;
  const linattn::Kernels& kern = linattn::active();
  ctx.pool.parallel_for(nv_, 1, [&](int64_t h0, int64_t h1, int) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = v_tiled_ ? h % nk_ : h / group;
      const linattn::HeadRows r{conv + kh * dk_, conv + kd + kh * dk_, conv + 2 * kd + h * dv_, C, b + h, nv_,
                                a + h, nv_, false, o + h * dv_, vd, dk_, dv_};
      float* S = heads + h * dk_ * dv_;
      (chunked ? linattn::delta_rule_chunked : linattn::delta_rule_recurrent)(kern, r, n, S);
    }
  });

  // Gated RMSNorm over each head's output: o / rms(o) * weight * silu(z).
  const float* nw = w_.norm->f32();
  ctx.pool.parallel_for(n * nv_, 0, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      float* oh = o + i * dv_;  // [t][h] rows of dv: the same offsets as z's
      const float* zh = z + i * dv_;
      double ss = 0.0;
      for (int64_t j = 0; j < dv_; ++j) ss += static_cast<double>(oh[j]) * oh[j];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dv_)) + eps_);
      for (int64_t j = 0; j < dv_; ++j) oh[j] = nw[j] * (oh[j] * inv) * lin_silu(zh[j]);
    }
  });
  matmul(ctx.pool, w_.out->view(), o, n, out, ctx.matmul, ctx.precision);
  kv.set_state_tokens(layer, pos0 + n);
}

}  // namespace colibri
