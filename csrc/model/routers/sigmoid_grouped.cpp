// Sigmoid scores with bias-corrected, group-limited selection (DeepSeek-V3's "noaux_tc",
// Kimi-K2, GLM-4.5 and later):
//
//   score  = sigmoid(logit)                    weights come from these
//   choice = score + e_score_correction_bias   selection uses these
//   groups: n_group equal groups of experts; a group's value is the sum of its two best
//           choices; keep the topk_group best groups, drop the others' experts
//   top k of choice among the kept experts; weight = score, renormalized when
//   norm_topk_prob (sum + 1e-20), times routed_scaling_factor.
#include <cmath>
#include <limits>
#include <vector>

#include "model/routers/router.hpp"

namespace colibri {

namespace {

class SigmoidGroupedTopK final : public Router {
 public:
  using Router::Router;

  void route(float* logits, const float* bias, int32_t* experts, float* weights) const override {
    const int64_t ne = spec_.n_experts, k = spec_.top_k;
    float* score = logits;  // in place: logits -> sigmoid scores
    for (int64_t e = 0; e < ne; ++e) score[e] = 1.0f / (1.0f + std::exp(-score[e]));
    thread_local std::vector<float> choice;
    choice.resize(static_cast<std::size_t>(ne));
    for (int64_t e = 0; e < ne; ++e) choice[static_cast<std::size_t>(e)] = score[e] + (bias ? bias[e] : 0.0f);

    const int64_t ng = spec_.n_group;
    if (ng > 1 && spec_.topk_group < ng) {
      const int64_t per = ne / ng;
      thread_local std::vector<float> group_value;
      thread_local std::vector<int32_t> order;
      group_value.resize(static_cast<std::size_t>(ng));
      for (int64_t g = 0; g < ng; ++g) {
        top_k_indices(choice.data() + g * per, per, 2, order);
        group_value[static_cast<std::size_t>(g)] =
            choice[static_cast<std::size_t>(g * per + order[0])] + choice[static_cast<std::size_t>(g * per + order[1])];
      }
      top_k_indices(group_value.data(), ng, spec_.topk_group, order);
      thread_local std::vector<uint8_t> keep;
      keep.assign(static_cast<std::size_t>(ng), 0);
      for (int32_t g : order) keep[static_cast<std::size_t>(g)] = 1;
      for (int64_t e = 0; e < ne; ++e)
        if (!keep[static_cast<std::size_t>(e / per)])
          choice[static_cast<std::size_t>(e)] = -std::numeric_limits<float>::infinity();
    }
    thread_local std::vector<int32_t> best;
    top_k_indices(choice.data(), ne, k, best);
    for (int64_t j = 0; j < k; ++j) {
      experts[j] = best[static_cast<std::size_t>(j)];
      weights[j] = score[experts[j]];
    }
    finish_weights(spec_, weights);
  }
};

}  // namespace

std::unique_ptr<Router> make_sigmoid_grouped(const RouterSpec& spec) {
  return std::make_unique<SigmoidGroupedTopK>(spec);
}

}  // namespace colibri
