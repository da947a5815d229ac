#include "model/attention_layer.hpp"

#include "common/errors.hpp"
#include "model/attn_gqa.hpp"
#include "model/attn_mla.hpp"
#include "model/attn_v4.hpp"
#include "model/attn_v4_compressed.hpp"
#include "model/linear_attn_gdn.hpp"
#include "model/linear_attn_kda.hpp"

namespace colibri {

void AttentionLayer::forward_segments(AttentionContext& ctx, const float* x, const std::vector<AttnSegment>& segs,
                                      int64_t layer, int64_t hidden, float* out) {
  int64_t row = 0;
  for (const AttnSegment& s : segs) {
    forward(ctx, x + row * hidden, s.n, s.pos0, *s.kv, layer, out + row * hidden);
    row += s.n;
  }
}

std::unique_ptr<AttentionLayer> make_attention(const ModelSpec& spec, const WeightStore& weights, int64_t layer) {
  if (layer < static_cast<int64_t>(spec.linear_layers.size()) && spec.linear_layers[static_cast<std::size_t>(layer)]) {
    if (spec.linear_kda)
      return std::make_unique<KimiDeltaAttention>(spec, KimiDeltaAttention::resolve(spec, weights, layer));
    return std::make_unique<GatedDeltaNet>(spec, GatedDeltaNet::resolve(spec, weights, layer));
  }
  switch (spec.attention_kind) {
    case AttentionKind::Gqa:
      return std::make_unique<GqaAttention>(spec, GqaAttention::resolve(spec, weights, layer), layer);
    case AttentionKind::Mla:
      return std::make_unique<MlaAttention>(spec, weights, layer);
    case AttentionKind::V4Sliding:
      if (layer < static_cast<int64_t>(spec.compress_ratios.size()) &&
          spec.compress_ratios[static_cast<std::size_t>(layer)] > 0)
        return std::make_unique<V4CompressedAttention>(spec, weights, layer);
      return std::make_unique<V4SlidingAttention>(spec, weights, layer);
  }
  fail(ErrorKind::Unsupported, "model spec: unknown attention kind " +
                                   std::to_string(static_cast<int>(spec.attention_kind)));
}

}  // namespace colibri
