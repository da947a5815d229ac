// The decoder layer of a model with hyper-connections (DeepSeek-V4; model/hyper_conn.hpp):
// ws_.x holds spec.hc_mult streams of hidden values per row. Each block (attention, then
// FFN) reads the collapse of the streams, normed as usual, and its output is spread back
// over them with the mixing matrix. The collapses and expansions are timed as their own
// phase (kHyperConn), the blocks as decoder_layer times them.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/clock.hpp"
#include "model/engine.hpp"
#include "model/ops.hpp"

namespace colibri {

void Engine::hc_expand_embedding(int64_t n) {
  const int64_t d = spec_.hidden_size, hc = spec_.hc_mult;
  // Backwards, so row t's streams never overwrite a row not yet copied (ws_.x holds the
  // embedding rows [0, n) at its start).
  for (int64_t t = n - 1; t >= 0; --t)
    for (int64_t k = hc - 1; k >= 0; --k)
      std::memmove(ws_.x.data() + (t * hc + k) * d, ws_.x.data() + t * d, static_cast<std::size_t>(d) * sizeof(float));
}

void Engine::hc_collapse_head(int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t d = spec_.hidden_size;
  ws_.h.resize(static_cast<std::size_t>(n * d));
  hc_head(spec_, hc_head_, ws_.x.data(), n, ws_.h.data(), hc_tmp_);
  std::copy_n(ws_.h.data(), n * d, ws_.x.data());
  phase_[kHyperConn] += seconds_since(t0);
}

void Engine::decoder_layer_hc(const LayerWeights& L, const std::vector<AttnSegment>& segs, int64_t kv_layer,
                              int64_t n, AttentionContext& actx, FfnContext& fctx, int32_t* routing_out,
                              const std::function<void()>& between) {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size;
  if (L.ffn.layer == first_moe_) ffn_.prefetch_hash_layer(fctx, L.ffn, n);  // hash layers only
  auto t0 = std::chrono::steady_clock::now();
  ws_.ffn_out.resize(static_cast<std::size_t>(n * d));
  float* collapsed = ws_.ffn_out.data();  // the block's input before its norm
  hc_collapse(s, L.attn_hc, ws_.x.data(), n, collapsed, hc_mix_);
  phase_[kHyperConn] += seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < n; ++t)
    rms_norm_row(collapsed + t * d, L.attn_norm->f32(), d, s.rms_norm_eps, ws_.h.data() + t * d);
  store_->pump_prefetch();
  L.attention->forward_segments(actx, ws_.h.data(), segs, kv_layer, d, ws_.proj.data());
  store_->pump_prefetch();
  phase_[kAttention] += seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  hc_expand(s, hc_mix_, ws_.proj.data(), n, ws_.x.data(), hc_tmp_);
  hc_collapse(s, L.ffn_hc, ws_.x.data(), n, collapsed, hc_mix_);
  phase_[kHyperConn] += seconds_since(t0);
  for (int64_t t = 0; t < n; ++t)
    rms_norm_row(collapsed + t * d, L.ffn_norm->f32(), d, s.rms_norm_eps, ws_.h.data() + t * d);
  between();
  ffn_.forward(fctx, L.ffn, ws_.h.data(), n, routing_out, ws_.proj.data());
  t0 = std::chrono::steady_clock::now();
  hc_expand(s, hc_mix_, ws_.proj.data(), n, ws_.x.data(), hc_tmp_);
  phase_[kHyperConn] += seconds_since(t0);
}

}  // namespace colibri
