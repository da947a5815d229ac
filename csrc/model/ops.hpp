// Small row-wise operations of the forward pass. Each processes one row in a fixed order,
// so results do not depend on threading.
#pragma once
#include <cstdint>

namespace colibri {

// out = x / sqrt(mean(x^2) + eps) * weight, for one row of n values (out may alias x).
void rms_norm_row(const float* x, const float* weight, int64_t n, float eps, float* out);

// Rotates one head of `head_dim` values in place, rotate-half convention: dimension i
// pairs with i + rotary_dim/2, for i < rotary_dim/2. cos_sin holds (cos, sin) pairs,
// rotary_dim/2 of them, for this position.
void rope_head(float* head, const float* cos_sin, int64_t rotary_dim);

// The same rotation with adjacent pairs: dimension 2i pairs with 2i + 1 (DeepSeek's
// rope_interleave, llama.cpp's "NORM" RoPE).
void rope_head_interleaved(float* head, const float* cos_sin, int64_t rotary_dim);

// out = (x - mean) / sqrt(var + eps) * weight + bias for one row (out may alias x).
void layer_norm_row(const float* x, const float* weight, const float* bias, int64_t n, float eps,
                    float* out);

// Fills cos_sin (rotary_dim/2 pairs) for one position.
void rope_cos_sin(int64_t position, const float* inv_freq, int64_t half, float attention_factor,
                  float* cos_sin);

// sum_i a[i] * b[i] as eight independent partial sums combined in a fixed order: the
// compiler keeps them in one SIMD register without reassociating anything, so the result
// is the same on every machine and thread.
float dot_lanes8(const float* a, const float* b, int64_t n);

// gate[i] = silu(gate[i]) * up[i]
void silu_mul(float* gate, const float* up, int64_t n);

// gpt-oss's clamped SwiGLU: g = min(gate[i], limit), u = clamp(up[i], -limit, limit),
// gate[i] = (u + 1) * g * sigmoid(alpha * g). This and swiglu_clamp_mul run the best ISA's
// kernels (act_kernels.hpp, which also declares the scalar reference).
void swiglu_oai_mul(float* gate, const float* up, int64_t n, float limit, float alpha);

// DeepSeek-V4's clamped SwiGLU: gate[i] = silu(min(gate[i], limit)) * clamp(up[i], -limit, limit)
void swiglu_clamp_mul(float* gate, const float* up, int64_t n, float limit);

// In-place softmax over n values (max-subtracted, float accumulation).
void softmax(float* x, int64_t n);


void add_inplace(float* dst, const float* src, int64_t n);
void add_scaled_inplace(float* dst, const float* src, float scale, int64_t n);

}  // namespace colibri
