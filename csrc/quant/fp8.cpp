// FP8 e4m3 block-scaled kernels: scalar reference and dispatch (see fp8.hpp). The x86
// version is fp8_x86.hpp (compiled as fp8_avx2.cpp and fp8_avx512.cpp), NEON fp8_neon.cpp.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant/fp8.hpp"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>

#include "quant/kernels.hpp"

namespace colibri {
namespace {

struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 15, m = c & 7;
      float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 + m), e - 10);
      if ((c & 0x7f) == 0x7f) mag = std::numeric_limits<float>::quiet_NaN();
      v[c] = c & 0x80 ? -mag : mag;
    }
  }
};

const E4m3Table& table() {
  static const E4m3Table t;
  return t;
}

}  // namespace

float e4m3_to_float(uint8_t code) { return table().v[code]; }

void fp8_dequantize_row(const uint8_t* w, int64_t row, int64_t n, const BlockScales& s, float* dst) {
  const float* t = table().v;
  const int64_t first = (row / s.block_rows) * scale_cols(n, s.block_cols);
  for (int64_t j = 0; j < n; ++j) dst[j] = t[w[j]] * scale_at(s, first + j / s.block_cols);
}

namespace fp8 {

void dot_rows_scalar(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                     const BlockScales& s, const float* x, float* out) {
  const float* t = table().v;
  const int64_t nsc = scale_cols(n, s.block_cols);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint8_t* wr = w + static_cast<std::size_t>(r) * stride;
    const int64_t first = ((row0 + r) / s.block_rows) * nsc;
    float sum = 0.0f;
    for (int64_t b = 0; b < nsc; ++b) {
      const int64_t j1 = std::min<int64_t>(n, (b + 1) * s.block_cols);
      float part = 0.0f;
      for (int64_t j = b * s.block_cols; j < j1; ++j) part += t[wr[j]] * x[j];
      sum += scale_at(s, first + b) * part;
    }
    out[r] = sum;
  }
}

}  // namespace fp8

namespace {

void dequantize_codes(const void* src, float* dst, int64_t n) {
  const uint8_t* c = static_cast<const uint8_t*>(src);
  for (int64_t j = 0; j < n; ++j) dst[j] = table().v[c[j]];
}

float dot_codes(int64_t n, const void* w, const void* x) {
  const uint8_t* c = static_cast<const uint8_t*>(w);
  const float* a = static_cast<const float*>(x);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += static_cast<double>(table().v[c[j]]) * a[j];
  return static_cast<float>(sum);
}

void dot_codes_rows(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  for (int64_t r = 0; r < nrows; ++r) out[r] = dot_codes(n, static_cast<const uint8_t*>(w) + r * stride, act);
}

void copy_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, static_cast<std::size_t>(n) * 4); }

// Two entries with the same functions: which one a caller holds picks the scaled kernel.
const TypeKernels kScalarEntry{DType::F8_E4M3, DType::F32, dequantize_codes, nullptr, dot_codes, copy_f32,
                               dot_codes_rows};
const TypeKernels kAvx2Entry{DType::F8_E4M3, DType::F32, dequantize_codes, nullptr, dot_codes, copy_f32,
                             dot_codes_rows};
const TypeKernels kAvx512Entry{DType::F8_E4M3, DType::F32, dequantize_codes, nullptr, dot_codes, copy_f32,
                               dot_codes_rows};
const TypeKernels kNeonEntry{DType::F8_E4M3, DType::F32, dequantize_codes, nullptr, dot_codes, copy_f32,
                             dot_codes_rows};

}  // namespace

const TypeKernels* fp8_type_kernels(DType type, Isa isa) {
  if (type != DType::F8_E4M3) return nullptr;
  if (isa == Isa::Scalar) return &kScalarEntry;
#if defined(COLIBRI_X86)
  if (isa == Isa::AVX2) return &kAvx2Entry;
  if (isa == Isa::AVX512) return &kAvx512Entry;
#endif
#if defined(COLIBRI_ARM)
  if (isa == Isa::NEON) return &kNeonEntry;
#endif
  return nullptr;
}

Fp8DotRowsFn fp8_dot_rows_for(const TypeKernels& k) {
#if defined(COLIBRI_X86)
  if (&k == &kAvx2Entry) return fp8::dot_rows_avx2;
  if (&k == &kAvx512Entry) return fp8::dot_rows_avx512;
#endif
#if defined(COLIBRI_ARM)
  if (&k == &kNeonEntry) return fp8::dot_rows_neon;
#endif
  return fp8::dot_rows_scalar;
}

}  // namespace colibri
