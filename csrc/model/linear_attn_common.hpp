// Pieces the linear-attention units share (linear_attn_gdn.hpp: Gated DeltaNet;
// linear_attn_kda.hpp: Kimi Delta Attention): the element-wise functions of their gates,
// the short causal convolution over the state's input history, and the check that a
// forward continues the state it finds in the KvCache.
#pragma once
#include <cmath>
#include <cstdint>

#include "model/kv_cache.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

inline float lin_silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus (beta 1, threshold 20).
inline float lin_softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x *= 1 / sqrt(sum x^2 + 1e-6): transformers' l2norm (the FLA library's).
void lin_l2_normalize(float* x, int64_t n);

// The layer's state for a forward of tokens from pos0: zeroed at position 0, else checked
// to hold exactly pos0 tokens (Error(Internal) otherwise); marked incomplete (-1 tokens)
// until the caller's forward ends with kv.set_state_tokens(layer, pos0 + n).
float* begin_linear_state(KvCache& kv, int64_t layer, int64_t pos0);

// Causal depthwise convolution of C channels, kernel K, then silu. `ext` is [K - 1 + n][C]
// with the n new inputs already in its last n rows; the first K - 1 rows are filled from
// `hist` (the previous inputs, oldest first), which then takes the last K - 1 rows.
// weights [C][K]; out [n][C].
void short_conv_silu(ThreadPool& pool, const float* weights, float* hist, float* ext, int64_t n, int64_t C,
                     int64_t K, float* out);

}  // namespace colibri
