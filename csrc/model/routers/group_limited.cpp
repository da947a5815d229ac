// DeepSeek-V2's "group_limited_greedy": softmax over all experts; a group's value is its
// best expert's probability; keep the topk_group best groups (the others' experts drop out
// of the selection: the reference sets them to 0, below every probability), take the top k; weight = probability, renormalized
// when norm_topk_prob, times routed_scaling_factor.
#include <vector>

#include "model/ops.hpp"
#include "model/routers/router.hpp"

namespace colibri {

namespace {

class SoftmaxGroupLimited final : public Router {
 public:
  using Router::Router;

  void route(float* logits, const float* bias, int32_t* experts, float* weights) const override {
    (void)bias;  // no correction bias in this rule (the source layer refuses one)
    const int64_t ne = spec_.n_experts, k = spec_.top_k, ng = spec_.n_group, per = ne / ng;
    float* p = logits;
    softmax(p, ne);
    thread_local std::vector<float> masked;
    masked.assign(p, p + ne);
    if (ng > 1 && spec_.topk_group < ng) {
      thread_local std::vector<float> group_value;
      thread_local std::vector<int32_t> order;
      group_value.resize(static_cast<std::size_t>(ng));
      for (int64_t g = 0; g < ng; ++g) {
        float best = p[g * per];
        for (int64_t i = 1; i < per; ++i) best = p[g * per + i] > best ? p[g * per + i] : best;
        group_value[static_cast<std::size_t>(g)] = best;
      }
      top_k_indices(group_value.data(), ng, spec_.topk_group, order);
      thread_local std::vector<uint8_t> keep;
      keep.assign(static_cast<std::size_t>(ng), 0);
      for (int32_t g : order) keep[static_cast<std::size_t>(g)] = 1;
      for (int64_t e = 0; e < ne; ++e)
        if (!keep[static_cast<std::size_t>(e / per)]) masked[static_cast<std::size_t>(e)] = -1.0f;
    }
    thread_local std::vector<int32_t> best;
    top_k_indices(masked.data(), ne, k, best);
    for (int64_t j = 0; j < k; ++j) {
      experts[j] = best[static_cast<std::size_t>(j)];
      weights[j] = p[experts[j]];
    }
    finish_weights(spec_, weights);
  }
};

}  // namespace

std::unique_ptr<Router> make_softmax_group_limited(const RouterSpec& spec) {
  return std::make_unique<SoftmaxGroupLimited>(spec);
}

}  // namespace colibri
