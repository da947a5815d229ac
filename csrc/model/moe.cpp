// Feed-forward blocks: the dense SwiGLU FFN and the MoE block (the layer's routing rule,
// model/routers/, then the routed experts and the optional shared expert).
//
// Determinism: each token's expert outputs are summed in the router's order (slot 0 first),
// whatever order the experts were computed in, so batching tokens by expert (each distinct
// expert runs once for all the tokens routed to it) never changes the result.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "model/engine.hpp"
#include "common/clock.hpp"
#include "common/errors.hpp"
#include "model/ops.hpp"

namespace colibri {

namespace {

constexpr int64_t kPrefetchMaxTokens = 8;  // lookahead only for decode-sized batches
// SiLU(gate) * up over the team from this many elements (a verify's 9 x 1536): one region
// (~1 us) against ~4 ns an element for the caller alone, while the workers would idle.
constexpr int64_t kParallelSiluElems = 4096;

// The distinct experts that layer L's routing rule (bias and groups included) picks for
// n rows of router logits (n x ne), in first-chosen order: what a prefetch asks for.
// The rule may rewrite the logits in place (route() takes them mutable).
std::vector<int32_t> distinct_routed(const LayerWeights& L, float* logits, int64_t n, int64_t ne, int64_t k) {
  const float* bias = L.router_bias ? L.router_bias->f32() : nullptr;
  std::vector<int32_t> chosen(static_cast<std::size_t>(k)), picked;
  std::vector<float> unused(static_cast<std::size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    L.route->route(logits + t * ne, bias, chosen.data(), unused.data());
    for (int32_t e : chosen)
      if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
  }
  return picked;
}

}  // namespace

void Engine::expert_ffn(const ExpertViews& e, const float* x, int64_t n, int64_t ffn, float* out) {
  ws_.gate.resize(static_cast<std::size_t>(n * ffn));
  ws_.up.resize(static_cast<std::size_t>(n * ffn));
  const WeightView w[2] = {e.gate, e.up};
  float* const gate_up[2] = {ws_.gate.data(), ws_.up.data()};
  matmul_multi(pool_, w, gate_up, 2, x, n, ws_.matmul, precision_);
  float* gate = ws_.gate.data();
  const float* up = ws_.up.data();
  const int64_t elems = n * ffn;
  if (elems >= kParallelSiluElems && pool_.size() > 1)  // elementwise: the same bits in any split
    pool_.parallel_for(elems, (elems + 2 * pool_.size() - 1) / (2 * pool_.size()),
                       [gate, up](int64_t b, int64_t e, int) { silu_mul(gate + b, up + b, e - b); });
  else
    silu_mul(gate, up, elems);
  matmul(pool_, e.down, ws_.gate.data(), n, out, ws_.matmul, precision_);
}

// The shared expert's FFN over every token, into ws_.shared_out (its gate and the sum come
// later, in moe_block).
void Engine::shared_expert(const LayerWeights& L, int64_t n) {
  ws_.shared_out.resize(static_cast<std::size_t>(n * spec_.hidden_size));
  expert_ffn(L.shared.views(), ws_.h.data(), n, spec_.shared_expert_intermediate_size, ws_.shared_out.data());
}

void Engine::ffn_block(const LayerWeights& L, int64_t n) {
  ws_.ffn_out.resize(static_cast<std::size_t>(n * spec_.hidden_size));
  expert_ffn(L.dense.views(), ws_.h.data(), n, spec_.intermediate_size, ws_.ffn_out.data());
}

// The lookahead: the next MoE layer's router applied to this layer's FFN input predicts
// which experts it will want; their reads start now and overlap this layer's compute.
void Engine::predict_next(const LayerWeights& L, int64_t n) {
  const ModelSpec& s = spec_;
  if (!store_->settings().prefetch || L.next_moe < 0 || n > kPrefetchMaxTokens) return;
  const int64_t ne = s.n_experts, k = s.n_experts_per_tok;
  const LayerWeights& next = layers_[static_cast<std::size_t>(L.next_moe)];
  ws_.next_router.resize(static_cast<std::size_t>(n * ne));
  mm(*next.router, ws_.h.data(), n, ws_.next_router.data());
  // The next layer's whole rule (its bias and groups included), not an approximation.
  store_->prefetch(L.next_moe, distinct_routed(next, ws_.next_router.data(), n, ne, k));
}

// The first-layer guess (issue 14, "the per-token gap"): nothing predicts the first MoE
// layer's experts, so between the last layer's reads of one token and the first layer's
// router of the next (the LM head, sampling, embedding, any leading dense layers and the
// first MoE layer's attention) the disk has nothing to read. Just before that layer's
// attention, ws_.x holds each row's residual stream exactly (the embedding when the
// layer is layer 0; after the dense layers otherwise: a dense FFN depends on the token, so
// the guess waits for it), and the layer's FFN input is that plus its attention over the
// context, a part that varies slowly from token to token. The guess adds the previous
// forward's attention part (remember_first_input) and runs the layer's own norm and
// routing rule (bias and groups included), then queues the experts as prefetches with
// their own governor. Only a guess: which reads start early, never a logit.
void Engine::guess_first_layer(int64_t n) {
  const ModelSpec& s = spec_;
  guess_base_.clear();
  if (first_moe_ < 0 || n <= 0) return;
  const int64_t d = s.hidden_size;
  guess_base_.assign(ws_.x.begin() + (n - 1) * d, ws_.x.begin() + n * d);
  const StoreSettings& st = store_->settings();
  if (!st.prefetch || !st.first_layer_guess || n > kPrefetchMaxTokens || store_->empty()) return;
  // The engine's first forward has no attention part to add: a guess from the residual
  // alone is a poor one, and its outcomes would open the governor's window.
  if (!have_guess_delta_) return;
  const auto t0 = std::chrono::steady_clock::now();
  const LayerWeights& L = layers_[static_cast<std::size_t>(first_moe_)];
  const int64_t ne = s.n_experts, k = s.n_experts_per_tok;
  guess_h_.resize(static_cast<std::size_t>(n * d));
  std::vector<float> row(static_cast<std::size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    const float* x = ws_.x.data() + t * d;
    for (int64_t i = 0; i < d; ++i)
      row[static_cast<std::size_t>(i)] = x[i] + guess_delta_[static_cast<std::size_t>(i)];
    rms_norm_row(row.data(), L.ffn_norm->f32(), d, s.rms_norm_eps, guess_h_.data() + t * d);
  }
  ws_.next_router.resize(static_cast<std::size_t>(n * ne));
  mm(*L.router, guess_h_.data(), n, ws_.next_router.data());
  store_->prefetch(first_moe_, distinct_routed(L, ws_.next_router.data(), n, ne, k), /*first=*/true);
  phase_[kRouter] += seconds_since(t0);
}

// ws_.x holds the first MoE layer's FFN input (before its norm): keep what its attention
// added to the last row for the next forward's guess.
void Engine::remember_first_input(int64_t n) {
  const int64_t d = spec_.hidden_size;
  if (guess_base_.size() != static_cast<std::size_t>(d) || n <= 0) return;
  const float* x = ws_.x.data() + (n - 1) * d;
  for (int64_t i = 0; i < d; ++i)
    guess_delta_[static_cast<std::size_t>(i)] = x[i] - guess_base_[static_cast<std::size_t>(i)];
  have_guess_delta_ = true;
}

// Batch union: each distinct routed expert runs once over all the tokens routed to it, and
// each result is parked in its (token, slot) place of ws_.slot_out. Experts already in the
// cache go first, so the reads of the missing ones overlap their compute; the compute then
// waits only for the expert it needs next. When the cache cannot hold every expert of the
// layer at once (a prefill over many experts with a small budget) they go in waves.
void Engine::routed_experts(const LayerWeights& L, int64_t layer, int64_t n, const std::vector<int32_t>& sel,
                            bool* shared_pending) {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size, k = s.n_experts_per_tok;
  std::vector<int32_t> distinct(sel);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  store_->settle(layer, distinct);
  std::stable_partition(distinct.begin(), distinct.end(),
                        [&](int32_t e) { return store_->cached(layer, e); });

  ws_.slot_out.resize(static_cast<std::size_t>(n * k * d));
  ws_.xe.resize(static_cast<std::size_t>(n * d));
  ws_.ye.resize(static_cast<std::size_t>(n * d));
  std::vector<int64_t> slots;
  std::vector<int32_t> inflight;  // requested, not computed yet, in request order
  std::size_t next_request = 0, next_compute = 0;
  bool predicted = false;
  while (next_compute < distinct.size()) {
    auto t0 = std::chrono::steady_clock::now();
    while (next_request < distinct.size() && store_->request(layer, distinct[next_request])) ++next_request;
    if (next_request == next_compute)
      fail(ErrorKind::Internal, "the expert cache has no free slot for layer " + std::to_string(layer));
    if (!predicted) {
      predicted = true;
      if (next_request == distinct.size()) predict_next(L, n);  // only when this layer fits
    }
    phase_[kRouter] += seconds_since(t0);

    const int32_t e = distinct[next_compute++];
    if (*shared_pending && !store_->ready(layer, e)) {
      // The read of the next expert is still running: compute the shared expert now
      // instead of after the routed ones, so the disk works meanwhile.
      t0 = std::chrono::steady_clock::now();
      shared_expert(L, n);
      *shared_pending = false;
      phase_[kDense] += seconds_since(t0);
    }
    t0 = std::chrono::steady_clock::now();
    // The team parks while the disk works (no core spins on a read); only an explicit
    // `spin` policy keeps it spinning.
    std::optional<ThreadPool::IdleScope> idle;
    if (pool_.settings().policy != WaitPolicy::Spin && !store_->ready(layer, e)) idle.emplace(pool_);
    const ExpertViews& w = store_->wait(layer, e);
    idle.reset();
    phase_[kExpertWait] += seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
    slots.clear();
    for (int64_t i = 0; i < n * k; ++i)
      if (sel[static_cast<std::size_t>(i)] == e) slots.push_back(i);
    const auto m = static_cast<int64_t>(slots.size());
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(ws_.xe.data() + r * d, ws_.h.data() + (slots[static_cast<std::size_t>(r)] / k) * d,
                  static_cast<std::size_t>(d) * sizeof(float));
    expert_ffn(w, ws_.xe.data(), m, s.moe_intermediate_size, ws_.ye.data());
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(ws_.slot_out.data() + slots[static_cast<std::size_t>(r)] * d, ws_.ye.data() + r * d,
                  static_cast<std::size_t>(d) * sizeof(float));
    store_->release(layer, e);
    store_->pump_prefetch();  // reads finished meanwhile: idle capacity for the lookahead
    phase_[kExpertMatmul] += seconds_since(t0);
  }
}

void Engine::moe_block(const LayerWeights& L, int64_t layer, int64_t n, int32_t* routing_out) {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size, ne = s.n_experts, k = s.n_experts_per_tok;
  auto t0 = std::chrono::steady_clock::now();
  ws_.router.resize(static_cast<std::size_t>(n * ne));
  mm(*L.router, ws_.h.data(), n, ws_.router.data());

  // Route with the layer's rule. The choice and weights for token t are
  // (sel[t*k + j], weight[t*k + j]), best first.
  std::vector<int32_t> sel(static_cast<std::size_t>(n * k));
  std::vector<float> weight(static_cast<std::size_t>(n * k));
  const float* bias = L.router_bias ? L.router_bias->f32() : nullptr;
  for (int64_t t = 0; t < n; ++t) {
    L.route->route(ws_.router.data() + t * ne, bias, sel.data() + t * k, weight.data() + t * k);
    if (routing_out && layer < s.n_layers)
      for (int64_t j = 0; j < k; ++j) routing_out[(t * s.n_layers + layer) * k + j] = sel[static_cast<std::size_t>(t * k + j)];
  }
  phase_[kRouter] += seconds_since(t0);

  // The shared expert has no read to wait for: routed_experts runs it while a routed
  // expert's read is in flight (none: here). Its result is added after the routed sum
  // either way, so when it ran changes no bit.
  bool shared_pending = s.shared_expert_intermediate_size > 0;
  routed_experts(L, layer, n, sel, &shared_pending);

  t0 = std::chrono::steady_clock::now();
  if (shared_pending) shared_expert(L, n);
  ws_.ffn_out.assign(static_cast<std::size_t>(n * d), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j)
      add_scaled_inplace(ws_.ffn_out.data() + t * d, ws_.slot_out.data() + (t * k + j) * d,
                         weight[static_cast<std::size_t>(t * k + j)], d);

  if (s.shared_expert_intermediate_size > 0) {
    for (int64_t t = 0; t < n; ++t) {
      float g = 1.0f;
      if (L.shared_gate) {
        float logit = 0.0f;
        mm(*L.shared_gate, ws_.h.data() + t * d, 1, &logit);
        g = 1.0f / (1.0f + std::exp(-logit));
      }
      add_scaled_inplace(ws_.ffn_out.data() + t * d, ws_.shared_out.data() + t * d, g, d);
    }
  }
  phase_[kDense] += seconds_since(t0);
}

}  // namespace colibri
