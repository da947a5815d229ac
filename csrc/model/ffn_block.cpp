// Feed-forward blocks: the dense SwiGLU FFN and the MoE block (the layer's routing rule,
// model/routers/, then the routed experts and the optional shared expert).
//
// Determinism: each token's expert outputs are summed in the router's order (slot 0 first),
// whatever order the experts were computed in, so batching tokens by expert (each distinct
// expert runs once for all the tokens routed to it) never changes the result.
#include "model/ffn_block.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "common/clock.hpp"
#include "common/errors.hpp"
#include "model/ops.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

namespace {

constexpr int64_t kPrefetchMaxTokens = 8;  // lookahead only for decode-sized batches
// SiLU(gate) * up over the team from this many elements (a verify's 9 x 1536): one region
// (~1 us) against ~4 ns an element for the caller alone, while the workers would idle.
constexpr int64_t kParallelSiluElems = 4096;

// gpt-oss's router bias: part of the logits (a Linear with bias), so the rule selects
// and weighs with it.
void add_router_logit_bias(const FfnWeights& W, float* logits, int64_t n, int64_t ne) {
  if (W.router_logit_bias == nullptr) return;
  const float* b = W.router_logit_bias->f32();
  for (int64_t t = 0; t < n; ++t) add_inplace(logits + t * ne, b, ne);
}

// Adds bias[c] to every row's column c of x [n, width].
void add_row_bias(float* x, const float* bias, int64_t n, int64_t width) {
  for (int64_t t = 0; t < n; ++t) add_inplace(x + t * width, bias, width);
}

// The distinct experts that layer W's routing rule (bias and groups included) picks for
// n rows of router logits (n x ne), in first-chosen order: what a prefetch asks for.
// The rule may rewrite the logits in place (route() takes them mutable).
std::vector<int32_t> distinct_routed(const FfnWeights& W, float* logits, int64_t n, int64_t ne, int64_t k) {
  add_router_logit_bias(W, logits, n, ne);
  const float* bias = W.router_bias ? W.router_bias->f32() : nullptr;
  std::vector<int32_t> chosen(static_cast<std::size_t>(k)), picked;
  std::vector<float> unused(static_cast<std::size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    W.route->route(logits + t * ne, bias, chosen.data(), unused.data());
    for (int32_t e : chosen)
      if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
  }
  return picked;
}

// Token `id`'s experts in a hash layer (its row of W.hash_eid).
void hash_row(const FfnWeights& W, int32_t id, int64_t k, int32_t* experts) {
  const float* row = W.hash_eid->f32() + static_cast<int64_t>(id) * k;
  for (int64_t j = 0; j < k; ++j) experts[j] = static_cast<int32_t>(row[j]);
}

// The distinct experts of n tokens in a hash layer, in first-seen order.
std::vector<int32_t> hash_experts(const FfnWeights& W, const int32_t* ids, int64_t n, int64_t k) {
  std::vector<int32_t> row(static_cast<std::size_t>(k)), picked;
  for (int64_t t = 0; t < n; ++t) {
    hash_row(W, ids[t], k, row.data());
    for (int32_t e : row)
      if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
  }
  return picked;
}

// blk.{i}.ffn_hash_eid: (vocab, k), every entry a whole number in [0, n_experts).
const Tensor* resolve_hash_table(const ModelSpec& s, const WeightStore& weights, int64_t i) {
  const Tensor* t = &weights.get("blk." + std::to_string(i) + ".ffn_hash_eid");
  check_shape(t, s.vocab_size, s.n_experts_per_tok);
  const float* v = t->f32();
  for (int64_t j = 0; j < s.vocab_size * s.n_experts_per_tok; ++j)
    if (!(v[j] >= 0.0f && v[j] < static_cast<float>(s.n_experts) && v[j] == std::floor(v[j])))
      fail(ErrorKind::Format, "tensor '" + t->name + "' holds " + std::to_string(v[j]) +
                                  ", not an expert id in [0, " + std::to_string(s.n_experts) + ")");
  return t;
}

void mm(FfnContext& ctx, const Tensor& w, const float* x, int64_t n, float* y) {
  matmul(ctx.pool, w.view(), x, n, y, ctx.matmul, ctx.precision);
}

// Predicted experts less those computed elsewhere: this side never reads them.
std::vector<int32_t> local_only(const FfnContext& ctx, int64_t layer, std::vector<int32_t> experts) {
  if (ctx.remote != nullptr)
    experts.erase(std::remove_if(experts.begin(), experts.end(),
                                 [&](int32_t e) { return ctx.remote->owns(layer, e); }),
                  experts.end());
  return experts;
}

// Expert e's rows of the layer's expert biases (none when the model has none).
ExpertBiases expert_biases(const ModelSpec& s, const FfnWeights& W, int32_t e) {
  ExpertBiases eb;
  if (W.gate_exps_bias) {
    eb.gate = W.gate_exps_bias->f32() + static_cast<int64_t>(e) * s.moe_intermediate_size;
    eb.up = W.up_exps_bias->f32() + static_cast<int64_t>(e) * s.moe_intermediate_size;
    eb.down = W.down_exps_bias->f32() + static_cast<int64_t>(e) * s.hidden_size;
  }
  return eb;
}

// Forgets a started remote batch when the MoE block unwinds before finishing it.
struct RemoteGuard {
  RemoteExperts* remote = nullptr;
  ~RemoteGuard() {
    if (remote) remote->cancel();
  }
};

}  // namespace

FfnBlock::FfnBlock(const ModelSpec& spec) : spec_(spec) {
  const ModelSpec& s = spec_;
  if (std::any_of(s.moe_layers.begin(), s.moe_layers.end(), [](uint8_t b) { return b; }) || s.n_mtp_layers > 0) {
    RouterSpec rs;
    rs.kind = s.router;
    rs.n_experts = s.n_experts;
    rs.top_k = s.n_experts_per_tok;
    rs.norm_topk_prob = s.norm_topk_prob;
    rs.scaling = s.routed_scaling_factor;
    rs.n_group = s.n_group;
    rs.topk_group = s.topk_group;
    router_ = make_router(rs);
  }
  if (s.activation == FfnActivation::SwigluOai && !(s.swiglu_limit > 0.0f && std::isfinite(s.swiglu_alpha)))
    fail(ErrorKind::InvalidArgument, "the clamped SwiGLU needs a limit > 0 and a finite alpha");
  guess_delta_.assign(static_cast<std::size_t>(s.hidden_size), 0.0f);
}

FfnWeights FfnBlock::resolve(const WeightStore& weights, int64_t i, bool moe) const {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size;
  auto req = [&](const std::string& name) { return &weights.get(name); };
  auto opt = [&](const std::string& name) { return weights.find(name); };
  const std::string p = "blk." + std::to_string(i) + ".";
  FfnWeights W;
  W.layer = i;
  W.is_moe = moe;
  if (!W.is_moe) {
    const int64_t f = s.intermediate_size;
    W.dense = {req(p + "ffn_gate"), req(p + "ffn_up"), req(p + "ffn_down")};
    check_shape(W.dense.gate, f, d);
    check_shape(W.dense.up, f, d);
    check_shape(W.dense.down, d, f);
    return W;
  }
  W.router = req(p + "ffn_gate_inp");
  check_shape(W.router, s.n_experts, d);
  W.route = router_.get();
  W.router_bias = opt(p + "exp_probs_b");
  if (W.router_bias) {
    if (s.router != RouterKind::SigmoidGroupedTopK && s.router != RouterKind::SqrtSoftplusTopK)
      fail(ErrorKind::Format, "tensor '" + W.router_bias->name +
                                  "' (a selection bias) is only used by the sigmoid and sqrt-softplus routers");
    check_shape(W.router_bias, 1, s.n_experts);
  }
  if (!s.hash_layers.empty() && s.hash_layers[static_cast<std::size_t>(i)]) W.hash_eid = resolve_hash_table(s, weights, i);
  if (s.router_logit_bias) {
    W.router_logit_bias = req(p + "ffn_gate_inp.bias");
    check_shape(W.router_logit_bias, 1, s.n_experts);
    W.router_logit_bias->f32();  // refuses any other type now, not at the first forward
  }
  if (s.expert_bias) {
    const int64_t f = s.moe_intermediate_size;
    W.gate_exps_bias = req(p + "ffn_gate_exps.bias");
    W.up_exps_bias = req(p + "ffn_up_exps.bias");
    W.down_exps_bias = req(p + "ffn_down_exps.bias");
    check_shape(W.gate_exps_bias, s.n_experts, f);
    check_shape(W.up_exps_bias, s.n_experts, f);
    check_shape(W.down_exps_bias, s.n_experts, d);
    for (const Tensor* b : {W.gate_exps_bias, W.up_exps_bias, W.down_exps_bias}) b->f32();
  }
  if (s.shared_expert_intermediate_size > 0) {
    const int64_t sf = s.shared_expert_intermediate_size;
    W.shared = {req(p + "ffn_gate_shexp"), req(p + "ffn_up_shexp"), req(p + "ffn_down_shexp")};
    check_shape(W.shared.gate, sf, d);
    check_shape(W.shared.up, sf, d);
    check_shape(W.shared.down, d, sf);
    W.shared_gate = opt(p + "ffn_gate_inp_shexp");
    if (W.shared_gate) check_shape(W.shared_gate, 1, d);
  }
  return W;
}

void FfnBlock::forward(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n, int32_t* routing_out,
                       float* out) {
  if (!W.is_moe) {
    const auto t0 = std::chrono::steady_clock::now();
    expert_ffn(ctx, W.dense.views(), h, n, spec_.intermediate_size, out);
    ctx.phase[kDense] += seconds_since(t0);
    return;
  }
  try {
    moe_block(ctx, W, h, n, routing_out, out);
  } catch (...) {
    ctx.store.abort();  // every read waited for or cancelled: the model keeps serving
    throw;
  }
}

void FfnBlock::expert_ffn(FfnContext& ctx, const ExpertViews& e, const float* x, int64_t n, int64_t ffn, float* out,
                          const ExpertBiases& bias) {
  gate_.resize(static_cast<std::size_t>(n * ffn));
  up_.resize(static_cast<std::size_t>(n * ffn));
  const WeightView w[2] = {e.gate, e.up};
  float* const gate_up[2] = {gate_.data(), up_.data()};
  matmul_multi(ctx.pool, w, gate_up, 2, x, n, ctx.matmul, ctx.precision);
  if (bias.gate) add_row_bias(gate_.data(), bias.gate, n, ffn);
  if (bias.up) add_row_bias(up_.data(), bias.up, n, ffn);
  activate(ctx, n * ffn);
  matmul(ctx.pool, e.down, gate_.data(), n, out, ctx.matmul, ctx.precision);
  if (bias.down) add_row_bias(out, bias.down, n, spec_.hidden_size);
}

// gate_ = act(gate_, up_) over the first `elems` values, elementwise: the same bits in any
// split over the team.
void FfnBlock::activate(FfnContext& ctx, int64_t elems) {
  float* gate = gate_.data();
  const float* up = up_.data();
  const FfnActivation act = spec_.activation;
  const float limit = spec_.swiglu_limit, alpha = spec_.swiglu_alpha;
  auto run = [=](int64_t b, int64_t e) {
    if (act == FfnActivation::SwigluOai)
      swiglu_oai_mul(gate + b, up + b, e - b, limit, alpha);
    else if (act == FfnActivation::SwigluClamp)
      swiglu_clamp_mul(gate + b, up + b, e - b, limit);
    else
      silu_mul(gate + b, up + b, e - b);
  };
  if (elems >= kParallelSiluElems && ctx.pool.size() > 1)
    ctx.pool.parallel_for(elems, (elems + 2 * ctx.pool.size() - 1) / (2 * ctx.pool.size()),
                          [&run](int64_t b, int64_t e, int) { run(b, e); });
  else
    run(0, elems);
}

// The shared expert's FFN over every token, into shared_out_ (its gate and the sum come
// later, in moe_block).
void FfnBlock::shared_expert(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n) {
  shared_out_.resize(static_cast<std::size_t>(n * spec_.hidden_size));
  expert_ffn(ctx, W.shared.views(), h, n, spec_.shared_expert_intermediate_size, shared_out_.data());
}

// The lookahead: the next MoE layer's router applied to this layer's FFN input predicts
// which experts it will want; their reads start now and overlap this layer's compute.
void FfnBlock::predict_next(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n) {
  const ModelSpec& s = spec_;
  if (!ctx.store.settings().prefetch || W.next_moe == nullptr || n > kPrefetchMaxTokens) return;
  const int64_t ne = s.n_experts, k = s.n_experts_per_tok;
  const FfnWeights& next = *W.next_moe;
  if (next.hash_eid) {  // a hash layer's experts are known from the token ids alone: exact
    if (ctx.token_ids)
      ctx.store.prefetch(next.layer, local_only(ctx, next.layer, hash_experts(next, ctx.token_ids, n, k)));
    return;
  }
  next_router_.resize(static_cast<std::size_t>(n * ne));
  mm(ctx, *next.router, h, n, next_router_.data());
  // The next layer's whole rule (its bias and groups included), not an approximation.
  ctx.store.prefetch(next.layer, local_only(ctx, next.layer, distinct_routed(next, next_router_.data(), n, ne, k)));
}

// The first-layer guess (issue 14, "the per-token gap"): nothing predicts the first MoE
// layer's experts, so between the last layer's reads of one token and the first layer's
// router of the next (the LM head, sampling, embedding, any leading dense layers and the
// first MoE layer's attention) the disk has nothing to read. Just before that layer's
// attention, x holds each row's residual stream exactly (the embedding when the
// layer is layer 0; after the dense layers otherwise: a dense FFN depends on the token, so
// the guess waits for it), and the layer's FFN input is that plus its attention over the
// context, a part that varies slowly from token to token. The guess adds the previous
// forward's attention part (remember_first_input) and runs the layer's own norm and
// routing rule (bias and groups included), then queues the experts as prefetches with
// their own governor. Only a guess: which reads start early, never a logit.
void FfnBlock::guess_first_layer(FfnContext& ctx, const Tensor& ffn_norm, const FfnWeights& W, const float* x,
                                 int64_t n) {
  const ModelSpec& s = spec_;
  guess_base_.clear();
  if (n <= 0) return;
  const int64_t d = s.hidden_size;
  guess_base_.assign(x + (n - 1) * d, x + n * d);
  const StoreSettings& st = ctx.store.settings();
  if (!st.prefetch || !st.first_layer_guess || n > kPrefetchMaxTokens || ctx.store.empty()) return;
  // The engine's first forward has no attention part to add: a guess from the residual
  // alone is a poor one, and its outcomes would open the governor's window.
  if (!have_guess_delta_) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t ne = s.n_experts, k = s.n_experts_per_tok;
  guess_h_.resize(static_cast<std::size_t>(n * d));
  std::vector<float> row(static_cast<std::size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * d;
    for (int64_t i = 0; i < d; ++i)
      row[static_cast<std::size_t>(i)] = xt[i] + guess_delta_[static_cast<std::size_t>(i)];
    rms_norm_row(row.data(), ffn_norm.f32(), d, s.rms_norm_eps, guess_h_.data() + t * d);
  }
  next_router_.resize(static_cast<std::size_t>(n * ne));
  mm(ctx, *W.router, guess_h_.data(), n, next_router_.data());
  ctx.store.prefetch(W.layer, local_only(ctx, W.layer, distinct_routed(W, next_router_.data(), n, ne, k)),
                     /*first=*/true);
  ctx.phase[kRouter] += seconds_since(t0);
}

void FfnBlock::prefetch_hash_layer(FfnContext& ctx, const FfnWeights& W, int64_t n) {
  if (!ctx.store.settings().prefetch || W.hash_eid == nullptr || ctx.token_ids == nullptr || n > kPrefetchMaxTokens ||
      ctx.store.empty())
    return;
  ctx.store.prefetch(W.layer, local_only(ctx, W.layer, hash_experts(W, ctx.token_ids, n, spec_.n_experts_per_tok)));
}

void FfnBlock::remember_first_input(const float* x, int64_t n) {
  const int64_t d = spec_.hidden_size;
  if (guess_base_.size() != static_cast<std::size_t>(d) || n <= 0) return;
  const float* last = x + (n - 1) * d;
  for (int64_t i = 0; i < d; ++i)
    guess_delta_[static_cast<std::size_t>(i)] = last[i] - guess_base_[static_cast<std::size_t>(i)];
  have_guess_delta_ = true;
}

// Batch union: each distinct routed expert runs once over all the tokens routed to it, and
// each result is parked in its (token, slot) place of slot_out_. Experts already in the
// cache go first, so the reads of the missing ones overlap their compute; the compute then
// waits only for the expert it needs next. When the cache cannot hold every expert of the
// layer at once (a prefill over many experts with a small budget) they go in waves.
void FfnBlock::routed_experts(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n,
                              const std::vector<int32_t>& sel, bool* shared_pending) {
  const ModelSpec& s = spec_;
  ExpertStore& store = ctx.store;
  const int64_t layer = W.layer, d = s.hidden_size, k = s.n_experts_per_tok;
  std::vector<int32_t> distinct(sel);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  slot_out_.resize(static_cast<std::size_t>(n * k * d));
  xe_.resize(static_cast<std::size_t>(n * d));
  ye_.resize(static_cast<std::size_t>(n * d));
  // Experts computed elsewhere go out first: the workers compute while this side does
  // (the shared expert now, whose sum comes after the routed one either way, then the
  // local experts).
  RemoteGuard remote;
  if (start_remote(ctx, W, h, n, sel, &distinct)) {
    remote.remote = ctx.remote;
    if (*shared_pending) {
      const auto t0 = std::chrono::steady_clock::now();
      shared_expert(ctx, W, h, n);
      *shared_pending = false;
      ctx.phase[kDense] += seconds_since(t0);
    }
  }
  store.settle(layer, distinct);
  std::stable_partition(distinct.begin(), distinct.end(),
                        [&](int32_t e) { return store.cached(layer, e); });

  std::vector<int64_t> slots;
  std::size_t next_request = 0, next_compute = 0;
  bool predicted = false;
  while (next_compute < distinct.size()) {
    auto t0 = std::chrono::steady_clock::now();
    while (next_request < distinct.size() && store.request(layer, distinct[next_request])) ++next_request;
    if (next_request == next_compute)
      fail(ErrorKind::Internal, "the expert cache has no free slot for layer " + std::to_string(layer));
    if (!predicted) {
      predicted = true;
      if (next_request == distinct.size()) predict_next(ctx, W, h, n);  // only when this layer fits
    }
    ctx.phase[kRouter] += seconds_since(t0);

    const int32_t e = distinct[next_compute++];
    if (*shared_pending && !store.ready(layer, e)) {
      // The read of the next expert is still running: compute the shared expert now
      // instead of after the routed ones, so the disk works meanwhile.
      t0 = std::chrono::steady_clock::now();
      shared_expert(ctx, W, h, n);
      *shared_pending = false;
      ctx.phase[kDense] += seconds_since(t0);
    }
    t0 = std::chrono::steady_clock::now();
    // The team parks while the disk works (no core spins on a read); only an explicit
    // `spin` policy keeps it spinning.
    std::optional<ThreadPool::IdleScope> idle;
    if (ctx.pool.settings().policy != WaitPolicy::Spin && !store.ready(layer, e)) idle.emplace(ctx.pool);
    std::optional<ActivityClock::Scope> waiting(std::in_place, store.activity(), false);  // not compute
    const ExpertViews& w = store.wait(layer, e);
    waiting.reset();
    idle.reset();
    ctx.phase[kExpertWait] += seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
    slots.clear();
    for (int64_t i = 0; i < n * k; ++i)
      if (sel[static_cast<std::size_t>(i)] == e) slots.push_back(i);
    const auto m = static_cast<int64_t>(slots.size());
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(xe_.data() + r * d, h + (slots[static_cast<std::size_t>(r)] / k) * d,
                  static_cast<std::size_t>(d) * sizeof(float));
    expert_ffn(ctx, w, xe_.data(), m, s.moe_intermediate_size, ye_.data(), expert_biases(s, W, e));
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(slot_out_.data() + slots[static_cast<std::size_t>(r)] * d, ye_.data() + r * d,
                  static_cast<std::size_t>(d) * sizeof(float));
    store.release(layer, e);
    store.pump_prefetch();  // reads finished meanwhile: idle capacity for the lookahead
    ctx.phase[kExpertMatmul] += seconds_since(t0);
  }
  if (remote.remote) {
    finish_remote(ctx);
    remote.remote = nullptr;
  }
}

bool FfnBlock::start_remote(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n,
                            const std::vector<int32_t>& sel, std::vector<int32_t>* distinct) {
  if (ctx.remote == nullptr) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t layer = W.layer, d = spec_.hidden_size, k = spec_.n_experts_per_tok;
  RemoteBatch& b = remote_;
  b.layer = layer;
  b.experts.clear();
  b.counts.clear();
  b.rows.clear();
  remote_slots_.clear();
  std::vector<int32_t> local;
  for (int32_t e : *distinct) {
    if (!ctx.remote->owns(layer, e)) {
      local.push_back(e);
      continue;
    }
    // The same rows in the same order as the local path would give this expert.
    int64_t m = 0;
    for (int64_t i = 0; i < n * k; ++i)
      if (sel[static_cast<std::size_t>(i)] == e) {
        const float* row = h + (i / k) * d;
        b.rows.insert(b.rows.end(), row, row + d);
        remote_slots_.push_back(i);
        ++m;
      }
    b.experts.push_back(e);
    b.counts.push_back(m);
  }
  distinct->swap(local);
  if (b.experts.empty()) return false;
  ctx.remote->start(b);
  ctx.phase[kRouter] += seconds_since(t0);
  return true;
}

// Waits for the remote batch and parks each row's result in its (token, slot) place.
void FfnBlock::finish_remote(FfnContext& ctx) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t d = spec_.hidden_size;
  remote_out_.resize(remote_slots_.size() * static_cast<std::size_t>(d));
  ctx.remote->finish(remote_, remote_out_.data());
  for (std::size_t r = 0; r < remote_slots_.size(); ++r)
    std::memcpy(slot_out_.data() + remote_slots_[r] * d, remote_out_.data() + static_cast<int64_t>(r) * d,
                static_cast<std::size_t>(d) * sizeof(float));
  ctx.phase[kExpertWait] += seconds_since(t0);
}

void FfnBlock::compute_experts(FfnContext& ctx, const FfnWeights& W, const std::vector<int32_t>& experts,
                               const std::vector<int64_t>& counts, const float* rows, float* out) {
  const ModelSpec& s = spec_;
  const int64_t layer = W.layer, d = s.hidden_size;
  if (!W.is_moe) fail(ErrorKind::InvalidArgument, "layer " + std::to_string(layer) + " has no routed experts");
  if (experts.size() != counts.size())
    fail(ErrorKind::InvalidArgument, "compute_experts: give one row count per expert");
  ExpertStore& store = ctx.store;
  int64_t row = 0;
  try {
    for (std::size_t i = 0; i < experts.size(); ++i) {
      const int32_t e = experts[i];
      const int64_t m = counts[i];
      if (e < 0 || e >= s.n_experts || m < 0)
        fail(ErrorKind::InvalidArgument, "compute_experts: expert " + std::to_string(e) + " with " +
                                             std::to_string(m) + " rows is out of range");
      if (m == 0) continue;
      auto t0 = std::chrono::steady_clock::now();
      if (!store.request(layer, e))
        fail(ErrorKind::Internal, "the expert cache has no free slot for layer " + std::to_string(layer));
      const ExpertViews& w = store.wait(layer, e);
      ctx.phase[kExpertWait] += seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      // Through xe_ and ye_ as in routed_experts: the kernels see the same buffers' rows.
      xe_.assign(rows + row * d, rows + (row + m) * d);
      ye_.resize(static_cast<std::size_t>(m * d));
      expert_ffn(ctx, w, xe_.data(), m, s.moe_intermediate_size, ye_.data(), expert_biases(s, W, e));
      std::memcpy(out + row * d, ye_.data(), static_cast<std::size_t>(m * d) * sizeof(float));
      store.release(layer, e);
      row += m;
      ctx.phase[kExpertMatmul] += seconds_since(t0);
    }
  } catch (...) {
    store.abort();
    throw;
  }
}

void FfnBlock::moe_block(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n, int32_t* routing_out,
                         float* out) {
  const ModelSpec& s = spec_;
  const int64_t layer = W.layer, d = s.hidden_size, ne = s.n_experts, k = s.n_experts_per_tok;
  auto t0 = std::chrono::steady_clock::now();
  router_logits_.resize(static_cast<std::size_t>(n * ne));
  mm(ctx, *W.router, h, n, router_logits_.data());
  add_router_logit_bias(W, router_logits_.data(), n, ne);

  // Route with the layer's rule. The choice and weights for token t are
  // (sel[t*k + j], weight[t*k + j]), best first.
  std::vector<int32_t> sel(static_cast<std::size_t>(n * k));
  std::vector<float> weight(static_cast<std::size_t>(n * k));
  const float* bias = W.router_bias ? W.router_bias->f32() : nullptr;
  if (W.hash_eid && ctx.token_ids == nullptr)
    fail(ErrorKind::Internal, "layer " + std::to_string(layer) + " routes by token id but the forward gave none");
  for (int64_t t = 0; t < n; ++t) {
    if (W.hash_eid) {
      hash_row(W, ctx.token_ids[t], k, sel.data() + t * k);
      hash_route_weights(W.route->spec(), router_logits_.data() + t * ne, sel.data() + t * k, weight.data() + t * k);
    } else {
      W.route->route(router_logits_.data() + t * ne, bias, sel.data() + t * k, weight.data() + t * k);
    }
    if (routing_out && layer < s.n_layers)
      for (int64_t j = 0; j < k; ++j) routing_out[(t * s.n_layers + layer) * k + j] = sel[static_cast<std::size_t>(t * k + j)];
  }
  ctx.phase[kRouter] += seconds_since(t0);

  // The shared expert has no read to wait for: routed_experts runs it while a routed
  // expert's read is in flight (none: here). Its result is added after the routed sum
  // either way, so when it ran changes no bit.
  bool shared_pending = s.shared_expert_intermediate_size > 0;
  routed_experts(ctx, W, h, n, sel, &shared_pending);

  t0 = std::chrono::steady_clock::now();
  if (shared_pending) shared_expert(ctx, W, h, n);
  std::fill_n(out, n * d, 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j)
      add_scaled_inplace(out + t * d, slot_out_.data() + (t * k + j) * d,
                         weight[static_cast<std::size_t>(t * k + j)], d);

  if (s.shared_expert_intermediate_size > 0) {
    for (int64_t t = 0; t < n; ++t) {
      float g = 1.0f;
      if (W.shared_gate) {
        float logit = 0.0f;
        mm(ctx, *W.shared_gate, h + t * d, 1, &logit);
        g = 1.0f / (1.0f + std::exp(-logit));
      }
      add_scaled_inplace(out + t * d, shared_out_.data() + t * d, g, d);
    }
  }
  ctx.phase[kDense] += seconds_since(t0);
}

}  // namespace colibri
