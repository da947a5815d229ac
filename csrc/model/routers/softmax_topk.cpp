// Softmax over all experts, then the k best (Mixtral, Qwen-MoE, OLMoE; DeepSeek-V2's
// topk_method "greedy"). Weights are the softmax probabilities of the chosen experts,
// renormalized when norm_topk_prob, times the scaling factor.
#include <vector>

#include "model/ops.hpp"
#include "model/routers/router.hpp"

namespace colibri {

namespace {

class SoftmaxTopK final : public Router {
 public:
  using Router::Router;

  void route(float* logits, const float* bias, int32_t* experts, float* weights) const override {
    (void)bias;  // no correction bias in this rule (the source layer refuses one)
    const int64_t ne = spec_.n_experts, k = spec_.top_k;
    softmax(logits, ne);
    thread_local std::vector<int32_t> order;
    top_k_indices(logits, ne, k, order);
    for (int64_t j = 0; j < k; ++j) {
      experts[j] = order[static_cast<std::size_t>(j)];
      weights[j] = logits[experts[j]];
    }
    finish_weights(spec_, weights);
  }
};

}  // namespace

std::unique_ptr<Router> make_softmax_topk(const RouterSpec& spec) {
  return std::make_unique<SoftmaxTopK>(spec);
}

}  // namespace colibri
