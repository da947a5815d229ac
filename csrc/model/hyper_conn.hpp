// Manifold-constrained hyper-connections (DeepSeek-V4, spec.hc_mult > 0): the residual is
// hc_mult streams of hidden values per token. Before a block (attention or FFN) a small
// projection of the RMS-normed, flattened streams gives three sets of weights: `pre`
// collapses the streams into the block's input, `post` spreads the block's output back over
// the streams, and `comb`, an hc x hc matrix made (nearly) doubly stochastic by
// Sinkhorn-Knopp iterations, mixes the input streams into the output ones:
//   stream'[k] = post[k] * block_out + sum_j comb[j][k] * stream[j].
// The hyper head collapses the streams once more (its own `pre`) before the final norm.
// Scalar code, one token at a time in a fixed order (no threading: the projections are
// (2 + hc) * hc rows, tiny beside the blocks); the arithmetic follows transformers'
// DeepseekV4HyperConnection / DeepseekV4HyperHead in float32.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_spec.hpp"
#include "model/weights.hpp"

namespace colibri {

struct HcWeights {
  const Tensor* fn = nullptr;     // ((2 + hc) * hc, hc * hidden), or (hc, hc * hidden) for the head
  const Tensor* base = nullptr;   // ((2 + hc) * hc,), or (hc,)
  const Tensor* scale = nullptr;  // (3,): pre, post, comb; or (1,) for the head
};

// `prefix` + "_fn" / "_base" / "_scale" (e.g. "blk.3.hc_attn"), shapes checked (head: the
// hyper head's smaller set).
HcWeights resolve_hc(const ModelSpec& spec, const WeightStore& weights, const std::string& prefix, bool head);

// Per-token mixing weights of one block, kept between its collapse and its expansion.
struct HcMix {
  std::vector<float> post;  // [n][hc]
  std::vector<float> comb;  // [n][hc][hc]
  std::vector<float> flat;  // one token's normed streams, then its projections (scratch)
};

// streams: [n][hc][hidden]. Writes the block input collapsed[n][hidden] and keeps post and
// comb in mix for hc_expand.
void hc_collapse(const ModelSpec& spec, const HcWeights& w, const float* streams, int64_t n, float* collapsed,
                 HcMix& mix);

// streams[t][k] = post[t][k] * block_out[t] + sum_j comb[t][j][k] * streams[t][j], in place
// (tmp: scratch).
void hc_expand(const ModelSpec& spec, const HcMix& mix, const float* block_out, int64_t n, float* streams,
               std::vector<float>& tmp);

// The hyper head: out[t] = sum_k pre[t][k] * streams[t][k], pre = sigmoid(fn . norm(flat) *
// scale + base) + hc_eps.
void hc_head(const ModelSpec& spec, const HcWeights& w, const float* streams, int64_t n, float* out,
             std::vector<float>& scratch);

}  // namespace colibri
