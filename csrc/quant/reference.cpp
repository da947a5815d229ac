// Scalar reference kernels. These define what every SIMD kernel must compute:
//  - quantize_row_*: the same arithmetic as ggml's quantize_row_*_ref (and gguf's NumPy
//    quantizers), so the blocks are byte-identical to llama.cpp's;
//  - dequantize_row_*: bit-identical to gguf.quants.dequantize;
//  - vec_dot_*: exact integer sums per block, float accumulation over blocks.
// FMA contraction is switched off: ggml's reference (and NumPy) round after the multiply
// and again after the add, and one fused rounding would change quantized bytes.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant/reference.hpp"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "quant/blocks.hpp"
#include "quant/fp16.hpp"

namespace colibri {
namespace ref {
namespace {

// ggml's `MIN(15, (int8_t)v)` for v in [0, 16.5], written without undefined behaviour for
// out-of-range or NaN inputs (those only arise from inf/NaN data).
inline uint8_t trunc_nibble(float v) {
  if (!(v > 0.0f)) return 0;
  if (v >= 15.0f) return 15;
  return static_cast<uint8_t>(static_cast<int>(v));
}

// ggml's `(int8_t)roundf(v)` (round half away from zero), saturating instead of UB.
inline int8_t round_int8(float v) {
  if (!(v == v)) return 0;
  const float r = std::roundf(v);
  if (r >= 127.0f) return 127;
  if (r <= -128.0f) return -128;
  return static_cast<int8_t>(static_cast<int>(r));
}

inline int nibble(const uint8_t* qs, int64_t j) {
  return j < kQK / 2 ? (qs[j] & 0x0f) : (qs[j - kQK / 2] >> 4);
}

}  // namespace

// ---- dequantize ------------------------------------------------------------------------

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int64_t j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(nibble(b[i].qs, j) - 8) * d;
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int64_t j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(nibble(b[i].qs, j)) * d + m;
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int64_t j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequantize_row_q8_1(const void* src, float* dst, int64_t n) {
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int64_t j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// ---- quantize --------------------------------------------------------------------------

void quantize_row_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void quantize_row_f16(const float* src, void* dst, int64_t n) {
  uint16_t* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

void quantize_row_bf16(const float* src, void* dst, int64_t n) {
  uint16_t* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
}

void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  BlockQ4_0* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, sign kept (first wins)
    for (int64_t j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;  // maps max to nibble 0, so the range is [-8, 7] * d
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int64_t j = 0; j < kQK / 2; ++j) {
      const uint8_t lo = trunc_nibble(x[j] * id + 8.5f);
      const uint8_t hi = trunc_nibble(x[j + kQK / 2] * id + 8.5f);
      b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  BlockQ4_1* b = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float min = FLT_MAX, max = -FLT_MAX;
    for (int64_t j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    for (int64_t j = 0; j < kQK / 2; ++j) {
      const uint8_t lo = trunc_nibble((x[j] - min) * id + 0.5f);
      const uint8_t hi = trunc_nibble((x[j + kQK / 2] - min) * id + 0.5f);
      b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.0f;
    for (int64_t j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int64_t j = 0; j < kQK; ++j) b[i].qs[j] = round_int8(x[j] * id);
  }
}

void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
  BlockQ8_1* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.0f;
    for (int64_t j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int64_t j = 0; j < kQK; ++j) {
      b[i].qs[j] = round_int8(x[j] * id);
      sum += b[i].qs[j];
    }
    b[i].d = fp32_to_fp16(d);
    b[i].s = fp32_to_fp16(static_cast<float>(sum) * d);  // float d, as ggml does
  }
}

// ---- dot products ----------------------------------------------------------------------

float vec_dot_f32(int64_t n, const void* w, const void* x) {
  const float* a = static_cast<const float*>(w);
  const float* b = static_cast<const float*>(x);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

float vec_dot_f16(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  const float* b = static_cast<const float*>(x);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(fp16_to_fp32(a[i])) * b[i];
  return static_cast<float>(sum);
}

float vec_dot_bf16(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  const float* b = static_cast<const float*>(x);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(bf16_to_fp32(a[i])) * b[i];
  return static_cast<float>(sum);
}

float vec_dot_q4_0_q8_0(int64_t n, const void* w, const void* act) {
  const BlockQ4_0* x = static_cast<const BlockQ4_0*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int isum = 0;
    for (int64_t j = 0; j < kQK; ++j) isum += (nibble(x[i].qs, j) - 8) * y[i].qs[j];
    sum += fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d) * static_cast<float>(isum);
  }
  return sum;
}

float vec_dot_q4_1_q8_1(int64_t n, const void* w, const void* act) {
  const BlockQ4_1* x = static_cast<const BlockQ4_1*>(w);
  const BlockQ8_1* y = static_cast<const BlockQ8_1*>(act);
  // Each block's term in float (d d_a isum + m s with one rounding after the product
  // d d_a and m s: a fused multiply-add), their sum in double (rounded to float once): the
  // AVX-512 row-lane kernel repeats exactly this, and the sum of a long row keeps no error
  // of its own (a float running sum's grows with the row's length).
  double sum = 0.0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int isum = 0;
    for (int64_t j = 0; j < kQK; ++j) isum += nibble(x[i].qs, j) * y[i].qs[j];
    // sum_j (q_j d + m) * a_j d_a = d d_a isum + m * (d_a sum_j a_j) = ... + m * s
    const float dd = fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d);
    const float term = std::fma(dd, static_cast<float>(isum), fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s));
    sum += static_cast<double>(term);
  }
  return static_cast<float>(sum);
}

float vec_dot_q8_0_q8_0(int64_t n, const void* w, const void* act) {
  const BlockQ8_0* x = static_cast<const BlockQ8_0*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(act);
  double sum = 0.0;  // as Q4_1: float terms, a double sum
  for (int64_t i = 0; i < n / kQK; ++i) {
    int isum = 0;
    for (int64_t j = 0; j < kQK; ++j) isum += x[i].qs[j] * y[i].qs[j];
    const float term = fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d) * static_cast<float>(isum);
    sum += static_cast<double>(term);
  }
  return static_cast<float>(sum);
}

// ---- table -----------------------------------------------------------------------------

namespace {

// Several rows against one activation: the row-by-row loop (the definition SIMD versions
// must match bit for bit, per ISA).
template <VecDotFn F>
void rows_each(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  for (int64_t r = 0; r < nrows; ++r) out[r] = F(n, static_cast<const unsigned char*>(w) + r * stride, act);
}

const TypeKernels kScalar[] = {
    {DType::F32, DType::F32, dequantize_row_f32, quantize_row_f32, vec_dot_f32, quantize_row_f32,
     rows_each<vec_dot_f32>},
    {DType::F16, DType::F32, dequantize_row_f16, quantize_row_f16, vec_dot_f16, quantize_row_f32,
     rows_each<vec_dot_f16>},
    {DType::BF16, DType::F32, dequantize_row_bf16, quantize_row_bf16, vec_dot_bf16, quantize_row_f32,
     rows_each<vec_dot_bf16>},
    {DType::Q4_0, DType::Q8_0, dequantize_row_q4_0, quantize_row_q4_0, vec_dot_q4_0_q8_0, quantize_row_q8_0,
     rows_each<vec_dot_q4_0_q8_0>},
    {DType::Q4_1, DType::Q8_1, dequantize_row_q4_1, quantize_row_q4_1, vec_dot_q4_1_q8_1, quantize_row_q8_1,
     rows_each<vec_dot_q4_1_q8_1>},
    {DType::Q8_0, DType::Q8_0, dequantize_row_q8_0, quantize_row_q8_0, vec_dot_q8_0_q8_0, quantize_row_q8_0,
     rows_each<vec_dot_q8_0_q8_0>},
    // Q8_1 is an activation format only: no weight dot product.
    {DType::Q8_1, DType::Q8_1, dequantize_row_q8_1, quantize_row_q8_1, nullptr, quantize_row_q8_1,
     nullptr},
};
}  // namespace

const TypeKernels* scalar_kernels(DType type) {
  for (const TypeKernels& k : kScalar)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace ref
}  // namespace colibri
