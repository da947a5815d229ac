// The forward passes: one or several sequences (continuous batching) through every layer
// of the trunk (forward_batch), and an MTP layer over its own cache (mtp_forward). Each
// layer is the same decoder_layer: the engine norms the residual stream, runs the layer's
// attention unit (model/attention_layer.hpp) and its FFN (model/ffn_block.hpp), and adds
// their outputs back.
//
// A batch's rows are the tokens of all its sequences one after the other. Everything that
// is per row (embedding, norms, the matmuls' per-row kernels, the router, each token's
// expert sum in router order, the lm_head) gives a row the same bits whatever else is in
// the batch; what is per sequence (RoPE positions, the cache append, attention over the
// sequence's own cache) runs per segment. So forward() is forward_batch() of one row, and
// a request's logits do not depend on the batch it ran in (docs/serving.md; tested in
// tests/generate/test_batch_forward.py).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include "common/clock.hpp"
#include "common/errors.hpp"
#include "model/engine.hpp"
#include "model/forward_stats.hpp"
#include "model/kv_cache.hpp"
#include "model/ops.hpp"

namespace colibri {

namespace {

void check_row(const ModelSpec& s, const BatchRow& r) {
  if (!r.kv) fail(ErrorKind::InvalidArgument, "forward: a batch row has no KV cache");
  if (r.n <= 0) fail(ErrorKind::InvalidArgument, "forward needs at least one token");
  for (int64_t t = 0; t < r.n; ++t) {
    if (r.ids[t] < 0 || r.ids[t] >= s.vocab_size)
      fail(ErrorKind::TokenOutOfRange, "token id " + std::to_string(r.ids[t]) + " at index " +
                                           std::to_string(t) + " is outside the vocabulary [0, " +
                                           std::to_string(s.vocab_size) + ")");
  }
  if (r.pos0 < 0 || r.pos0 + r.n > r.kv->context_length())
    fail(ErrorKind::ContextOverflow,
         "context overflow: the session holds " + std::to_string(r.pos0) + " tokens and " +
             std::to_string(r.n) + " more would exceed the context length of " +
             std::to_string(r.kv->context_length()) +
             " (raise EngineConfig.context_length or start a new session)");
}

}  // namespace

void Engine::forward(KvCache& kv, int64_t pos0, const int32_t* ids, int64_t n, bool all_logits,
                     float* logits_out, int32_t* routing_out, const CancelCheck* cancelled,
                     ForwardStats* stats_out, float* hidden_out) {
  BatchRow row;
  row.kv = &kv;
  row.pos0 = pos0;
  row.ids = ids;
  row.n = n;
  row.all_logits = all_logits;
  row.logits_out = logits_out;
  row.routing_out = routing_out;
  row.hidden_out = hidden_out;
  forward_batch({row}, cancelled, stats_out);
}

void Engine::forward_batch(const std::vector<BatchRow>& rows, const CancelCheck* cancelled,
                           ForwardStats* stats_out) {
  if (rows.empty()) fail(ErrorKind::InvalidArgument, "forward_batch needs at least one sequence");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    check_row(spec_, rows[i]);
    for (std::size_t j = 0; j < i; ++j)
      if (rows[j].kv == rows[i].kv)
        fail(ErrorKind::InvalidArgument, "forward_batch: two rows share one KV cache (one row per session)");
  }
  for (const BatchRow& r : rows) r.kv->reserve(r.pos0 + r.n);  // before any of them is written
  if (rows.size() > 1 && spec_.index_n_heads > 0 && spec_.attention_kind == AttentionKind::Mla) {
    // DSA: a "shared" layer reuses the key selection of the forward's last indexer layer,
    // which is one sequence's; the rows go one after the other.
    for (const BatchRow& r : rows) forward_rows({r}, cancelled, stats_out);
    return;
  }
  forward_rows(rows, cancelled, stats_out);
}

void Engine::forward_rows(const std::vector<BatchRow>& rows, const CancelCheck* cancelled,
                          ForwardStats* stats_out) {
  const ModelSpec& s = spec_;
  std::lock_guard<std::mutex> lock(mu_);
  if (!store_->empty() && store_->slots() == 0)
    fail(ErrorKind::InvalidArgument, "the expert cache is not configured (Engine.configure_store)");
  // Counts this forward's share of the counters even when it throws (a failed read).
  const CounterDeltaScope delta(stats_out, *store_, phase_, /*count_forward=*/true);
  const ActivityClock::Scope computing(store_->activity(), true);  // the per-token breakdown
  const auto t_start = std::chrono::steady_clock::now();
  const double wait_before = phase_[kExpertWait];
  ThreadPool::ComputeScope scope(pool_);
  attn_ws_.dsa_keys.clear();  // a DSA "shared" layer reuses only this forward's selection
  const int64_t d = s.hidden_size, k = s.n_experts_per_tok;
  int64_t n = 0;
  std::vector<AttnSegment> segs;
  segs.reserve(rows.size());
  for (const BatchRow& r : rows) {
    segs.push_back(AttnSegment{r.kv, r.pos0, r.n});
    n += r.n;
  }
  ws_.x.resize(static_cast<std::size_t>(n * d * std::max<int64_t>(1, s.hc_mult)));
  ws_.h.resize(static_cast<std::size_t>(n * d));
  ws_.proj.resize(static_cast<std::size_t>(n * d));
  {
    int64_t row = 0;
    for (const BatchRow& r : rows) {
      get_rows(token_embd_->view(), r.ids, r.n, ws_.x.data() + row * d);
      row += r.n;
    }
  }
  AttentionContext actx{pool_, ws_.matmul, precision_, attn_ws_};
  FfnContext fctx{pool_, ws_.matmul, precision_, *store_, phase_};
  fctx.remote = remote_.get();
  std::vector<int32_t> row_ids;  // every row's token id, for hash-routed layers
  for (const BatchRow& r : rows) row_ids.insert(row_ids.end(), r.ids, r.ids + r.n);
  fctx.token_ids = row_ids.data();
  if (s.hc_mult > 0) hc_expand_embedding(n);
  // The routing of every row in one array (the MoE block writes it by row), split below.
  const bool want_routing =
      k > 0 && std::any_of(rows.begin(), rows.end(), [](const BatchRow& r) { return r.routing_out != nullptr; });
  int32_t* routing = nullptr;
  if (want_routing) {
    ws_.routing.assign(static_cast<std::size_t>(n * s.n_layers * k), -1);
    routing = ws_.routing.data();
  }

  // Between layers, and between each layer's attention and FFN: a prefill chunk's layer is
  // the longest stretch without a check (a fraction of a second).
  const std::function<void()> stop_if_cancelled = [&] {
    if (cancelled && *cancelled && (*cancelled)()) {
      store_->abort();  // prefetches in flight: waited for or cancelled
      fail(ErrorKind::Cancelled, "the forward was interrupted");
    }
  };
  for (int64_t li = 0; li < s.n_layers; ++li) {
    stop_if_cancelled();
    const LayerWeights& L = layers_[static_cast<std::size_t>(li)];
    // The first MoE layer's expert reads start before its attention.
    if (s.hc_mult > 0) {  // hyper-connections: the streams are not one residual row to guess from
      decoder_layer_hc(L, segs, li, n, actx, fctx, routing, stop_if_cancelled);
      continue;
    }
    if (li == first_moe_) ffn_.guess_first_layer(fctx, *L.ffn_norm, L.ffn, ws_.x.data(), n);
    decoder_layer(L, segs, li, n, actx, fctx, routing, stop_if_cancelled);
  }
  if (s.hc_mult > 0) hc_collapse_head(n);
  {
    int64_t row = 0;  // every position's state after the final norm, as transformers' hidden_states[-1]
    for (const BatchRow& r : rows) {
      if (r.hidden_out)
        for (int64_t t = 0; t < r.n; ++t)
          rms_norm_row(ws_.x.data() + (row + t) * d, output_norm_->f32(), d, s.rms_norm_eps, r.hidden_out + t * d);
      row += r.n;
    }
  }
  lm_head(rows);
  if (want_routing) {
    const std::size_t per_token = static_cast<std::size_t>(s.n_layers * k);
    std::size_t row = 0;
    for (const BatchRow& r : rows) {
      if (r.routing_out)
        std::copy_n(ws_.routing.begin() + static_cast<std::ptrdiff_t>(row * per_token),
                    static_cast<std::size_t>(r.n) * per_token, r.routing_out);
      row += static_cast<std::size_t>(r.n);
    }
  }
  choose_wait_policy(phase_[kExpertWait] - wait_before, seconds_since(t_start));
}

void Engine::decoder_layer(const LayerWeights& L, const std::vector<AttnSegment>& segs, int64_t kv_layer, int64_t n,
                           AttentionContext& actx, FfnContext& fctx, int32_t* routing_out,
                           const std::function<void()>& between) {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < n; ++t)
    rms_norm_row(ws_.x.data() + t * d, L.attn_norm->f32(), d, s.rms_norm_eps, ws_.h.data() + t * d);
  // Lookahead reads for this layer still queued in the store: issue what idle I/O capacity
  // allows now, so the disk works through the attention too.
  store_->pump_prefetch();
  L.attention->forward_segments(actx, ws_.h.data(), segs, kv_layer, d, ws_.proj.data());
  store_->pump_prefetch();
  add_inplace(ws_.x.data(), ws_.proj.data(), n * d);
  if (L.ffn.layer == first_moe_) ffn_.remember_first_input(ws_.x.data(), n);
  for (int64_t t = 0; t < n; ++t)
    rms_norm_row(ws_.x.data() + t * d, L.ffn_norm->f32(), d, s.rms_norm_eps, ws_.h.data() + t * d);
  phase_[kAttention] += seconds_since(t0);
  between();
  ws_.ffn_out.resize(static_cast<std::size_t>(n * d));
  ffn_.forward(fctx, L.ffn, ws_.h.data(), n, routing_out, ws_.ffn_out.data());
  add_inplace(ws_.x.data(), ws_.ffn_out.data(), n * d);
}

// The rows that want logits (each row's last position, or all of its positions) through
// the output norm and one lm_head matmul for the whole batch. One row writes its logits in
// place; several go through ws_.logits_rows (a copy: the same bits).
void Engine::lm_head(const std::vector<BatchRow>& rows) {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size, vocab = s.vocab_size;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t row = 0, m = 0;  // row: the batch row of a sequence's first token; m: rows normed
  for (const BatchRow& r : rows) {
    if (r.logits_out) {
      const int64_t first = r.all_logits ? 0 : r.n - 1;
      for (int64_t t = first; t < r.n; ++t, ++m)
        rms_norm_row(ws_.x.data() + (row + t) * d, output_norm_->f32(), d, s.rms_norm_eps, ws_.h.data() + m * d);
    }
    row += r.n;
  }
  if (m == 0) return;  // a prefill chunk before the last one: no logits wanted
  if (rows.size() == 1) {
    mm(*output_, ws_.h.data(), m, rows[0].logits_out);
  } else {
    ws_.logits_rows.resize(static_cast<std::size_t>(m * vocab));
    mm(*output_, ws_.h.data(), m, ws_.logits_rows.data());
    const float* src = ws_.logits_rows.data();
    for (const BatchRow& r : rows) {
      if (!r.logits_out) continue;
      const int64_t count = r.all_logits ? r.n : 1;
      std::memcpy(r.logits_out, src, static_cast<std::size_t>(count * vocab) * sizeof(float));
      src += count * vocab;
    }
  }
  phase_[kLmHead] += seconds_since(t0);
}

void Engine::mtp_forward(int64_t j, KvCache& kv, int64_t slot0, const float* hidden, const int32_t* ids,
                         int64_t n, float* logits_out, float* hidden_out, const CancelCheck* cancelled,
                         ForwardStats* stats_out) {
  const ModelSpec& s = spec_;
  if (j < 0 || j >= static_cast<int64_t>(mtp_.size()))
    fail(ErrorKind::InvalidArgument, "the model has no MTP layer " + std::to_string(j));
  if (n <= 0) fail(ErrorKind::InvalidArgument, "an MTP forward needs at least one row");
  for (int64_t t = 0; t < n; ++t)
    if (ids[t] < 0 || ids[t] >= s.vocab_size)
      fail(ErrorKind::TokenOutOfRange, "token id " + std::to_string(ids[t]) + " is outside the vocabulary");
  if (slot0 < 0 || slot0 + n > kv.context_length())
    fail(ErrorKind::ContextOverflow, "the MTP forward runs past the context length");
  const MtpLayerWeights& M = mtp_[static_cast<std::size_t>(j)];
  kv.reserve(slot0 + n);
  std::lock_guard<std::mutex> lock(mu_);
  if (!store_->empty() && store_->slots() == 0)
    fail(ErrorKind::InvalidArgument, "the expert cache is not configured (Engine.configure_store)");
  // The expert and phase counters of the MTP forward go to the session's figures (not its
  // forward count: that counts trunk forwards).
  const CounterDeltaScope delta(stats_out, *store_, phase_, /*count_forward=*/false);
  const ActivityClock::Scope computing(store_->activity(), true);
  const std::function<void()> stop_if_cancelled = [&] {
    if (cancelled && *cancelled && (*cancelled)()) {
      store_->abort();
      fail(ErrorKind::Cancelled, "the forward was interrupted");
    }
  };
  stop_if_cancelled();
  ThreadPool::ComputeScope scope(pool_);
  attn_ws_.dsa_keys.clear();
  const int64_t d = s.hidden_size;
  const auto nd = static_cast<std::size_t>(n * d);
  ws_.x.resize(nd);
  ws_.h.resize(nd);
  ws_.proj.resize(nd);
  ws_.mtp_cat.resize(2 * nd);
  // [enorm(embedding of the next token) | hnorm(hidden state)] per row, the order of
  // DeepSeek-V3's and transformers' MtpLayer.
  get_rows(M.embed->view(), ids, n, ws_.h.data());
  for (int64_t t = 0; t < n; ++t) {
    float* row = ws_.mtp_cat.data() + t * 2 * d;
    rms_norm_row(ws_.h.data() + t * d, M.enorm->f32(), d, s.rms_norm_eps, row);
    rms_norm_row(hidden + t * d, M.hnorm->f32(), d, s.rms_norm_eps, row + d);
  }
  mm(*M.eh_proj, ws_.mtp_cat.data(), n, ws_.x.data());
  AttentionContext actx{pool_, ws_.matmul, precision_, attn_ws_};
  FfnContext fctx{pool_, ws_.matmul, precision_, *store_, phase_};
  fctx.remote = remote_.get();
  decoder_layer(M.block, {AttnSegment{&kv, slot0, n}}, 0, n, actx, fctx, nullptr, stop_if_cancelled);

  const auto t0 = std::chrono::steady_clock::now();
  const float* last = ws_.x.data() + (n - 1) * d;
  rms_norm_row(last, M.shared_head_norm->f32(), d, s.rms_norm_eps, ws_.h.data());
  if (hidden_out) std::memcpy(hidden_out, ws_.h.data(), static_cast<std::size_t>(d) * sizeof(float));
  if (logits_out) mm(*M.head, ws_.h.data(), 1, logits_out);
  phase_[kLmHead] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Engine::mm(const Tensor& w, const float* x, int64_t n, float* y) {
  matmul(pool_, w.view(), x, n, y, ws_.matmul, precision_);
}

}  // namespace colibri
