// Portable inner kernels (no SIMD): what runs where the CPU has none of the SIMD versions,
// and the plain statement of what each kernel computes. Sums run in index order; each
// cache element is converted to F32 (exactly) where it is used.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "attention/attention.hpp"
#include "attention/kernels.hpp"
#include "quant/blocks.hpp"
#include "quant/fp16.hpp"

namespace colibri::attn {
namespace {

uint16_t half_at(const unsigned char* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return h;
}

// Element i of row j, as F32.
float element(const Rows& rows, int64_t j, int64_t i) {
  const unsigned char* row = rows.data + j * rows.stride;
  switch (rows.type) {
    case DType::F16: return fp16_to_fp32(half_at(row + 2 * i));
    case DType::BF16: return bf16_to_fp32(half_at(row + 2 * i));
    case DType::Q8_0: {
      const unsigned char* block = row + (i / kQK) * sizeof(BlockQ8_0);
      return static_cast<float>(static_cast<int8_t>(block[offsetof(BlockQ8_0, qs) + i % kQK])) *
             fp16_to_fp32(half_at(block + offsetof(BlockQ8_0, d)));
    }
    default: {
      float f;
      std::memcpy(&f, row + 4 * i, sizeof f);
      return f;
    }
  }
}

void scores(const float* q, int64_t q_stride, int64_t n_rows, const Rows& k, int64_t n_keys, int64_t dk,
            float scale, float* s, int64_t ld) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* qr = q + r * q_stride;
    for (int64_t j = 0; j < n_keys; ++j) {
      float dot = 0.0f;
      for (int64_t i = 0; i < dk; ++i) dot += qr[i] * element(k, j, i);
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
        const Rows& v, int64_t n_keys, int64_t dv) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* orow = o + r * o_stride;
    if (alpha)
      for (int64_t i = 0; i < dv; ++i) orow[i] *= alpha[r];
    for (int64_t j = 0; j < n_keys; ++j) {
      const float pj = p[r * p_stride + j];
      for (int64_t i = 0; i < dv; ++i) orow[i] += pj * element(v, j, i);
    }
  }
}

const Kernels kScalar{Isa::Scalar, scores, softmax_block, pv};

}  // namespace

const Kernels* scalar_kernels() { return &kScalar; }

}  // namespace colibri::attn
