#include "model/attn_gqa.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/attention.hpp"
#include "model/ops.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

bool gqa_sliding(const ModelSpec& s, int64_t layer) {
  return layer >= 0 && layer < static_cast<int64_t>(s.sliding_layers.size()) &&
         s.sliding_layers[static_cast<std::size_t>(layer)];
}

int64_t gqa_kv_heads(const ModelSpec& s, int64_t layer) {
  return gqa_sliding(s, layer) && s.sliding_n_kv_heads > 0 ? s.sliding_n_kv_heads : s.n_kv_heads;
}

int64_t gqa_v_dim(const ModelSpec& s) { return s.v_head_dim > 0 ? s.v_head_dim : s.head_dim; }

GqaAttention::GqaAttention(const ModelSpec& s, GqaWeights weights, int64_t layer)
    : w_(weights), hidden_(s.hidden_size), n_heads_(s.n_heads), n_kv_heads_(gqa_kv_heads(s, layer)),
      head_dim_(s.head_dim), v_dim_(gqa_v_dim(s)), qk_norm_(s.qk_norm), eps_(s.rms_norm_eps),
      scale_(s.attention_scale > 0 ? s.attention_scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim))),
      window_(gqa_sliding(s, layer) ? s.sliding_window : 0),
      rope_inv_freq_(gqa_sliding(s, layer) && !s.sliding_rope_inv_freq.empty() ? s.sliding_rope_inv_freq
                                                                              : s.rope_inv_freq),
      rope_factor_(s.rope_attention_factor), v_scale_(s.attention_value_scale) {}

GqaWeights GqaAttention::resolve(const ModelSpec& s, const WeightStore& store, int64_t layer) {
  const int64_t nkv = gqa_kv_heads(s, layer), vd = gqa_v_dim(s);
  const int64_t d = s.hidden_size, qd = s.n_heads * s.head_dim, kvd = nkv * s.head_dim;
  const int64_t ad = s.n_heads * vd, kvvd = nkv * vd;  // attention output, values
  const std::string p = "blk." + std::to_string(layer) + ".";
  auto req = [&](const std::string& name, int64_t rows, int64_t cols) {
    const Tensor* t = &store.get(name);
    check_shape(t, rows, cols);
    return t;
  };
  GqaWeights w;
  w.q = req(p + "attn_q", qd, d);
  w.k = req(p + "attn_k", kvd, d);
  w.v = req(p + "attn_v", kvvd, d);
  w.o = req(p + "attn_output", d, ad);
  if (s.attention_bias) {
    w.q_bias = req(p + "attn_q.bias", 1, qd);
    w.k_bias = req(p + "attn_k.bias", 1, kvd);
    w.v_bias = req(p + "attn_v.bias", 1, kvvd);
  }
  if (s.qk_norm != QkNorm::None) {
    const bool full = s.qk_norm == QkNorm::Full;
    w.q_norm = req(p + "attn_q_norm", 1, full ? qd : s.head_dim);
    w.k_norm = req(p + "attn_k_norm", 1, full ? kvd : s.head_dim);
  }
  if (s.attention_sinks && (!s.sinks_sliding_only || gqa_sliding(s, layer)))
    w.sinks = req(p + "attn_sinks", 1, s.n_heads);
  if (s.attention_out_bias) w.o_bias = req(p + "attn_output.bias", 1, d);
  if (s.attention_output_gate) w.gate = req(p + "attn_gate", ad, d);
  return w;
}

KvLayerLayout GqaAttention::kv_layout() const {
  return KvLayerLayout{n_kv_heads_, head_dim_, n_kv_heads_, v_dim_, window_};
}

void GqaAttention::forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv,
                           int64_t layer, float* out) {
  forward_segments(ctx, x, {AttnSegment{&kv, pos0, n}}, layer, hidden_, out);
}

// One session's forward is the one-segment case, so a row's arithmetic is the same alone
// or batched: the projections are per-row kernels (model/matmul.cpp), and the attention
// runs per segment over that segment's cache only.
void GqaAttention::forward_segments(AttentionContext& ctx, const float* x, const std::vector<AttnSegment>& segs,
                                    int64_t layer, int64_t /*hidden*/, float* out) {
  const int64_t hd = head_dim_, nh = n_heads_, nkv = n_kv_heads_;
  const int64_t qd = nh * hd, kvd = nkv * hd, ad = nh * v_dim_, kvvd = nkv * v_dim_;
  int64_t n = 0;
  for (const AttnSegment& sg : segs) n += sg.n;
  AttentionScratch& ws = ctx.scratch;
  ws.q.resize(static_cast<std::size_t>(n * qd));
  ws.k.resize(static_cast<std::size_t>(n * kvd));
  ws.v.resize(static_cast<std::size_t>(n * kvvd));
  ws.attn.resize(static_cast<std::size_t>(n * ad));

  {  // q, k and v read the same input: one parallel region for the three
    const WeightView w[3] = {w_.q->view(), w_.k->view(), w_.v->view()};
    float* const proj[3] = {ws.q.data(), ws.k.data(), ws.v.data()};
    matmul_multi(ctx.pool, w, proj, 3, x, n, ctx.matmul, ctx.precision);
  }
  if (w_.q_bias) {
    for (int64_t t = 0; t < n; ++t) {
      add_inplace(ws.q.data() + t * qd, w_.q_bias->f32(), qd);
      add_inplace(ws.k.data() + t * kvd, w_.k_bias->f32(), kvd);
      add_inplace(ws.v.data() + t * kvvd, w_.v_bias->f32(), kvvd);
    }
  }
  if (v_scale_ != 1.0f)  // MiMo-V2-Flash: the projected values (bias included) are scaled
    for (int64_t i = 0; i < n * kvvd; ++i) ws.v[static_cast<std::size_t>(i)] *= v_scale_;

  ws.rope_rows.bind(rope_inv_freq_, rope_factor_, n);
  int64_t row0 = 0;
  for (const AttnSegment& sg : segs) {
    KvCache& kv = *sg.kv;
    // A ring layer (kv_cache.hpp) holds ring - window + 1 queries' windows at once: the
    // segment runs in passes of that many (the same bits: a query's result does not depend
    // on the batch it runs in, attention.hpp).
    const int64_t ring = kv.ring(layer);
    const int64_t pass = ring > 0 ? ring - window_ + 1 : std::max<int64_t>(sg.n, 1);
    for (int64_t i0 = 0; i0 < sg.n; i0 += pass) {
      const int64_t i1 = std::min(sg.n, i0 + pass);
      for (int64_t i = i0; i < i1; ++i) store_row(ws, row0 + i, sg.pos0 + i, kv, layer);
      attend(ctx, kv, layer, row0 + i0, sg.pos0 + i0, i1 - i0);
    }
    row0 += sg.n;
  }
  if (w_.gate) apply_output_gate(ctx, x, n, ad);
  matmul(ctx.pool, w_.o->view(), ws.attn.data(), n, out, ctx.matmul, ctx.precision);
  if (w_.o_bias)
    for (int64_t t = 0; t < n; ++t) add_inplace(out + t * hidden_, w_.o_bias->f32(), hidden_);
}

// Row t (position pos) of the projections: QK-norm, RoPE, then its key and value stored.
void GqaAttention::store_row(AttentionScratch& ws, int64_t t, int64_t pos, KvCache& kv, int64_t layer) {
  const int64_t hd = head_dim_, nh = n_heads_, nkv = n_kv_heads_;
  const int64_t qd = nh * hd, kvd = nkv * hd;
  const int64_t half = static_cast<int64_t>(rope_inv_freq_.size());
  float* q = ws.q.data() + t * qd;
  float* k = ws.k.data() + t * kvd;
  if (qk_norm_ == QkNorm::Full) {
    rms_norm_row(q, w_.q_norm->f32(), qd, eps_, q);
    rms_norm_row(k, w_.k_norm->f32(), kvd, eps_, k);
  } else if (qk_norm_ == QkNorm::PerHead) {
    for (int64_t h = 0; h < nh; ++h) rms_norm_row(q + h * hd, w_.q_norm->f32(), hd, eps_, q + h * hd);
    for (int64_t h = 0; h < nkv; ++h) rms_norm_row(k + h * hd, w_.k_norm->f32(), hd, eps_, k + h * hd);
  }
  const float* cos_sin = ws.rope_rows.row(t, pos);
  for (int64_t h = 0; h < nh; ++h) rope_head(q + h * hd, cos_sin, 2 * half);
  for (int64_t h = 0; h < nkv; ++h) rope_head(k + h * hd, cos_sin, 2 * half);
  kv.store_k(layer, pos, k);
  kv.store_v(layer, pos, ws.v.data() + t * nkv * v_dim_);
}

// Attention of the n queries at rows [t0, t0 + n) (positions pos0..) over the cache.
void GqaAttention::attend(AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t t0, int64_t pos0, int64_t n) {
  AttentionScratch& ws = ctx.scratch;
  const int64_t hd = head_dim_, qd = n_heads_ * hd, vd = v_dim_, ad = n_heads_ * vd;
  attn::Problem p;
  p.n_queries = n;
  p.n_kv_heads = n_kv_heads_;
  p.group = n_heads_ / n_kv_heads_;
  p.dk = hd;
  p.dv = vd;
  p.scale = scale_;
  p.q = ws.q.data() + t0 * qd;
  p.q_stride = qd;
  p.q_head_stride = hd;
  p.out = ws.attn.data() + t0 * ad;
  p.out_stride = ad;
  p.out_head_stride = vd;
  p.k = attn::KvSide{kv.type(), kv.k(layer, 0), kv.k_row_bytes(layer), row_bytes(kv.type(), hd), kv.ring(layer)};
  p.v = attn::KvSide{kv.type(), kv.v(layer, 0), kv.v_row_bytes(layer), row_bytes(kv.type(), vd), kv.ring(layer)};
  p.pos0 = pos0;
  p.window = window_;
  p.sinks = w_.sinks ? w_.sinks->f32() : nullptr;
  attn::run(ctx.pool, p, ws.kernel);
}

// Qwen3-Next: attention output *= sigmoid(x W_gate^T), per element, before o_proj.
void GqaAttention::apply_output_gate(AttentionContext& ctx, const float* x, int64_t n, int64_t qd) {
  std::vector<float>& g = ctx.scratch.gate;
  g.resize(static_cast<std::size_t>(n * qd));
  matmul(ctx.pool, w_.gate->view(), x, n, g.data(), ctx.matmul, ctx.precision);
  float* a = ctx.scratch.attn.data();
  for (int64_t i = 0; i < n * qd; ++i) a[i] *= 1.0f / (1.0f + std::exp(-g[static_cast<std::size_t>(i)]));
}

void RopeRows::bind(const std::vector<float>& freq, float f, int64_t n) {
  const bool same = freq.size() == inv_freq.size() && std::memcmp(&f, &factor, sizeof f) == 0 &&
                    (freq.empty() || std::memcmp(freq.data(), inv_freq.data(), freq.size() * sizeof(float)) == 0);
  if (!same) {
    inv_freq = freq;
    factor = f;
    pos.assign(pos.size(), -1);
  }
  if (pos.size() < static_cast<std::size_t>(n)) pos.resize(static_cast<std::size_t>(n), -1);
  pairs.resize(std::max(pairs.size(), static_cast<std::size_t>(n) * 2 * inv_freq.size()));
}

const float* RopeRows::row(int64_t t, int64_t position) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  float* p = pairs.data() + static_cast<std::size_t>(t * 2 * half);
  if (pos[static_cast<std::size_t>(t)] != position) {
    rope_cos_sin(position, inv_freq.data(), half, factor, p);
    pos[static_cast<std::size_t>(t)] = position;
  }
  return p;
}

}  // namespace colibri
