#include "model/attn_v4_compressed.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "common/errors.hpp"
#include "model/ops.hpp"
#include "quant/kernels.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

V4CompressedAttention::V4CompressedAttention(const ModelSpec& s, const WeightStore& store, int64_t layer)
    : V4SlidingAttention(s, store, layer) {
  const auto i = static_cast<std::size_t>(layer);
  rate_ = i < s.compress_ratios.size() ? s.compress_ratios[i] : 0;
  csa_ = i < s.csa_layers.size() && s.csa_layers[i] != 0;
  if (rate_ <= 0) fail(ErrorKind::InvalidArgument, "model spec: a V4 compressed layer needs a compression rate > 0");
  const std::string p = "blk." + std::to_string(layer) + ".";
  comp_ = std::make_unique<V4Compressor>(store, p + "attn_compressor_", hidden_, head_dim_, rate_, csa_, eps_);
  entry_floats_ = head_dim_;
  if (!csa_) return;
  index_heads_ = s.index_n_heads;
  index_dim_ = s.index_head_dim;
  index_topk_ = s.index_topk;
  if (index_heads_ <= 0 || index_topk_ <= 0 || index_dim_ < rope_dim_)
    fail(ErrorKind::InvalidArgument,
         "model spec: a V4 compressed sparse attention layer needs index_n_heads > 0, index_topk > 0 and "
         "index_head_dim >= the rotated dimensions");
  index_comp_ = std::make_unique<V4Compressor>(store, p + "indexer_compressor_", hidden_, index_dim_, rate_, true, eps_);
  const Tensor* q_b = &store.get(p + "indexer.attn_q_b");
  check_shape(q_b, index_heads_ * index_dim_, q_lora_);
  const Tensor* proj = &store.get(p + "indexer.proj");
  check_shape(proj, index_heads_, hidden_);
  index_q_b_ = q_b;
  index_proj_ = proj;
  entry_floats_ += index_dim_;
}

KvLayerLayout V4CompressedAttention::kv_layout() const {
  KvLayerLayout l{1, head_dim_, 0, 0, window_};
  l.state_floats = comp_->pending_floats() + (csa_ ? index_comp_->pending_floats() : 0);
  l.comp_rate = rate_;
  l.comp_floats = entry_floats_;
  return l;
}

void V4CompressedAttention::forward(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0, KvCache& kv,
                                    int64_t layer, float* out) {
  if (pos0 > 0 && kv.state_tokens(layer) != pos0)
    fail(ErrorKind::Internal, "V4 compressed layer " + std::to_string(layer) + ": its state holds " +
                                  std::to_string(kv.state_tokens(layer)) + " positions, the forward starts at " +
                                  std::to_string(pos0));
  kv.set_state_tokens(layer, -1);  // until this forward completes
  project(ctx, x, n, pos0);
  AttentionScratch& ws = ctx.scratch;
  float* state = kv.state(layer);
  float* entries = state + kv.layout(layer).state_floats;
  comp_->project(ctx, x, n, ws.v4c_kv, ws.v4c_gate);
  comp_->consume(ws.v4c_kv.data(), ws.v4c_gate.data(), n, pos0, state, entries, entry_floats_, rope_inv_freq_,
                 rope_factor_);
  if (csa_) {
    index_comp_->project(ctx, x, n, ws.v4c_kv, ws.v4c_gate);
    index_comp_->consume(ws.v4c_kv.data(), ws.v4c_gate.data(), n, pos0, state + comp_->pending_floats(),
                         entries + head_dim_, entry_floats_, rope_inv_freq_, rope_factor_);
  }
  select(ctx, x, n, pos0, entries);
  // Stored and attended in passes, as the sliding layers are (attn_v4.cpp).
  const int64_t ring = kv.ring(layer);
  const int64_t pass = ring > 0 ? ring - window_ + 1 : std::max<int64_t>(n, 1);
  for (int64_t i0 = 0; i0 < n; i0 += pass) {
    const int64_t i1 = std::min(n, i0 + pass);
    for (int64_t t = i0; t < i1; ++t) kv.store_k(layer, pos0 + t, ws.k.data() + t * head_dim_);
    attend(ctx, kv, layer, i0, pos0 + i0, i1 - i0, entries);
  }
  project_out(ctx, n, pos0, out);
  kv.set_state_tokens(layer, pos0 + n);
}

void V4CompressedAttention::select(AttentionContext& ctx, const float* x, int64_t n, int64_t pos0,
                                   const float* entries) {
  AttentionScratch& ws = ctx.scratch;
  ws.v4c_off.assign(static_cast<std::size_t>(n + 1), 0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t closed = (pos0 + t + 1) / rate_;
    ws.v4c_off[static_cast<std::size_t>(t + 1)] =
        ws.v4c_off[static_cast<std::size_t>(t)] + (csa_ ? std::min(closed, index_topk_) : closed);
  }
  ws.v4c_sel.resize(static_cast<std::size_t>(ws.v4c_off.back()));
  const int64_t ih = index_heads_, id = index_dim_;
  if (csa_) {  // the indexer's queries ("compress" RoPE at the query's position) and head weights
    ws.v4c_iq.resize(static_cast<std::size_t>(n * ih * id));
    ws.v4c_iw.resize(static_cast<std::size_t>(n * ih));
    matmul(ctx.pool, index_q_b_->view(), ws.mla_qa.data(), n, ws.v4c_iq.data(), ctx.matmul, ctx.precision);
    matmul(ctx.pool, index_proj_->view(), x, n, ws.v4c_iw.data(), ctx.matmul, ctx.precision);
    const auto half = static_cast<int64_t>(rope_inv_freq_.size());
    ws.rope.resize(static_cast<std::size_t>(2 * half));
    for (int64_t t = 0; t < n; ++t) {
      rope_cos_sin(pos0 + t, rope_inv_freq_.data(), half, rope_factor_, ws.rope.data());
      for (int64_t h = 0; h < ih; ++h)
        rope_head_interleaved(ws.v4c_iq.data() + (t * ih + h) * id + id - rope_dim_, ws.rope.data(), rope_dim_);
    }
  }
  const float head_scale = csa_ ? 1.0f / std::sqrt(static_cast<float>(ih)) : 0.0f;
  const float dot_scale = csa_ ? 1.0f / std::sqrt(static_cast<float>(id)) : 0.0f;
  // One task per query, its scores summed over the heads in order: independent of the team.
  ctx.pool.parallel_for(n, 1, [&](int64_t begin, int64_t end, int) {
    std::vector<float> score;
    std::vector<int32_t> order;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t closed = (pos0 + t + 1) / rate_;
      int32_t* sel = ws.v4c_sel.data() + ws.v4c_off[static_cast<std::size_t>(t)];
      if (!csa_ || closed <= index_topk_) {  // every closed entry, in order
        std::iota(sel, sel + closed, 0);
        continue;
      }
      const float* q = ws.v4c_iq.data() + t * ih * id;
      const float* w = ws.v4c_iw.data() + t * ih;
      score.resize(static_cast<std::size_t>(closed));
      for (int64_t s = 0; s < closed; ++s) {
        const float* key = entries + s * entry_floats_ + head_dim_;
        float acc = 0.0f;
        for (int64_t h = 0; h < ih; ++h)
          acc += std::max(dot_lanes8(q + h * id, key, id) * dot_scale, 0.0f) * (w[h] * head_scale);
        score[static_cast<std::size_t>(s)] = acc;
      }
      order.resize(static_cast<std::size_t>(closed));
      std::iota(order.begin(), order.end(), 0);
      const float* sc = score.data();
      std::partial_sort(order.begin(), order.begin() + index_topk_, order.end(), [sc](int32_t a, int32_t b) {
        return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
      });
      std::copy(order.begin(), order.begin() + index_topk_, sel);
      std::sort(sel, sel + index_topk_);
    }
  });
}

void V4CompressedAttention::attend(AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t t0, int64_t pos0,
                                   int64_t n, const float* entries) {
  AttentionScratch& ws = ctx.scratch;
  const int64_t hd = head_dim_, nh = n_heads_, qd = nh * hd;
  // The window rows of this pass as F32, as the cache holds them.
  const int64_t lo = std::max<int64_t>(0, pos0 - window_ + 1), hi = pos0 + n;
  ws.v4c_rows.resize(static_cast<std::size_t>((hi - lo) * hd));
  const TypeKernels& conv = kernels(kv.type());
  for (int64_t p = lo; p < hi; ++p) conv.dequantize_row(kv.k(layer, p), ws.v4c_rows.data() + (p - lo) * hd, hd);
  const float* sinks = w_.sinks->f32();
  // One task per (query, head), its keys in order: independent of the team and the batch.
  ctx.pool.parallel_for(n * nh, 1, [&](int64_t begin, int64_t end, int) {
    std::vector<float> logit;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / nh, h = i % nh, p = pos0 + t, row = t0 + t;
      const float* q = ws.q.data() + row * qd + h * hd;
      const int64_t first = std::max<int64_t>(0, p - window_ + 1), n_win = p - first + 1;
      const int32_t* sel = ws.v4c_sel.data() + ws.v4c_off[static_cast<std::size_t>(row)];
      const int64_t n_sel = ws.v4c_off[static_cast<std::size_t>(row + 1)] - ws.v4c_off[static_cast<std::size_t>(row)];
      auto key = [&](int64_t j) {
        return j < n_win ? ws.v4c_rows.data() + (first + j - lo) * hd : entries + sel[j - n_win] * entry_floats_;
      };
      logit.resize(static_cast<std::size_t>(n_win + n_sel));
      float mx = sinks[h];
      for (int64_t j = 0; j < n_win + n_sel; ++j) {
        logit[static_cast<std::size_t>(j)] = dot_lanes8(q, key(j), hd) * scale_;
        mx = std::max(mx, logit[static_cast<std::size_t>(j)]);
      }
      float sum = std::exp(sinks[h] - mx);
      for (int64_t j = 0; j < n_win + n_sel; ++j) {
        logit[static_cast<std::size_t>(j)] = std::exp(logit[static_cast<std::size_t>(j)] - mx);
        sum += logit[static_cast<std::size_t>(j)];
      }
      float* o = ws.attn.data() + row * qd + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = 0; j < n_win + n_sel; ++j) {
        const float pj = logit[static_cast<std::size_t>(j)] / sum;
        const float* v = key(j);
        for (int64_t c = 0; c < hd; ++c) o[c] += pj * v[c];
      }
    }
  });
}

}  // namespace colibri
