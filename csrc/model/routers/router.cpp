#include "model/routers/router.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "common/errors.hpp"

namespace colibri {

std::unique_ptr<Router> make_softmax_topk(const RouterSpec& spec);        // softmax_topk.cpp
std::unique_ptr<Router> make_sigmoid_grouped(const RouterSpec& spec);     // sigmoid_grouped.cpp
std::unique_ptr<Router> make_softmax_group_limited(const RouterSpec& spec);  // group_limited.cpp
std::unique_ptr<Router> make_sqrt_softplus(const RouterSpec& spec);       // sqrt_softplus.cpp

namespace {

[[noreturn]] void bad(const std::string& what) {
  fail(ErrorKind::InvalidArgument, "model spec: router " + what);
}

}  // namespace

std::unique_ptr<Router> make_router(const RouterSpec& s) {
  if (s.n_experts <= 0 || s.top_k <= 0 || s.top_k > s.n_experts)
    bad("needs 0 < top_k <= n_experts (top_k " + std::to_string(s.top_k) + ", n_experts " +
        std::to_string(s.n_experts) + ")");
  if (!(s.scaling > 0.0f)) bad("scaling (routed_scaling_factor) must be > 0");
  switch (s.kind) {
    case RouterKind::SoftmaxTopK:
      return make_softmax_topk(s);
    case RouterKind::SqrtSoftplusTopK:
      return make_sqrt_softplus(s);
    case RouterKind::SigmoidGroupedTopK:
    case RouterKind::SoftmaxGroupLimited: {
      if (s.n_group <= 0 || s.n_experts % s.n_group != 0)
        bad("n_group " + std::to_string(s.n_group) + " must divide n_experts " + std::to_string(s.n_experts));
      if (s.topk_group <= 0 || s.topk_group > s.n_group)
        bad("needs 0 < topk_group <= n_group (topk_group " + std::to_string(s.topk_group) + ")");
      const int64_t per_group = s.n_experts / s.n_group;
      if (s.kind == RouterKind::SigmoidGroupedTopK && s.n_group > 1 && per_group < 2)
        bad("groups must hold at least 2 experts (a group scores its two best)");
      if (s.top_k > s.topk_group * per_group)
        bad("top_k " + std::to_string(s.top_k) + " exceeds the experts of the kept groups (" +
            std::to_string(s.topk_group * per_group) + ")");
      return s.kind == RouterKind::SigmoidGroupedTopK ? make_sigmoid_grouped(s) : make_softmax_group_limited(s);
    }
  }
  bad("kind " + std::to_string(static_cast<int>(s.kind)) + " is unknown");
}

void top_k_indices(const float* v, int64_t n, int64_t k, std::vector<int32_t>& order) {
  order.resize(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [v](int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  order.resize(static_cast<std::size_t>(k));
}

void finish_weights(const RouterSpec& s, float* w) {
  if (s.norm_topk_prob) {
    float sum = 0.0f;
    for (int64_t j = 0; j < s.top_k; ++j) sum += w[j];
    const float denom = sum + 1e-20f;
    for (int64_t j = 0; j < s.top_k; ++j) w[j] /= denom;
  }
  if (s.scaling != 1.0f)
    for (int64_t j = 0; j < s.top_k; ++j) w[j] *= s.scaling;
}

}  // namespace colibri
