#include "model/attn_mla.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "attention/attention.hpp"
#include "common/errors.hpp"
#include "model/dsa_indexer.hpp"
#include "model/ops.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

namespace {

void rope_part(const ModelSpec& s, float* x, const float* cos_sin) {
  if (s.mla_no_rope) return;  // Kimi-Linear: the rope part of q and k stays as projected
  const auto rot = static_cast<int64_t>(s.rope_inv_freq.size()) * 2;
  if (s.rope_interleaved)
    rope_head_interleaved(x, cos_sin, rot);
  else
    rope_head(x, cos_sin, rot);
}

// Head h's rows [h*rows, (h+1)*rows) of an F8_E4M3 weight: its block scales start at the
// head's first row block (the loader gives MLA's split kv_b_proj one scale row per row, so
// heads always begin on a block; anything else is refused).
BlockScales head_scales(const WeightView& w, int64_t rows, int64_t h) {
  const BlockScales& s = w.scales;
  if (s.block_rows <= 0 || rows % s.block_rows != 0)
    fail(ErrorKind::Unsupported, "an F8_E4M3 per-head weight needs its heads to start on a scale block (" +
                                     std::to_string(rows) + " rows per head, blocks of " +
                                     std::to_string(s.block_rows) + ")");
  const int64_t first = h * (rows / s.block_rows) * scale_cols(w.cols, s.block_cols);
  return BlockScales{static_cast<const unsigned char*>(s.data) + first * 4, s.block_rows, s.block_cols};
}

}  // namespace

void head_matmul(AttentionContext& ctx, const WeightView& w, int64_t n_heads, const float* x,
                 int64_t x_token_stride, int64_t x_head_stride, int64_t n, float* y, int64_t y_token_stride,
                 int64_t y_head_stride) {
  const int64_t rows = w.rows / n_heads, cols = w.cols;
  const std::size_t rb = row_bytes(w.type, cols);
  AttentionScratch& ws = ctx.scratch;
  const auto team = static_cast<std::size_t>(ctx.pool.size());
  if (ws.gather.size() < team) ws.gather.resize(team);
  if (ws.thread_matmul.size() < team) ws.thread_matmul.resize(team);
  const TypeKernels& k = kernels(w.type, ctx.precision);
  ctx.pool.parallel_for(n_heads, 1, [&](int64_t begin, int64_t end, int thread) {
    std::vector<float>& buf = ws.gather[static_cast<std::size_t>(thread)];
    buf.resize(static_cast<std::size_t>(n * (cols + rows)));
    float* xin = buf.data();
    float* yout = buf.data() + n * cols;
    for (int64_t h = begin; h < end; ++h) {
      for (int64_t t = 0; t < n; ++t)
        std::memcpy(xin + t * cols, x + t * x_token_stride + h * x_head_stride,
                    static_cast<std::size_t>(cols) * sizeof(float));
      WeightView wh = w;  // the head's rows (a row-lane weight's heads are whole groups: rows % 8 == 0)
      wh.rows = rows;
      wh.data = static_cast<const uint8_t*>(w.data) + h * rows * rb;
      wh.scales = {};
      if (w.type == DType::F8_E4M3) wh.scales = head_scales(w, rows, h);
      // Inside the region the matmul runs on this member alone, with its own scratch.
      matmul_with(ctx.pool, k, wh, xin, n, yout, ws.thread_matmul[static_cast<std::size_t>(thread)]);
      for (int64_t t = 0; t < n; ++t)
        std::memcpy(y + t * y_token_stride + h * y_head_stride, yout + t * rows,
                    static_cast<std::size_t>(rows) * sizeof(float));
    }
  });
}

MlaAttention::MlaAttention(const ModelSpec& s, const WeightStore& ws, int64_t layer) : s_(s) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  const int64_t d = s.hidden_size, nh = s.n_heads, qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
  auto req = [&](const std::string& name, int64_t rows, int64_t cols) {
    const Tensor* t = &ws.get(name);
    check_shape(t, rows, cols);
    return t;
  };
  if (s.q_lora_rank > 0) {
    w_.q_a = req(p + "attn_q_a", s.q_lora_rank, d);
    w_.q_a_norm = req(p + "attn_q_a_norm", 1, s.q_lora_rank);
    w_.q_b = req(p + "attn_q_b", nh * qk, s.q_lora_rank);
  } else {
    w_.q = req(p + "attn_q", nh * qk, d);
  }
  w_.kv_a = req(p + "attn_kv_a_mqa", s.kv_lora_rank + s.qk_rope_head_dim, d);
  w_.kv_a_norm = req(p + "attn_kv_a_norm", 1, s.kv_lora_rank);
  w_.k_b = req(p + "attn_k_b", nh * s.kv_lora_rank, s.qk_nope_head_dim);
  w_.v_b = req(p + "attn_v_b", nh * s.v_head_dim, s.kv_lora_rank);
  w_.o = req(p + "attn_output", d, nh * s.v_head_dim);
  sparse_ = s.index_n_heads > 0;
  const bool full = sparse_ && (layer >= s.n_layers || s.indexer_full[static_cast<std::size_t>(layer)] != 0);
  if (full) indexer_ = std::make_unique<DsaIndexer>(s, ws, layer);
}

MlaAttention::~MlaAttention() = default;

KvLayerLayout MlaAttention::kv_layout() const {
  KvLayerLayout l{1, s_.kv_lora_rank + s_.qk_rope_head_dim, 0, 0};
  if (indexer_) {
    l.v_heads = 1;
    l.v_dim = s_.index_head_dim;
  }
  return l;
}

// Projections, norms and RoPE; the latent rows go to the cache, the query rows to mla_q.
void MlaAttention::project(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv,
                           int64_t layer) {
  const ModelSpec& s = s_;
  AttentionScratch& ws = ctx.scratch;
  const int64_t nh = s.n_heads, nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim, qk = nope + rope;
  const int64_t r = s.kv_lora_rank, kva_w = r + rope;
  ws.mla_q.resize(static_cast<std::size_t>(n * nh * qk));
  ws.mla_kva.resize(static_cast<std::size_t>(n * kva_w));
  if (w_.q_a) {  // q_a and kv_a read the same input: one parallel region for both
    ws.mla_qa.resize(static_cast<std::size_t>(n * s.q_lora_rank));
    const WeightView wv[2] = {w_.q_a->view(), w_.kv_a->view()};
    float* const outs[2] = {ws.mla_qa.data(), ws.mla_kva.data()};
    matmul_multi(ctx.pool, wv, outs, 2, x, n, ctx.matmul, ctx.precision);
    for (int64_t t = 0; t < n; ++t) {
      float* row = ws.mla_qa.data() + t * s.q_lora_rank;
      rms_norm_row(row, w_.q_a_norm->f32(), s.q_lora_rank, s.mla_norm_eps, row);
    }
    matmul(ctx.pool, w_.q_b->view(), ws.mla_qa.data(), n, ws.mla_q.data(), ctx.matmul, ctx.precision);
  } else {
    const WeightView wv[2] = {w_.q->view(), w_.kv_a->view()};
    float* const outs[2] = {ws.mla_q.data(), ws.mla_kva.data()};
    matmul_multi(ctx.pool, wv, outs, 2, x, n, ctx.matmul, ctx.precision);
  }
  const int64_t half = static_cast<int64_t>(s.rope_inv_freq.size());
  ws.rope.resize(static_cast<std::size_t>(2 * half));
  ws.mla_row.resize(static_cast<std::size_t>(kva_w));
  float* cos_sin = ws.rope.data();
  float* row = ws.mla_row.data();
  for (int64_t t = 0; t < n; ++t) {
    rope_cos_sin(pos0 + t, s.rope_inv_freq.data(), half, s.rope_attention_factor, cos_sin);
    float* q = ws.mla_q.data() + t * nh * qk;
    for (int64_t hd = 0; hd < nh; ++hd) rope_part(s, q + hd * qk + nope, cos_sin);
    const float* src = ws.mla_kva.data() + t * kva_w;
    rms_norm_row(src, w_.kv_a_norm->f32(), r, s.mla_norm_eps, row);
    std::memcpy(row + r, src + r, static_cast<std::size_t>(rope) * sizeof(float));
    rope_part(s, row + r, cos_sin);
    kv.store_k(layer, pos0 + t, row);
  }
}

void MlaAttention::forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv,
                           int64_t layer, float* out) {
  const ModelSpec& s = s_;
  AttentionScratch& ws = ctx.scratch;
  project(ctx, x, n, pos0, kv, layer);
  if (indexer_) indexer_->select(ctx, x, ws.mla_qa.data(), n, pos0, kv, layer);
  if (sparse_ && static_cast<int64_t>(ws.dsa_offsets.size()) != n + 1)
    fail(ErrorKind::Internal, "layer " + std::to_string(layer) + " reuses a DSA selection no layer made");

  const int64_t nh = s.n_heads, nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim, qk = nope + rope;
  const int64_t r = s.kv_lora_rank, kd = r + rope, vd = s.v_head_dim;
  // The query rows [q_abs | q_rope]: q_abs[t][h] = W_UK[h]^T q_nope[t][h], attn_k_b's rows.
  ws.mla_qrow.resize(static_cast<std::size_t>(n * nh * kd));
  head_matmul(ctx, w_.k_b->view(), nh, ws.mla_q.data(), nh * qk, qk, n, ws.mla_qrow.data(), nh * kd, kd);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hd = 0; hd < nh; ++hd)
      std::memcpy(ws.mla_qrow.data() + (t * nh + hd) * kd + r, ws.mla_q.data() + (t * nh + hd) * qk + nope,
                  static_cast<std::size_t>(rope) * sizeof(float));

  // MQA over the latent cache: one KV head, every query head in its group, the value the
  // first kv_lora_rank values of each key row.
  ws.mla_lat.resize(static_cast<std::size_t>(n * nh * r));
  attn::Problem p;
  p.n_queries = n;
  p.n_kv_heads = 1;
  p.group = nh;
  p.dk = kd;
  p.dv = r;
  p.scale = s.attention_scale > 0 ? s.attention_scale : 1.0f / std::sqrt(static_cast<float>(qk));
  p.q = ws.mla_qrow.data();
  p.q_stride = nh * kd;
  p.q_head_stride = kd;
  p.out = ws.mla_lat.data();
  p.out_stride = nh * r;
  p.out_head_stride = r;
  p.k = attn::KvSide{kv.type(), kv.k(layer, 0), kv.k_row_bytes(layer), 0};
  p.v = p.k;
  p.pos0 = pos0;
  if (sparse_) {  // every DSA query takes the sparse path, so batching never changes its bits
    p.key_index = ws.dsa_keys.data();
    p.key_offsets = ws.dsa_offsets.data();
    p.n_positions = pos0 + n;
  }
  attn::run(ctx.pool, p, ws.kernel);

  ws.mla_heads.resize(static_cast<std::size_t>(n * nh * vd));
  head_matmul(ctx, w_.v_b->view(), nh, ws.mla_lat.data(), nh * r, r, n, ws.mla_heads.data(), nh * vd, vd);
  matmul(ctx.pool, w_.o->view(), ws.mla_heads.data(), n, out, ctx.matmul, ctx.precision);
}

}  // namespace colibri
