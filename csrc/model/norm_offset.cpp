#include "model/norm_offset.hpp"

#include <string>

#include "common/errors.hpp"

namespace colibri {

void apply_norm_weight_offset(const ModelSpec& s, const WeightStore& weights) {
  if (s.norm_weight_offset == 0.0f) return;
  auto shift = [&](const std::string& name) {
    const Tensor* t = weights.find(name);
    if (t == nullptr) return;
    t->f32();  // F32 (vectors are widened at load), or Error(Unsupported)
    // The store owns the bytes (resident, read and checksummed already): adjusted in place.
    auto* w = reinterpret_cast<float*>(t->data);
    for (int64_t i = 0; i < t->rows * t->cols; ++i) w[i] += s.norm_weight_offset;
  };
  shift("output_norm");
  for (int64_t i = 0; i < s.n_layers + s.n_mtp_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    for (const char* n : {"attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm"}) shift(p + n);
  }
}

}  // namespace colibri
