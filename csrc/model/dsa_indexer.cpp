#include "model/dsa_indexer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/errors.hpp"
#include "model/kv_cache.hpp"
#include "model/ops.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

namespace {

constexpr float kKeyNormEps = 1e-6f;  // the indexer's LayerNorm (reference: nn.LayerNorm(eps=1e-6))

void check(const Tensor* t, int64_t rows, int64_t cols) {
  if (t->rows != rows || t->cols != cols)
    fail(ErrorKind::Format, "tensor '" + t->name + "' is " + std::to_string(t->rows) + "x" +
                                std::to_string(t->cols) + " but the config implies " + std::to_string(rows) +
                                "x" + std::to_string(cols));
}

}  // namespace

DsaIndexer::DsaIndexer(const ModelSpec& s, const WeightStore& ws, int64_t layer) : s_(s) {
  const std::string p = "blk." + std::to_string(layer) + ".indexer.";
  const int64_t d = s.hidden_size, ih = s.index_n_heads, id = s.index_head_dim;
  if (s.q_lora_rank <= 0)
    fail(ErrorKind::Unsupported, "a DSA indexer needs the q-LoRA latent (q_lora_rank > 0)");
  if (id < s.qk_rope_head_dim)
    fail(ErrorKind::InvalidArgument, "model spec: index_head_dim is smaller than qk_rope_head_dim");
  w_.q_b = &ws.get(p + "attn_q_b");
  check(w_.q_b, ih * id, s.q_lora_rank);
  w_.k = &ws.get(p + "attn_k");
  check(w_.k, id, d);
  w_.k_norm = &ws.get(p + "k_norm");
  check(w_.k_norm, 1, id);
  w_.k_norm_bias = &ws.get(p + "k_norm.bias");
  check(w_.k_norm_bias, 1, id);
  w_.proj = &ws.get(p + "proj");
  check(w_.proj, ih, d);
}

void DsaIndexer::select(const AttentionContext& ctx, KvCache& kv, int64_t layer, int64_t pos0, int64_t n,
                        const float* h, const float* q_latent, KeySelection& out) {
  const ModelSpec& s = s_;
  MlaWorkspace& ws = ctx.ws;
  const int64_t ih = s.index_n_heads, id = s.index_head_dim, topk = s.index_topk;
  ws.iq.resize(static_cast<std::size_t>(n * ih * id));
  ws.ik.resize(static_cast<std::size_t>(n * id));
  ws.iw.resize(static_cast<std::size_t>(n * ih));
  matmul(ctx.pool, w_.q_b->view(), q_latent, n, ws.iq.data(), ctx.scratch, ctx.precision);
  {  // the key and the head weights read the same input
    const WeightView wv[2] = {w_.k->view(), w_.proj->view()};
    float* const outs[2] = {ws.ik.data(), ws.iw.data()};
    matmul_multi(ctx.pool, wv, outs, 2, h, n, ctx.scratch, ctx.precision);
  }
  const int64_t half = static_cast<int64_t>(s.rope_inv_freq.size());
  std::vector<float> cos_sin(static_cast<std::size_t>(2 * half));
  auto rope = [&](float* x) {
    if (s.index_rope_interleaved)
      rope_head_interleaved(x, cos_sin.data(), 2 * half);
    else
      rope_head(x, cos_sin.data(), 2 * half);
  };
  for (int64_t t = 0; t < n; ++t) {
    rope_cos_sin(pos0 + t, s.rope_inv_freq.data(), half, s.rope_attention_factor, cos_sin.data());
    for (int64_t hd = 0; hd < ih; ++hd) rope(ws.iq.data() + (t * ih + hd) * id);
    float* key = kv.plane(layer, 1, pos0 + t);
    layer_norm_row(ws.ik.data() + t * id, w_.k_norm->f32(), w_.k_norm_bias->f32(), id, kKeyNormEps, key);
    rope(key);
  }

  out.keys.assign(static_cast<std::size_t>(n), {});
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(ih));
  const float dot_scale = 1.0f / std::sqrt(static_cast<float>(id));
  const int64_t ctx_len = kv.context_length();
  ws.iscores.resize(static_cast<std::size_t>(ctx.pool.size() * ctx_len));
  // One task per query: its scores and its selection are computed by one thread in a
  // fixed order (heads summed in index order), independent of the team.
  ctx.pool.parallel_for(n, 1, [&](int64_t begin, int64_t end, int thread) {
    float* score = ws.iscores.data() + thread * ctx_len;
    std::vector<int32_t> order;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n_keys = pos0 + t + 1;
      if (n_keys <= topk) continue;  // every key: the empty list
      const float* q = ws.iq.data() + t * ih * id;
      const float* w = ws.iw.data() + t * ih;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* k = kv.plane(layer, 1, j);
        float acc = 0.0f;
        for (int64_t hd = 0; hd < ih; ++hd) {
          const float dot = dot_lanes8(q + hd * id, k, id);
          acc += (w[hd] * head_scale) * std::max(dot * dot_scale, 0.0f);
        }
        score[j] = acc;
      }
      order.resize(static_cast<std::size_t>(n_keys));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + topk, order.end(), [score](int32_t a, int32_t b) {
        return score[a] > score[b] || (score[a] == score[b] && a < b);
      });
      std::vector<int32_t>& keys = out.keys[static_cast<std::size_t>(t)];
      keys.assign(order.begin(), order.begin() + topk);
      std::sort(keys.begin(), keys.end());
    }
  });
}

}  // namespace colibri
