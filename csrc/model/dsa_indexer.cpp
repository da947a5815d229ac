#include "model/dsa_indexer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/errors.hpp"
#include "model/ops.hpp"
#include "quant/kernels.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

namespace {

constexpr float kKeyNormEps = 1e-6f;  // the indexer's LayerNorm (reference: nn.LayerNorm(eps=1e-6))

}  // namespace

DsaIndexer::DsaIndexer(const ModelSpec& s, const WeightStore& ws, int64_t layer) : s_(s) {
  const std::string p = "blk." + std::to_string(layer) + ".indexer.";
  const int64_t d = s.hidden_size, ih = s.index_n_heads, id = s.index_head_dim;
  if (s.q_lora_rank <= 0)
    fail(ErrorKind::Unsupported, "a DSA indexer needs the q-LoRA latent (q_lora_rank > 0)");
  if (id < s.qk_rope_head_dim)
    fail(ErrorKind::InvalidArgument, "model spec: index_head_dim is smaller than qk_rope_head_dim");
  auto req = [&](const std::string& name, int64_t rows, int64_t cols) {
    const Tensor* t = &ws.get(name);
    check_shape(t, rows, cols);
    return t;
  };
  w_.q_b = req(p + "attn_q_b", ih * id, s.q_lora_rank);
  w_.k = req(p + "attn_k", id, d);
  w_.k_norm = req(p + "k_norm", 1, id);
  w_.k_norm_bias = req(p + "k_norm.bias", 1, id);
  w_.proj = req(p + "proj", ih, d);
}

void DsaIndexer::select(AttentionContext& ctx, const float* x, const float* q_latent, int64_t n, int64_t pos0,
                        KvCache& kv, int64_t layer) {
  const ModelSpec& s = s_;
  AttentionScratch& ws = ctx.scratch;
  const int64_t ih = s.index_n_heads, id = s.index_head_dim, topk = s.index_topk;
  ws.dsa_q.resize(static_cast<std::size_t>(n * ih * id));
  ws.dsa_k.resize(static_cast<std::size_t>(n * id));
  ws.dsa_w.resize(static_cast<std::size_t>(n * ih));
  matmul(ctx.pool, w_.q_b->view(), q_latent, n, ws.dsa_q.data(), ctx.matmul, ctx.precision);
  {  // the key and the head weights read the same input
    const WeightView wv[2] = {w_.k->view(), w_.proj->view()};
    float* const outs[2] = {ws.dsa_k.data(), ws.dsa_w.data()};
    matmul_multi(ctx.pool, wv, outs, 2, x, n, ctx.matmul, ctx.precision);
  }
  const int64_t half = static_cast<int64_t>(s.rope_inv_freq.size());
  ws.rope.resize(static_cast<std::size_t>(2 * half));
  float* cos_sin = ws.rope.data();
  auto rope = [&](float* v) {
    if (s.index_rope_interleaved)
      rope_head_interleaved(v, cos_sin, 2 * half);
    else
      rope_head(v, cos_sin, 2 * half);
  };
  for (int64_t t = 0; t < n; ++t) {
    rope_cos_sin(pos0 + t, s.rope_inv_freq.data(), half, s.rope_attention_factor, cos_sin);
    for (int64_t hd = 0; hd < ih; ++hd) rope(ws.dsa_q.data() + (t * ih + hd) * id);
    float* key = ws.dsa_k.data() + t * id;
    layer_norm_row(key, w_.k_norm->f32(), w_.k_norm_bias->f32(), id, kKeyNormEps, key);
    rope(key);
    kv.store_v(layer, pos0 + t, key);
  }
  // Every cached key as F32, as the cache holds it (an F16 / BF16 / Q8_0 cache rounds them).
  const int64_t n_pos = pos0 + n;
  ws.dsa_keys_f32.resize(static_cast<std::size_t>(n_pos * id));
  const TypeKernels& conv = kernels(kv.type());
  for (int64_t j = 0; j < n_pos; ++j) conv.dequantize_row(kv.v(layer, j), ws.dsa_keys_f32.data() + j * id, id);

  // The sparse form: query t owns min(pos0 + t + 1, topk) entries.
  ws.dsa_offsets.assign(static_cast<std::size_t>(n + 1), 0);
  for (int64_t t = 0; t < n; ++t)
    ws.dsa_offsets[static_cast<std::size_t>(t + 1)] =
        ws.dsa_offsets[static_cast<std::size_t>(t)] + std::min(pos0 + t + 1, topk);
  ws.dsa_keys.resize(static_cast<std::size_t>(ws.dsa_offsets.back()));
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(ih));
  const float dot_scale = 1.0f / std::sqrt(static_cast<float>(id));
  const int64_t ctx_len = kv.context_length();
  ws.dsa_scores.resize(static_cast<std::size_t>(ctx.pool.size() * ctx_len));
  // One task per query: its scores and its selection are computed by one thread in a
  // fixed order (heads summed in index order), independent of the team.
  ctx.pool.parallel_for(n, 1, [&](int64_t begin, int64_t end, int thread) {
    float* score = ws.dsa_scores.data() + thread * ctx_len;
    std::vector<int32_t> order;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n_keys = pos0 + t + 1;
      int32_t* keys = ws.dsa_keys.data() + ws.dsa_offsets[static_cast<std::size_t>(t)];
      if (n_keys <= topk) {  // every key, in order
        std::iota(keys, keys + n_keys, 0);
        continue;
      }
      const float* q = ws.dsa_q.data() + t * ih * id;
      const float* w = ws.dsa_w.data() + t * ih;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* k = ws.dsa_keys_f32.data() + j * id;
        float acc = 0.0f;
        for (int64_t hd = 0; hd < ih; ++hd)
          acc += (w[hd] * head_scale) * std::max(dot_lanes8(q + hd * id, k, id) * dot_scale, 0.0f);
        score[j] = acc;
      }
      order.resize(static_cast<std::size_t>(n_keys));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + topk, order.end(), [score](int32_t a, int32_t b) {
        return score[a] > score[b] || (score[a] == score[b] && a < b);
      });
      std::copy(order.begin(), order.begin() + topk, keys);
      std::sort(keys, keys + topk);
    }
  });
}

}  // namespace colibri
