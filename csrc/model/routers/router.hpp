// Routers: the rule that turns one token's router logits into its routed experts and their
// weights. Each kind is a small unit of its own (one file each), chosen when the model
// loads from the spec (ModelSpec::router); the MoE block and the lookahead prefetch call
// the same object, so a prediction applies exactly the rule the next layer will apply.
//
// Every kind breaks ties the same deterministic way: the higher score first, and between
// equal scores the lower expert (or group) index first.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace colibri {

enum class RouterKind : int {
  // softmax over all experts, top k, optional renormalization, times scaling
  // (Mixtral, Qwen-MoE, OLMoE; DeepSeek-V2 topk_method "greedy").
  SoftmaxTopK = 0,
  // sigmoid scores; selection on score + e_score_correction_bias within the best
  // topk_group of n_group groups (a group scores its two best experts); weights from the
  // raw scores, optional renormalization, times scaling (DeepSeek-V3 "noaux_tc", GLM-4.5+).
  SigmoidGroupedTopK = 1,
  // softmax scores; keep the topk_group groups whose best expert scores highest, top k in
  // them, weights times scaling, optional renormalization (DeepSeek-V2 "group_limited_greedy").
  SoftmaxGroupLimited = 2,
  // sqrt(softplus(logit)) scores; selection on score + e_score_correction_bias, top k, no
  // groups; weights from the scores, optional renormalization, times scaling (DeepSeek-V4).
  SqrtSoftplusTopK = 3,
};

struct RouterSpec {
  RouterKind kind = RouterKind::SoftmaxTopK;
  int64_t n_experts = 0;
  int64_t top_k = 0;
  bool norm_topk_prob = false;  // renormalize the selected weights to sum to 1
  float scaling = 1.0f;         // routed_scaling_factor, multiplies every routed weight
  int64_t n_group = 1;          // expert groups (grouped kinds); n_experts % n_group == 0
  int64_t topk_group = 1;       // groups kept per token
};

class Router {
 public:
  explicit Router(const RouterSpec& spec) : spec_(spec) {}
  virtual ~Router() = default;
  const RouterSpec& spec() const { return spec_; }

  // One token: logits [n_experts] (used as scratch, overwritten), bias [n_experts] or null
  // (added to the scores for selection only). Writes experts[top_k] in selection order
  // (best first) and their weights[top_k].
  virtual void route(float* logits, const float* bias, int32_t* experts, float* weights) const = 0;

 protected:
  RouterSpec spec_;
};

// The router of a spec; throws Error(InvalidArgument) naming what is inconsistent.
std::unique_ptr<Router> make_router(const RouterSpec& spec);

// A hash-routed token (DeepSeek-V4's hash_moe layers: the experts come from a table by
// token id): the weights of the given experts[top_k] from logits [n_experts] (scratch,
// overwritten) under the kind's score function (sqrt-softplus, sigmoid, else softmax),
// then finish_weights. routers/sqrt_softplus.cpp.
void hash_route_weights(const RouterSpec& spec, float* logits, const int32_t* experts, float* weights);

// The indices of the k largest of values[0, n), best first, ties to the lower index.
void top_k_indices(const float* values, int64_t n, int64_t k, std::vector<int32_t>& order);

// Shared tail of every kind: optional renormalization (sum + 1e-20, as the reference
// implementations divide), then the scaling factor.
void finish_weights(const RouterSpec& spec, float* weights);

}  // namespace colibri
