#include "model/linear_attn_gdn.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "model/linear_attn_common.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

namespace {

// One value head's inputs over n tokens: row t's q / k / v at q + t * stride ..., its beta
// and log decay at beta[t * gstride], g[t * gstride]; its output at out + t * ostride.
struct HeadRows {
  const float *q, *k, *v;
  int64_t stride;
  const float *beta, *g;
  int64_t gstride;
  float* out;
  int64_t ostride;
  int64_t dk, dv;
};

constexpr int64_t kChunk = 64;  // transformers' chunk_size

// Token by token (torch_recurrent_gated_delta_rule): S *= exp(g);
// S += k (beta (v - S^T k))^T; o = S^T q. Two passes over S per token (its operations in
// transformers' order).
void delta_rule_recurrent(const HeadRows& r, int64_t n, float* S) {
  const int64_t dk = r.dk, dv = r.dv;
  std::vector<float> delta(static_cast<std::size_t>(dv));
  for (int64_t t = 0; t < n; ++t) {
    const float *q = r.q + t * r.stride, *k = r.k + t * r.stride, *v = r.v + t * r.stride;
    const float beta = r.beta[t * r.gstride], decay = std::exp(r.g[t * r.gstride]);
    std::fill(delta.begin(), delta.end(), 0.0f);
    for (int64_t i = 0; i < dk; ++i) {  // the decay and S^T k in one pass over S
      float* Si = S + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        Si[j] *= decay;
        delta[static_cast<std::size_t>(j)] += Si[j] * k[i];
      }
    }
    for (int64_t j = 0; j < dv; ++j) delta[static_cast<std::size_t>(j)] = (v[j] - delta[static_cast<std::size_t>(j)]) * beta;
    float* o = r.out + t * r.ostride;
    std::fill(o, o + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* Si = S + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        Si[j] += k[i] * delta[static_cast<std::size_t>(j)];
        o[j] += Si[j] * q[i];
      }
    }
  }
}

float dot(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

// The chunked form (torch_chunk_gated_delta_rule), chunks of kChunk tokens, c the log
// decays' running sum in the chunk: T = I + strictly-lower (beta_i k_i.k_j e^(c_i - c_j));
// U = T^-1 (beta v), W = T^-1 (beta e^c k); per chunk, with the state S on entry:
//   v' = U - W S;  o_i = e^(c_i) q_i S + sum_(j<=i) (q_i.k_j) e^(c_i - c_j) v'_j;
//   S = e^(c_last) S + sum_i e^(c_last - c_i) k_i v'_i^T.
void delta_rule_chunked(const HeadRows& r, int64_t n, float* S) {
  const int64_t dk = r.dk, dv = r.dv;
  std::vector<float> c(kChunk), T(kChunk * kChunk), U(kChunk * dv), W(kChunk * dk);
  for (int64_t t0 = 0; t0 < n; t0 += kChunk) {
    const int64_t L = std::min(kChunk, n - t0);
    auto q = [&](int64_t i) { return r.q + (t0 + i) * r.stride; };
    auto k = [&](int64_t i) { return r.k + (t0 + i) * r.stride; };
    auto v = [&](int64_t i) { return r.v + (t0 + i) * r.stride; };
    auto beta = [&](int64_t i) { return r.beta[(t0 + i) * r.gstride]; };
    float run = 0.0f;
    for (int64_t i = 0; i < L; ++i) c[static_cast<std::size_t>(i)] = run += r.g[(t0 + i) * r.gstride];
    for (int64_t i = 0; i < L; ++i) {
      // Forward substitution through the unit lower-triangular T, row by row.
      float* Ui = U.data() + i * dv;
      float* Wi = W.data() + i * dk;
      const float bi = beta(i), ec = std::exp(c[static_cast<std::size_t>(i)]);
      for (int64_t x = 0; x < dv; ++x) Ui[x] = bi * v(i)[x];
      for (int64_t x = 0; x < dk; ++x) Wi[x] = bi * ec * k(i)[x];
      for (int64_t j = 0; j < i; ++j) {
        const float tij = bi * dot(k(i), k(j), dk) *
                          std::exp(c[static_cast<std::size_t>(i)] - c[static_cast<std::size_t>(j)]);
        const float *Uj = U.data() + j * dv, *Wj = W.data() + j * dk;
        for (int64_t x = 0; x < dv; ++x) Ui[x] -= tij * Uj[x];
        for (int64_t x = 0; x < dk; ++x) Wi[x] -= tij * Wj[x];
      }
    }
    for (int64_t i = 0; i < L; ++i) {  // U becomes v' = U - W S
      float* Ui = U.data() + i * dv;
      const float* Wi = W.data() + i * dk;
      for (int64_t a = 0; a < dk; ++a)
        for (int64_t x = 0; x < dv; ++x) Ui[x] -= Wi[a] * S[a * dv + x];
    }
    for (int64_t i = 0; i < L; ++i) {
      float* o = r.out + (t0 + i) * r.ostride;
      const float ec = std::exp(c[static_cast<std::size_t>(i)]);
      std::fill(o, o + dv, 0.0f);
      for (int64_t a = 0; a < dk; ++a) {
        const float qa = ec * q(i)[a];
        for (int64_t x = 0; x < dv; ++x) o[x] += qa * S[a * dv + x];
      }
      for (int64_t j = 0; j <= i; ++j) {
        const float w = dot(q(i), k(j), dk) *
                        std::exp(c[static_cast<std::size_t>(i)] - c[static_cast<std::size_t>(j)]);
        const float* Uj = U.data() + j * dv;
        for (int64_t x = 0; x < dv; ++x) o[x] += w * Uj[x];
      }
    }
    const float last = c[static_cast<std::size_t>(L - 1)], el = std::exp(last);
    for (int64_t i = 0; i < dk * dv; ++i) S[i] *= el;
    for (int64_t i = 0; i < L; ++i) {
      const float w = std::exp(last - c[static_cast<std::size_t>(i)]);
      const float* Ui = U.data() + i * dv;
      for (int64_t a = 0; a < dk; ++a) {
        const float ka = w * k(i)[a];
        for (int64_t x = 0; x < dv; ++x) S[a * dv + x] += ka * Ui[x];
      }
    }
  }
}

}  // namespace

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
  ctx.pool.parallel_for(nv_, 1, [&](int64_t h0, int64_t h1, int) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = v_tiled_ ? h % nk_ : h / group;
      HeadRows r{conv + kh * dk_, conv + kd + kh * dk_, conv + 2 * kd + h * dv_, C,
                 b + h, a + h, nv_, o + h * dv_, vd, dk_, dv_};
      float* S = heads + h * dk_ * dv_;
      if (chunked_min_ > 0 && n >= chunked_min_) delta_rule_chunked(r, n, S);
      else delta_rule_recurrent(r, n, S);
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
