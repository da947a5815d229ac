#include "model/attn_v4.hpp"

#include <algorithm>
#include <cmath>

#include "attention/attention.hpp"
#include "common/errors.hpp"
#include "model/attn_mla.hpp"  // head_matmul: the grouped output projection
#include "model/ops.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

namespace {

// x / sqrt(mean(x^2) + eps), no weight (V4's per-head query norm), accumulated as
// rms_norm_row does.
void unweighted_rms_norm(float* x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

V4SlidingAttention::V4SlidingAttention(const ModelSpec& s, const WeightStore& store, int64_t layer)
    : hidden_(s.hidden_size), n_heads_(s.n_heads), head_dim_(s.head_dim),
      rope_dim_(2 * static_cast<int64_t>(s.rope_inv_freq.size())), q_lora_(s.q_lora_rank), groups_(s.o_groups),
      group_rank_(s.o_lora_rank), window_(s.sliding_window), eps_(s.rms_norm_eps),
      scale_(s.attention_scale > 0 ? s.attention_scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim))),
      rope_inv_freq_(s.rope_inv_freq), rope_factor_(s.rope_attention_factor) {
  if (layer < static_cast<int64_t>(s.compress_ratios.size()) && s.compress_ratios[static_cast<std::size_t>(layer)] > 0) {
    if (s.compress_rope_inv_freq.size() != s.rope_inv_freq.size())
      fail(ErrorKind::InvalidArgument, "model spec: compress_rope_inv_freq must rotate as many pairs as rope_inv_freq");
    rope_inv_freq_ = s.compress_rope_inv_freq;  // the compressed layers' queries and keys: "compress"
    rope_factor_ = s.compress_rope_attention_factor;
  }
  if (q_lora_ <= 0 || groups_ <= 0 || group_rank_ <= 0 || (n_heads_ * head_dim_) % groups_ != 0)
    fail(ErrorKind::InvalidArgument,
         "model spec: V4 attention needs q_lora_rank > 0, o_lora_rank > 0 and o_groups dividing n_heads * head_dim");
  if (s.n_kv_heads != 1) fail(ErrorKind::InvalidArgument, "model spec: V4 attention has one shared KV head");
  const int64_t d = hidden_, qd = n_heads_ * head_dim_, gr = groups_ * group_rank_;
  const std::string p = "blk." + std::to_string(layer) + ".";
  auto req = [&](const std::string& name, int64_t rows, int64_t cols) {
    const Tensor* t = &store.get(name);
    check_shape(t, rows, cols);
    return t;
  };
  w_.q_a = req(p + "attn_q_a", q_lora_, d);
  w_.q_a_norm = req(p + "attn_q_a_norm", 1, q_lora_);
  w_.q_b = req(p + "attn_q_b", qd, q_lora_);
  w_.kv = req(p + "attn_kv", head_dim_, d);
  w_.kv_norm = req(p + "attn_kv_norm", 1, head_dim_);
  w_.o_a = req(p + "attn_output_a", gr, qd / groups_);
  w_.o_b = req(p + "attn_output_b", d, gr);
  w_.sinks = req(p + "attn_sinks", 1, n_heads_);
  for (const Tensor* t : {w_.q_a_norm, w_.kv_norm, w_.sinks}) t->f32();  // refuses other types at load
}

KvLayerLayout V4SlidingAttention::kv_layout() const { return KvLayerLayout{1, head_dim_, 0, 0, window_}; }

void V4SlidingAttention::forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv,
                                 int64_t layer, float* out) {
  project(ctx, x, n, pos0);
  AttentionScratch& ws = ctx.scratch;
  // The layer keeps a ring (kv_cache.hpp), which holds ring - window + 1 queries' windows
  // at once: the rows are stored and attended in passes of that many, as attn_gqa.cpp does
  // (the same bits: a query's result does not depend on the batch it runs in).
  const int64_t ring = kv.ring(layer);
  const int64_t pass = ring > 0 ? ring - window_ + 1 : std::max<int64_t>(n, 1);
  for (int64_t i0 = 0; i0 < n; i0 += pass) {
    const int64_t i1 = std::min(n, i0 + pass);
    for (int64_t t = i0; t < i1; ++t) kv.store_k(layer, pos0 + t, ws.k.data() + t * head_dim_);
    attend(ctx, kv, layer, i0, pos0 + i0, i1 - i0);
  }
  project_out(ctx, n, pos0, out);
}

void V4SlidingAttention::project(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0) {
  const int64_t hd = head_dim_, nh = n_heads_, qd = nh * hd, rd = rope_dim_, nope = hd - rd;
  AttentionScratch& ws = ctx.scratch;
  ws.mla_qa.resize(static_cast<std::size_t>(n * q_lora_));
  ws.q.resize(static_cast<std::size_t>(n * qd));
  ws.k.resize(static_cast<std::size_t>(n * hd));
  ws.attn.resize(static_cast<std::size_t>(n * qd));
  {  // the q latent and the key-value row read the same input
    const WeightView w[2] = {w_.q_a->view(), w_.kv->view()};
    float* const proj[2] = {ws.mla_qa.data(), ws.k.data()};
    matmul_multi(ctx.pool, w, proj, 2, x, n, ctx.matmul, ctx.precision);
  }
  for (int64_t t = 0; t < n; ++t)
    rms_norm_row(ws.mla_qa.data() + t * q_lora_, w_.q_a_norm->f32(), q_lora_, eps_, ws.mla_qa.data() + t * q_lora_);
  matmul(ctx.pool, w_.q_b->view(), ws.mla_qa.data(), n, ws.q.data(), ctx.matmul, ctx.precision);

  const int64_t half = static_cast<int64_t>(rope_inv_freq_.size());
  ws.rope.resize(static_cast<std::size_t>(2 * half));
  for (int64_t t = 0; t < n; ++t) {
    float* q = ws.q.data() + t * qd;
    float* k = ws.k.data() + t * hd;
    rope_cos_sin(pos0 + t, rope_inv_freq_.data(), half, rope_factor_, ws.rope.data());
    for (int64_t h = 0; h < nh; ++h) {
      unweighted_rms_norm(q + h * hd, hd, eps_);
      rope_head_interleaved(q + h * hd + nope, ws.rope.data(), rd);
    }
    rms_norm_row(k, w_.kv_norm->f32(), hd, eps_, k);
    rope_head_interleaved(k + nope, ws.rope.data(), rd);
  }
}

void V4SlidingAttention::project_out(AttentionContext& ctx, int64_t n, int64_t pos0, float* out) {
  const int64_t hd = head_dim_, nh = n_heads_, qd = nh * hd, rd = rope_dim_, nope = hd - rd;
  const int64_t half = static_cast<int64_t>(rope_inv_freq_.size());
  AttentionScratch& ws = ctx.scratch;
  ws.rope.resize(static_cast<std::size_t>(2 * half));
  // The values carried their position's rotation: undo it at the query's (sin negated).
  for (int64_t t = 0; t < n; ++t) {
    rope_cos_sin(pos0 + t, rope_inv_freq_.data(), half, rope_factor_, ws.rope.data());
    for (int64_t i = 0; i < half; ++i) ws.rope[static_cast<std::size_t>(2 * i + 1)] *= -1.0f;
    for (int64_t h = 0; h < nh; ++h) rope_head_interleaved(ws.attn.data() + t * qd + h * hd + nope, ws.rope.data(), rd);
  }
  const int64_t gin = qd / groups_, gr = groups_ * group_rank_;
  ws.mla_lat.resize(static_cast<std::size_t>(n * gr));
  head_matmul(ctx, w_.o_a->view(), groups_, ws.attn.data(), qd, gin, n, ws.mla_lat.data(), gr, group_rank_);
  matmul(ctx.pool, w_.o_b->view(), ws.mla_lat.data(), n, out, ctx.matmul, ctx.precision);
}

// Attention of the n queries at rows [t0, t0 + n) (positions pos0..) over the cache.
void V4SlidingAttention::attend(AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t t0, int64_t pos0,
                                int64_t n) {
  AttentionScratch& ws = ctx.scratch;
  const int64_t hd = head_dim_, qd = n_heads_ * hd;
  attn::Problem p;
  p.n_queries = n;
  p.n_kv_heads = 1;
  p.group = n_heads_;
  p.dk = p.dv = hd;
  p.scale = scale_;
  p.q = ws.q.data() + t0 * qd;
  p.q_stride = qd;
  p.q_head_stride = hd;
  p.out = ws.attn.data() + t0 * qd;
  p.out_stride = qd;
  p.out_head_stride = hd;
  p.k = attn::KvSide{kv.type(), kv.k(layer, 0), kv.k_row_bytes(layer), 0, kv.ring(layer)};
  p.v = p.k;  // K = V
  p.pos0 = pos0;
  p.window = window_;
  p.sinks = w_.sinks->f32();
  attn::run(ctx.pool, p, ws.kernel);
}

}  // namespace colibri
