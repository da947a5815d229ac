#include "model/ops.hpp"

#include "model/act_kernels.hpp"

#include <algorithm>
#include <cmath>

namespace colibri {

void rms_norm_row(const float* x, const float* weight, int64_t n, float eps, float* out) {
  // Accumulate in double: the oracle (torch, float32 with pairwise sums) is closer to the
  // exact value than a naive float loop would be.
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

void rope_cos_sin(int64_t position, const float* inv_freq, int64_t half, float attention_factor,
                  float* cos_sin) {
  const float p = static_cast<float>(position);
  for (int64_t i = 0; i < half; ++i) {
    const float angle = p * inv_freq[i];  // float product, as the oracle computes it
    cos_sin[2 * i] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor;
    cos_sin[2 * i + 1] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor;
  }
}

void rope_head(float* head, const float* cos_sin, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    const float x1 = head[i], x2 = head[i + half];
    head[i] = x1 * c - x2 * s;
    head[i + half] = x2 * c + x1 * s;
  }
}

void rope_head_interleaved(float* head, const float* cos_sin, int64_t rotary_dim) {
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    const float x1 = head[2 * i], x2 = head[2 * i + 1];
    head[2 * i] = x1 * c - x2 * s;
    head[2 * i + 1] = x2 * c + x1 * s;
  }
}

void layer_norm_row(const float* x, const float* weight, const float* bias, int64_t n, float eps,
                    float* out) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(n);
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += (x[i] - mean) * (x[i] - mean);
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  const float m = static_cast<float>(mean);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - m) * inv * weight[i] + bias[i];
}

float dot_lanes8(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

void silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu_oai_mul_scalar(float* gate, const float* up, int64_t n, float limit, float alpha) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::min(std::max(up[i], -limit), limit);
    gate[i] = (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
  }
}

void swiglu_clamp_mul_scalar(float* gate, const float* up, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::min(std::max(up[i], -limit), limit);
    gate[i] = (g / (1.0f + std::exp(-g))) * u;
  }
}

void swiglu_oai_mul(float* gate, const float* up, int64_t n, float limit, float alpha) {
  best_act_kernels().swiglu_oai(gate, up, n, limit, alpha);
}

void swiglu_clamp_mul(float* gate, const float* up, int64_t n, float limit) {
  best_act_kernels().swiglu_clamp(gate, up, n, limit);
}

void softmax(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void add_inplace(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void add_scaled_inplace(float* dst, const float* src, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += scale * src[i];
}

}  // namespace colibri
