#include "model/linear_attn_gdn.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus (beta 1, threshold 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x *= 1 / sqrt(sum x^2 + 1e-6): transformers' l2norm (the FLA library's).
void l2_normalize(float* x, int64_t n) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + 1e-6f);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

GatedDeltaNet::GatedDeltaNet(const ModelSpec& s, GdnWeights weights)
    : w_(weights), hidden_(s.hidden_size), nk_(s.linear_num_key_heads), nv_(s.linear_num_value_heads),
      dk_(s.linear_key_head_dim), dv_(s.linear_value_head_dim), kernel_(s.linear_conv_kernel),
      channels_(2 * nk_ * dk_ + nv_ * dv_), eps_(s.rms_norm_eps) {}

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
  float* state = kv.state(layer);
  if (pos0 == 0) {
    std::fill(state, state + kv.layout(layer).state_floats, 0.0f);
  } else if (kv.state_tokens(layer) != pos0) {
    fail(ErrorKind::Internal, "linear-attention layer " + std::to_string(layer) + ": its state holds " +
                                  std::to_string(kv.state_tokens(layer)) + " tokens, the forward starts at " +
                                  std::to_string(pos0));
  }
  kv.set_state_tokens(layer, -1);  // until this forward completes
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
  std::memcpy(ext, conv_hist, static_cast<std::size_t>(hist * C) * sizeof(float));
  const float* cw = w_.conv->f32();  // [C][K]
  ctx.pool.parallel_for(C, 0, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t t = 0; t < n; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) acc += cw[c * K + j] * ext[(t + j) * C + c];
        conv[t * C + c] = silu(acc);
      }
  });
  std::memcpy(conv_hist, ext + n * C, static_cast<std::size_t>(hist * C) * sizeof(float));

  // The delta rule, one value head per task (its state is its own).
  const float* a_log = w_.a_log->f32();
  const float* dt_bias = w_.dt_bias->f32();
  const float* nw = w_.norm->f32();
  const int64_t group = nv_ / nk_, kd = nk_ * dk_;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk_));
  ctx.pool.parallel_for(nv_, 1, [&](int64_t h0, int64_t h1, int) {
    std::vector<float> q(static_cast<std::size_t>(dk_)), k(static_cast<std::size_t>(dk_));
    std::vector<float> delta(static_cast<std::size_t>(dv_));
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / group;
      float* S = heads + h * dk_ * dv_;
      const float decay_rate = -std::exp(a_log[h]);
      for (int64_t t = 0; t < n; ++t) {
        const float* row = conv + t * C;
        std::copy_n(row + kh * dk_, dk_, q.data());
        std::copy_n(row + kd + kh * dk_, dk_, k.data());
        const float* v = row + 2 * kd + h * dv_;
        l2_normalize(q.data(), dk_);
        l2_normalize(k.data(), dk_);
        for (float& e : q) e *= q_scale;
        const float beta = 1.0f / (1.0f + std::exp(-b[t * nv_ + h]));
        const float g = std::exp(decay_rate * softplus(a[t * nv_ + h] + dt_bias[h]));
        for (int64_t i = 0; i < dk_ * dv_; ++i) S[i] *= g;
        std::fill(delta.begin(), delta.end(), 0.0f);
        for (int64_t i = 0; i < dk_; ++i) {  // S^T k
          const float* Si = S + i * dv_;
          for (int64_t j = 0; j < dv_; ++j) delta[static_cast<std::size_t>(j)] += Si[j] * k[static_cast<std::size_t>(i)];
        }
        for (int64_t j = 0; j < dv_; ++j) delta[static_cast<std::size_t>(j)] = (v[j] - delta[static_cast<std::size_t>(j)]) * beta;
        float* oh = o + t * vd + h * dv_;
        std::fill(oh, oh + dv_, 0.0f);
        for (int64_t i = 0; i < dk_; ++i) {
          float* Si = S + i * dv_;
          const float ki = k[static_cast<std::size_t>(i)], qi = q[static_cast<std::size_t>(i)];
          for (int64_t j = 0; j < dv_; ++j) {
            Si[j] += ki * delta[static_cast<std::size_t>(j)];
            oh[j] += Si[j] * qi;
          }
        }
        // Gated RMSNorm over the head: o / rms(o) * weight * silu(z).
        double ss = 0.0;
        for (int64_t j = 0; j < dv_; ++j) ss += static_cast<double>(oh[j]) * oh[j];
        const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dv_)) + eps_);
        const float* zh = z + t * vd + h * dv_;
        for (int64_t j = 0; j < dv_; ++j) oh[j] = nw[j] * (oh[j] * inv) * silu(zh[j]);
      }
    }
  });
  matmul(ctx.pool, w_.out->view(), o, n, out, ctx.matmul, ctx.precision);
  kv.set_state_tokens(layer, pos0 + n);
}

}  // namespace colibri
