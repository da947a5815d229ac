// Portable inner kernels (no SIMD): what runs where the CPU has none of the SIMD versions,
// and the plain statement of what each kernel computes. Sums run in index order.
#include <cmath>
#include <limits>

#include "attention/attention.hpp"
#include "attention/kernels.hpp"

namespace colibri::attn {
namespace {

void scores(const float* q, int64_t q_stride, int64_t n_rows, const float* k, int64_t k_stride, int64_t n_keys,
            int64_t dk, float scale, float* s, int64_t ld) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* qr = q + r * q_stride;
    for (int64_t j = 0; j < n_keys; ++j) {
      const float* kj = k + j * k_stride;
      float dot = 0.0f;
      for (int64_t i = 0; i < dk; ++i) dot += qr[i] * kj[i];
      s[r * ld + j] = dot * scale;
    }
  }
}

float softmax_block(float* s, float* m, float* l) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < kBlockKeys; ++j) mx = s[j] > mx ? s[j] : mx;
  const float m_new = *m > mx ? *m : mx;
  const float alpha = std::exp(*m - m_new);  // 0 when m is -inf (the first block)
  float sum = 0.0f;
  for (int64_t j = 0; j < kBlockKeys; ++j) {
    s[j] = std::exp(s[j] - m_new);
    sum += s[j];
  }
  *l = *l * alpha + sum;
  *m = m_new;
  return alpha;
}

void pv(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
        const float* v, int64_t v_stride, int64_t n_keys, int64_t dv) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* orow = o + r * o_stride;
    if (alpha)
      for (int64_t i = 0; i < dv; ++i) orow[i] *= alpha[r];
    for (int64_t j = 0; j < n_keys; ++j) {
      const float pj = p[r * p_stride + j];
      const float* vj = v + j * v_stride;
      for (int64_t i = 0; i < dv; ++i) orow[i] += pj * vj[i];
    }
  }
}

const Kernels kScalar{Isa::Scalar, scores, softmax_block, pv};

}  // namespace

const Kernels* scalar_kernels() { return &kScalar; }

}  // namespace colibri::attn
