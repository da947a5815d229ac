// Zero-centred RMSNorm weights (Qwen3-Next stores w and scales by 1 + w): the spec's
// norm_weight_offset is added once at load to every residual-stream norm (attn_norm,
// ffn_norm, output_norm) and QK-norm weight, so the forward's rms_norm_row stays one
// convention. The linear layers' gated norm (gdn_norm) scales by w and is left alone.
#pragma once
#include "model/model_spec.hpp"
#include "model/weights.hpp"

namespace colibri {

void apply_norm_weight_offset(const ModelSpec& spec, const WeightStore& weights);

}  // namespace colibri
