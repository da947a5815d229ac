#include "model/linear_attn_common.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/errors.hpp"

namespace colibri {

void lin_l2_normalize(float* x, int64_t n) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + 1e-6f);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float* begin_linear_state(KvCache& kv, int64_t layer, int64_t pos0) {
  float* state = kv.state(layer);
  if (pos0 == 0) {
    std::fill(state, state + kv.layout(layer).state_floats, 0.0f);
  } else if (kv.state_tokens(layer) != pos0) {
    fail(ErrorKind::Internal, "linear-attention layer " + std::to_string(layer) + ": its state holds " +
                                  std::to_string(kv.state_tokens(layer)) + " tokens, the forward starts at " +
                                  std::to_string(pos0));
  }
  kv.set_state_tokens(layer, -1);  // until this forward completes
  return state;
}

void short_conv_silu(ThreadPool& pool, const float* weights, float* hist, float* ext, int64_t n, int64_t C,
                     int64_t K, float* out) {
  const int64_t h = K - 1;
  std::memcpy(ext, hist, static_cast<std::size_t>(h * C) * sizeof(float));
  pool.parallel_for(C, 0, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t t = 0; t < n; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) acc += weights[c * K + j] * ext[(t + j) * C + c];
        out[t * C + c] = lin_silu(acc);
      }
  });
  std::memcpy(hist, ext + n * C, static_cast<std::size_t>(h * C) * sizeof(float));
}

}  // namespace colibri
