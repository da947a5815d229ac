#include "model/mla_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "model/dsa_indexer.hpp"
#include "model/kv_cache.hpp"
#include "model/ops.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

namespace {

void check(const Tensor* t, int64_t rows, int64_t cols) {
  if (t->rows != rows || t->cols != cols)
    fail(ErrorKind::Format, "tensor '" + t->name + "' is " + std::to_string(t->rows) + "x" +
                                std::to_string(t->cols) + " but the config implies " + std::to_string(rows) +
                                "x" + std::to_string(cols));
}

void rope_part(const ModelSpec& s, bool interleaved, float* x, const float* cos_sin) {
  const auto rot = static_cast<int64_t>(s.rope_inv_freq.size()) * 2;
  if (interleaved)
    rope_head_interleaved(x, cos_sin, rot);
  else
    rope_head(x, cos_sin, rot);
}

// Scalar reference of absorbed attention for one token's query rows q[h] (kd floats each,
// heads [h0, h1)) over the layer's latent rows (plane 0, kd floats each, the value being
// its first vd floats): keys at positions keys[0..n_keys) (ascending), or 0..n_keys-1 when
// keys is null. Each key row is read once for all the heads (MQA: they share it).
// scores: (h1 - h0) * n_keys floats of scratch. The sum over keys runs in position order,
// so a selection of every key equals no selection, and a head's result does not depend on
// which heads share its task. The attention kernels of csrc/attention/ replace this once
// they land.
void latent_attention_ref(const float* q, int64_t h0, int64_t h1, KvCache& kv, int64_t layer,
                          const int32_t* keys, int64_t n_keys, int64_t kd, int64_t vd, float scale,
                          float* scores, float* out) {
  const int64_t nh = h1 - h0;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* kr = kv.plane(layer, 0, keys ? keys[j] : j);
    for (int64_t h = 0; h < nh; ++h) scores[h * n_keys + j] = dot_lanes8(q + (h0 + h) * kd, kr, kd) * scale;
  }
  for (int64_t h = 0; h < nh; ++h) softmax(scores + h * n_keys, n_keys);
  std::memset(out + h0 * vd, 0, static_cast<std::size_t>(nh * vd) * sizeof(float));
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* vr = kv.plane(layer, 0, keys ? keys[j] : j);
    for (int64_t h = 0; h < nh; ++h) {
      const float p = scores[h * n_keys + j];
      float* o = out + (h0 + h) * vd;
      for (int64_t i = 0; i < vd; ++i) o[i] += p * vr[i];
    }
  }
}

}  // namespace

void head_matmul(const AttentionContext& ctx, const WeightView& w, int64_t n_heads, const float* x,
                 int64_t x_token_stride, int64_t x_head_stride, int64_t n, float* y, int64_t y_token_stride,
                 int64_t y_head_stride) {
  const int64_t rows = w.rows / n_heads, cols = w.cols;
  const std::size_t row_bytes_w = row_bytes(w.type, cols);
  const int team = ctx.pool.size();
  if (static_cast<int>(ctx.ws.gather.size()) < team) ctx.ws.gather.resize(static_cast<std::size_t>(team));
  if (static_cast<int>(ctx.ws.thread_scratch.size()) < team)
    ctx.ws.thread_scratch.resize(static_cast<std::size_t>(team));
  const TypeKernels& k = kernels(w.type, ctx.precision);
  ctx.pool.parallel_for(n_heads, 1, [&](int64_t begin, int64_t end, int thread) {
    std::vector<float>& buf = ctx.ws.gather[static_cast<std::size_t>(thread)];
    buf.resize(static_cast<std::size_t>(n * (cols + rows)));
    float* xin = buf.data();
    float* yout = buf.data() + n * cols;
    for (int64_t h = begin; h < end; ++h) {
      for (int64_t t = 0; t < n; ++t)
        std::memcpy(xin + t * cols, x + t * x_token_stride + h * x_head_stride,
                    static_cast<std::size_t>(cols) * sizeof(float));
      const WeightView wh{w.type, rows, cols, static_cast<const uint8_t*>(w.data) + h * rows * row_bytes_w};
      // Inside the region the matmul runs on this member alone, with its own scratch.
      matmul_with(ctx.pool, k, wh, xin, n, yout, ctx.ws.thread_scratch[static_cast<std::size_t>(thread)]);
      for (int64_t t = 0; t < n; ++t)
        std::memcpy(y + t * y_token_stride + h * y_head_stride, yout + t * rows,
                    static_cast<std::size_t>(rows) * sizeof(float));
    }
  });
}

MlaAttention::MlaAttention(const ModelSpec& s, const WeightStore& ws, int64_t layer, bool indexer) : s_(s) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  const int64_t d = s.hidden_size, nh = s.n_heads, qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
  auto req = [&](const std::string& name) { return &ws.get(name); };
  if (s.q_lora_rank > 0) {
    w_.q_a = req(p + "attn_q_a");
    check(w_.q_a, s.q_lora_rank, d);
    w_.q_a_norm = req(p + "attn_q_a_norm");
    check(w_.q_a_norm, 1, s.q_lora_rank);
    w_.q_b = req(p + "attn_q_b");
    check(w_.q_b, nh * qk, s.q_lora_rank);
  } else {
    w_.q = req(p + "attn_q");
    check(w_.q, nh * qk, d);
  }
  w_.kv_a = req(p + "attn_kv_a_mqa");
  check(w_.kv_a, s.kv_lora_rank + s.qk_rope_head_dim, d);
  w_.kv_a_norm = req(p + "attn_kv_a_norm");
  check(w_.kv_a_norm, 1, s.kv_lora_rank);
  w_.k_b = req(p + "attn_k_b");
  check(w_.k_b, nh * s.kv_lora_rank, s.qk_nope_head_dim);
  w_.v_b = req(p + "attn_v_b");
  check(w_.v_b, nh * s.v_head_dim, s.kv_lora_rank);
  w_.o = req(p + "attn_output");
  check(w_.o, d, nh * s.v_head_dim);
  if (indexer) indexer_ = std::make_unique<DsaIndexer>(s, ws, layer);
}

MlaAttention::~MlaAttention() = default;
MlaAttention::MlaAttention(MlaAttention&&) noexcept = default;

std::vector<int64_t> MlaAttention::kv_planes() const {
  std::vector<int64_t> planes{s_.kv_lora_rank + s_.qk_rope_head_dim};
  if (indexer_) planes.push_back(s_.index_head_dim);
  return planes;
}

// Projections, norms and RoPE; the latent rows go to the cache, the query rows to ws.q.
void MlaAttention::project(const AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t pos0, int64_t n,
                           const float* h) {
  const ModelSpec& s = s_;
  MlaWorkspace& ws = ctx.ws;
  const int64_t nh = s.n_heads, nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim, qk = nope + rope;
  const int64_t r = s.kv_lora_rank, kva_w = r + rope;
  ws.q.resize(static_cast<std::size_t>(n * nh * qk));
  ws.kva.resize(static_cast<std::size_t>(n * kva_w));
  if (w_.q_a) {  // q_a and kv_a read the same input: one parallel region for both
    ws.qa.resize(static_cast<std::size_t>(n * s.q_lora_rank));
    const WeightView wv[2] = {w_.q_a->view(), w_.kv_a->view()};
    float* const outs[2] = {ws.qa.data(), ws.kva.data()};
    matmul_multi(ctx.pool, wv, outs, 2, h, n, ctx.scratch, ctx.precision);
    for (int64_t t = 0; t < n; ++t) {
      float* row = ws.qa.data() + t * s.q_lora_rank;
      rms_norm_row(row, w_.q_a_norm->f32(), s.q_lora_rank, s.mla_norm_eps, row);
    }
    matmul(ctx.pool, w_.q_b->view(), ws.qa.data(), n, ws.q.data(), ctx.scratch, ctx.precision);
  } else {
    const WeightView wv[2] = {w_.q->view(), w_.kv_a->view()};
    float* const outs[2] = {ws.q.data(), ws.kva.data()};
    matmul_multi(ctx.pool, wv, outs, 2, h, n, ctx.scratch, ctx.precision);
  }
  const int64_t half = static_cast<int64_t>(s.rope_inv_freq.size());
  std::vector<float> cos_sin(static_cast<std::size_t>(2 * half));
  for (int64_t t = 0; t < n; ++t) {
    rope_cos_sin(pos0 + t, s.rope_inv_freq.data(), half, s.rope_attention_factor, cos_sin.data());
    float* q = ws.q.data() + t * nh * qk;
    for (int64_t hd = 0; hd < nh; ++hd) rope_part(s, s.rope_interleaved, q + hd * qk + nope, cos_sin.data());
    const float* src = ws.kva.data() + t * kva_w;
    float* row = kv.plane(layer, 0, pos0 + t);
    rms_norm_row(src, w_.kv_a_norm->f32(), r, s.mla_norm_eps, row);
    std::memcpy(row + r, src + r, static_cast<std::size_t>(rope) * sizeof(float));
    rope_part(s, s.rope_interleaved, row + r, cos_sin.data());
  }
}

// The query rows [q_abs | q_rope] per (token, head), attention over the latent cache, and
// the value up-projection into ws.heads [n][heads * v].
void MlaAttention::absorb_and_attend(const AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t pos0,
                                     int64_t n, const KeySelection* selection) {
  const ModelSpec& s = s_;
  MlaWorkspace& ws = ctx.ws;
  const int64_t nh = s.n_heads, nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim, qk = nope + rope;
  const int64_t r = s.kv_lora_rank, kd = r + rope, vd = s.v_head_dim;
  ws.qrow.resize(static_cast<std::size_t>(n * nh * kd));
  // q_abs[t][h] = W_UK[h]^T q_nope[t][h]: rows of attn_k_b are W_UK^T's.
  head_matmul(ctx, w_.k_b->view(), nh, ws.q.data(), nh * qk, qk, n, ws.qrow.data(), nh * kd, kd);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hd = 0; hd < nh; ++hd)
      std::memcpy(ws.qrow.data() + (t * nh + hd) * kd + r, ws.q.data() + (t * nh + hd) * qk + nope,
                  static_cast<std::size_t>(rope) * sizeof(float));

  // One task per (token, group of heads): each head's output is computed by one thread,
  // keys summed in position order, so the result does not depend on the team or the
  // grouping. A decode step (one token) splits its heads over the team.
  const float scale = s.attention_scale > 0 ? s.attention_scale : 1.0f / std::sqrt(static_cast<float>(qk));
  const int64_t ctx_len = kv.context_length(), team = ctx.pool.size();
  const int64_t per_task = n >= team ? nh : std::max<int64_t>(1, (nh + team - 1) / team);
  const int64_t groups = (nh + per_task - 1) / per_task;
  ws.lat.resize(static_cast<std::size_t>(n * nh * r));
  ws.scores.resize(static_cast<std::size_t>(team * per_task * ctx_len));
  ctx.pool.parallel_for(n * groups, 1, [&](int64_t begin, int64_t end, int thread) {
    float* scores = ws.scores.data() + thread * per_task * ctx_len;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / groups, h0 = (task % groups) * per_task, h1 = std::min(nh, h0 + per_task);
      const std::vector<int32_t>* keys = selection ? &selection->keys[static_cast<std::size_t>(t)] : nullptr;
      const bool subset = keys && !keys->empty();
      const int64_t n_keys = subset ? static_cast<int64_t>(keys->size()) : pos0 + t + 1;
      latent_attention_ref(ws.qrow.data() + t * nh * kd, h0, h1, kv, layer, subset ? keys->data() : nullptr,
                           n_keys, kd, r, scale, scores, ws.lat.data() + t * nh * r);
    }
  });
  ws.heads.resize(static_cast<std::size_t>(n * nh * vd));
  head_matmul(ctx, w_.v_b->view(), nh, ws.lat.data(), nh * r, r, n, ws.heads.data(), nh * vd, vd);
}

void MlaAttention::forward(const AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t pos0, int64_t n,
                           const float* h, float* out, KeySelection& selection) {
  project(ctx, kv, layer, pos0, n, h);
  const KeySelection* sel = nullptr;
  if (s_.index_n_heads > 0) {
    if (indexer_) indexer_->select(ctx, kv, layer, pos0, n, h, ctx.ws.qa.data(), selection);
    if (static_cast<int64_t>(selection.keys.size()) != n)
      fail(ErrorKind::Internal, "layer " + std::to_string(layer) + " reuses a DSA selection no layer made");
    sel = &selection;
  }
  absorb_and_attend(ctx, kv, layer, pos0, n, sel);
  matmul(ctx.pool, w_.o->view(), ctx.ws.heads.data(), n, out, ctx.scratch, ctx.precision);
}

}  // namespace colibri
