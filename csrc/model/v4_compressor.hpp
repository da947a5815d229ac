// One compressor of a DeepSeek-V4 compressed layer (model/attn_v4_compressed.hpp): every
// `rate` consecutive positions (a window) become one entry of `dim` values,
//   entry_w[c] = sum_j softmax_j(gate_j[c] + ape[j][c]) * kv_j[c]     (per channel c)
// then RMSNorm (its weight) and interleaved RoPE on the trailing rope values at position
// w * rate, the window's first. kv and gate are projections of the layer's input.
//
// Heavily compressed attention's compressor is that over its own window. The overlapping
// form (compressed sparse attention's, and its lightning indexer's) projects 2 * dim values
// per position: window w's entry takes the softmax over 2 * rate slots, the first dim
// values of window w - 1's positions and the last dim of window w's (none before window 0),
// so consecutive entries overlap by a window.
//
// The entries are computed as positions arrive (consume): a position that closes a window
// writes its entry, so decode, chunked prefill and one prefill give the same bits. Between
// forwards the compressor keeps the projections of the positions since the start of the
// window before the current one (the overlapping form) or of the current one, in a small
// ring inside the layer's F32 state (pending_floats values).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/attention_layer.hpp"

namespace colibri {

class V4Compressor {
 public:
  // prefix + {kv, gate, ape, norm}: (width, hidden), (width, hidden), (rate, width), (dim,)
  // with width = dim (2 * dim overlapping).
  V4Compressor(const WeightStore& store, const std::string& prefix, int64_t hidden, int64_t dim, int64_t rate,
               bool overlap, float eps);

  int64_t dim() const { return dim_; }
  int64_t rate() const { return rate_; }
  // F32 values of the pending projections it keeps in the layer's state.
  int64_t pending_floats() const { return slots() * 2 * width_; }

  // The projections of x [n, hidden] into kv and gate ([n, width] each).
  void project(AttentionContext& ctx, const float* x, int64_t n, std::vector<float>& kv,
               std::vector<float>& gate) const;
  // Positions [pos0, pos0 + n) (their projections from project) into `pending`; each
  // window they close writes its entry w at entries + w * stride. rope: (inv_freq, half
  // pairs, factor) of the layer's "compress" RoPE.
  void consume(const float* kv, const float* gate, int64_t n, int64_t pos0, float* pending, float* entries,
               int64_t stride, const std::vector<float>& inv_freq, float factor) const;

 private:
  int64_t slots() const { return overlap_ ? 2 * rate_ : rate_; }
  void close_window(int64_t w, const float* pending, float* entry, const std::vector<float>& inv_freq,
                    float factor) const;

  const Tensor *kv_ = nullptr, *gate_ = nullptr, *ape_ = nullptr, *norm_ = nullptr;
  int64_t hidden_, dim_, rate_, width_;
  bool overlap_;
  float eps_;
};

}  // namespace colibri
