// DeepSeek-V4's routing scores (scoring_func "sqrtsoftplus"), and the weights of V4's hash
// layers for any of its scoring functions:
//
//   score  = sqrt(softplus(logit))              weights come from these
//   choice = score + e_score_correction_bias    selection uses these (top k, no groups)
//   weight = score of the chosen, renormalized when norm_topk_prob (sum + 1e-20), times
//            routed_scaling_factor.
//
// softplus as torch computes it: log1p(exp(x)), and x itself above 20.
#include <cmath>
#include <vector>

#include "model/routers/router.hpp"

namespace colibri {

namespace {

float sqrt_softplus(float x) { return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x))); }

class SqrtSoftplusTopK final : public Router {
 public:
  using Router::Router;

  void route(float* logits, const float* bias, int32_t* experts, float* weights) const override {
    const int64_t ne = spec_.n_experts, k = spec_.top_k;
    float* score = logits;  // in place: logits -> scores
    for (int64_t e = 0; e < ne; ++e) score[e] = sqrt_softplus(score[e]);
    thread_local std::vector<float> choice;
    thread_local std::vector<int32_t> order;
    choice.resize(static_cast<std::size_t>(ne));
    for (int64_t e = 0; e < ne; ++e) choice[static_cast<std::size_t>(e)] = score[e] + (bias ? bias[e] : 0.0f);
    top_k_indices(choice.data(), ne, k, order);
    for (int64_t j = 0; j < k; ++j) {
      experts[j] = order[static_cast<std::size_t>(j)];
      weights[j] = score[order[static_cast<std::size_t>(j)]];
    }
    finish_weights(spec_, weights);
  }
};

}  // namespace

std::unique_ptr<Router> make_sqrt_softplus(const RouterSpec& spec) { return std::make_unique<SqrtSoftplusTopK>(spec); }

void hash_route_weights(const RouterSpec& spec, float* logits, const int32_t* experts, float* weights) {
  const int64_t ne = spec.n_experts;
  switch (spec.kind) {
    case RouterKind::SqrtSoftplusTopK:
      for (int64_t e = 0; e < ne; ++e) logits[e] = sqrt_softplus(logits[e]);
      break;
    case RouterKind::SigmoidGroupedTopK:
      for (int64_t e = 0; e < ne; ++e) logits[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      break;
    default: {  // softmax over every expert
      float mx = logits[0];
      for (int64_t e = 1; e < ne; ++e) mx = logits[e] > mx ? logits[e] : mx;
      float sum = 0.0f;
      for (int64_t e = 0; e < ne; ++e) sum += (logits[e] = std::exp(logits[e] - mx));
      for (int64_t e = 0; e < ne; ++e) logits[e] /= sum;
    }
  }
  for (int64_t j = 0; j < spec.top_k; ++j) weights[j] = logits[experts[j]];
  finish_weights(spec, weights);
}

}  // namespace colibri
