// Feed-forward blocks: the dense SwiGLU FFN and the MoE block (softmax router, top-k,
// optional renormalization, routed experts, optional sigmoid-gated shared expert).
//
// Determinism: each token's expert outputs are summed in the router's order (slot 0 first),
// whatever order the experts were computed in, so batching tokens by expert (each distinct
// expert runs once for all the tokens routed to it) never changes the result.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "model/engine.hpp"
#include "model/ops.hpp"

namespace colibri {

void Engine::expert_ffn(const ExpertWeights& e, const float* x, int64_t n, int64_t ffn, float* out) {
  ws_.gate.resize(static_cast<std::size_t>(n * ffn));
  ws_.up.resize(static_cast<std::size_t>(n * ffn));
  const WeightView w[2] = {e.gate->view(), e.up->view()};
  float* const gate_up[2] = {ws_.gate.data(), ws_.up.data()};
  matmul_multi(pool_, w, gate_up, 2, x, n, ws_.matmul, precision_);
  silu_mul(ws_.gate.data(), ws_.up.data(), n * ffn);
  mm(*e.down, ws_.gate.data(), n, out);
}

void Engine::ffn_block(const LayerWeights& L, int64_t n) {
  ws_.ffn_out.resize(static_cast<std::size_t>(n * spec_.hidden_size));
  expert_ffn(L.dense, ws_.h.data(), n, spec_.intermediate_size, ws_.ffn_out.data());
}

void Engine::moe_block(const LayerWeights& L, int64_t layer, int64_t n, int32_t* routing_out) {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size, ne = s.n_experts, k = s.n_experts_per_tok;
  ws_.router.resize(static_cast<std::size_t>(n * ne));
  mm(*L.router, ws_.h.data(), n, ws_.router.data());

  // Route: softmax over all experts, take the top k (ties to the lower index), renormalize
  // if configured. The choice and weights for token t are (sel[t*k + j], weight[t*k + j]).
  std::vector<int32_t> sel(static_cast<std::size_t>(n * k));
  std::vector<float> weight(static_cast<std::size_t>(n * k));
  std::vector<int32_t> order(static_cast<std::size_t>(ne));
  for (int64_t t = 0; t < n; ++t) {
    float* p = ws_.router.data() + t * ne;
    softmax(p, ne);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [p](int32_t a, int32_t b) {
      return p[a] > p[b] || (p[a] == p[b] && a < b);
    });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += p[order[static_cast<std::size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<std::size_t>(j)];
      sel[static_cast<std::size_t>(t * k + j)] = e;
      weight[static_cast<std::size_t>(t * k + j)] = s.norm_topk_prob ? p[e] / sum : p[e];
      if (routing_out) routing_out[(t * s.n_layers + layer) * k + j] = e;
    }
  }

  // Batch union: run each selected expert once over all its tokens; park each result in
  // its (token, slot) place.
  ws_.slot_out.resize(static_cast<std::size_t>(n * k * d));
  ws_.xe.resize(static_cast<std::size_t>(n * d));
  std::vector<float> ye(static_cast<std::size_t>(n * d));
  std::vector<int64_t> slots;
  for (int64_t e = 0; e < ne; ++e) {
    slots.clear();
    for (int64_t i = 0; i < n * k; ++i)
      if (sel[static_cast<std::size_t>(i)] == e) slots.push_back(i);
    if (slots.empty()) continue;
    const auto m = static_cast<int64_t>(slots.size());
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(ws_.xe.data() + r * d, ws_.h.data() + (slots[static_cast<std::size_t>(r)] / k) * d,
                  static_cast<std::size_t>(d) * sizeof(float));
    expert_ffn(L.experts[static_cast<std::size_t>(e)], ws_.xe.data(), m, s.moe_intermediate_size, ye.data());
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(ws_.slot_out.data() + slots[static_cast<std::size_t>(r)] * d, ye.data() + r * d,
                  static_cast<std::size_t>(d) * sizeof(float));
  }

  ws_.ffn_out.assign(static_cast<std::size_t>(n * d), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j)
      add_scaled_inplace(ws_.ffn_out.data() + t * d, ws_.slot_out.data() + (t * k + j) * d,
                         weight[static_cast<std::size_t>(t * k + j)], d);

  if (s.shared_expert_intermediate_size > 0) {
    expert_ffn(L.shared, ws_.h.data(), n, s.shared_expert_intermediate_size, ye.data());
    for (int64_t t = 0; t < n; ++t) {
      float g = 1.0f;
      if (L.shared_gate) {
        float logit = 0.0f;
        mm(*L.shared_gate, ws_.h.data() + t * d, 1, &logit);
        g = 1.0f / (1.0f + std::exp(-logit));
      }
      add_scaled_inplace(ws_.ffn_out.data() + t * d, ye.data() + t * d, g, d);
    }
  }
}

}  // namespace colibri
