// Grouped-query attention with a KV cache: projections (+bias), optional QK-norm, RoPE,
// cache append, causal softmax attention, output projection.
#include <cmath>
#include <cstring>

#include "model/engine.hpp"
#include "model/kv_cache.hpp"
#include "model/ops.hpp"

namespace colibri {

void Engine::attention_block(const LayerWeights& L, KvCache& kv, int64_t layer, int64_t pos0,
                             int64_t n) {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size, hd = s.head_dim, nh = s.n_heads, nkv = s.n_kv_heads;
  const int64_t qd = nh * hd, kvd = nkv * hd;
  ws_.q.resize(static_cast<std::size_t>(n * qd));
  ws_.k.resize(static_cast<std::size_t>(n * kvd));
  ws_.v.resize(static_cast<std::size_t>(n * kvd));
  ws_.attn.resize(static_cast<std::size_t>(n * qd));
  ws_.proj.resize(static_cast<std::size_t>(n * d));

  {  // q, k and v read the same input: one parallel region for the three
    const WeightView w[3] = {L.q->view(), L.k->view(), L.v->view()};
    float* const out[3] = {ws_.q.data(), ws_.k.data(), ws_.v.data()};
    matmul_multi(pool_, w, out, 3, ws_.h.data(), n, ws_.matmul, precision_);
  }
  if (L.q_bias) {
    for (int64_t t = 0; t < n; ++t) {
      add_inplace(ws_.q.data() + t * qd, L.q_bias->f32(), qd);
      add_inplace(ws_.k.data() + t * kvd, L.k_bias->f32(), kvd);
      add_inplace(ws_.v.data() + t * kvd, L.v_bias->f32(), kvd);
    }
  }

  const int64_t half = static_cast<int64_t>(s.rope_inv_freq.size());
  std::vector<float> cos_sin(static_cast<std::size_t>(2 * half));
  for (int64_t t = 0; t < n; ++t) {
    float* q = ws_.q.data() + t * qd;
    float* k = ws_.k.data() + t * kvd;
    if (s.qk_norm == QkNorm::Full) {
      rms_norm_row(q, L.q_norm->f32(), qd, s.rms_norm_eps, q);
      rms_norm_row(k, L.k_norm->f32(), kvd, s.rms_norm_eps, k);
    } else if (s.qk_norm == QkNorm::PerHead) {
      for (int64_t h = 0; h < nh; ++h) rms_norm_row(q + h * hd, L.q_norm->f32(), hd, s.rms_norm_eps, q + h * hd);
      for (int64_t h = 0; h < nkv; ++h) rms_norm_row(k + h * hd, L.k_norm->f32(), hd, s.rms_norm_eps, k + h * hd);
    }
    rope_cos_sin(pos0 + t, s.rope_inv_freq.data(), half, s.rope_attention_factor, cos_sin.data());
    auto rope = s.rope_interleaved ? rope_head_interleaved : rope_head;
    for (int64_t h = 0; h < nh; ++h) rope(q + h * hd, cos_sin.data(), 2 * half);
    for (int64_t h = 0; h < nkv; ++h) rope(k + h * hd, cos_sin.data(), 2 * half);
    std::memcpy(kv.k(layer, pos0 + t), k, static_cast<std::size_t>(kvd) * sizeof(float));
    std::memcpy(kv.v(layer, pos0 + t), ws_.v.data() + t * kvd, static_cast<std::size_t>(kvd) * sizeof(float));
  }

  // One task per (token, head): each output head row is computed by one thread, with the
  // positions summed in order, so the result does not depend on the team.
  const float scale = s.attention_scale > 0 ? s.attention_scale : 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = nh / nkv, ctx = kv.context_length();
  ws_.attn_scores.resize(static_cast<std::size_t>(pool_.size() * ctx));
  pool_.parallel_for(n * nh, 1, [&](int64_t begin, int64_t end, int thread) {
    float* scores = ws_.attn_scores.data() + thread * ctx;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / nh, h = task % nh, g = h / group;
      const int64_t n_keys = pos0 + t + 1;  // causal: keys at positions <= this one
      const float* q = ws_.q.data() + t * qd + h * hd;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* kr = kv.k(layer, j) + g * hd;
        float dot = 0.0f;
        for (int64_t i = 0; i < hd; ++i) dot += q[i] * kr[i];
        scores[j] = dot * scale;
      }
      softmax(scores, n_keys);
      float* out = ws_.attn.data() + t * qd + h * hd;
      std::memset(out, 0, static_cast<std::size_t>(hd) * sizeof(float));
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* vr = kv.v(layer, j) + g * hd;
        const float p = scores[j];
        for (int64_t i = 0; i < hd; ++i) out[i] += p * vr[i];
      }
    }
  });
  mm(*L.o, ws_.attn.data(), n, ws_.proj.data());
}

}  // namespace colibri
