// AVX2 + F16C kernel for FP8 e4m3 block-scaled weights (see fp8.hpp). e4m3 -> half is a
// shift: the bits (c & 0x7f) << 7 (sign << 8) read as a half equal e4m3(c) * 2^-8 for
// normal and subnormal codes alike (both formats scale subnormals the same way), and
// vcvtph2ps converts them exactly; the 2^8 is folded into the block scale. NaN codes
// (S.1111.111) decode to +-480 here instead of NaN: checkpoints do not contain them.
// Agrees with the scalar reference to rounding (8 lanes, FMA).
#include <immintrin.h>

#include <algorithm>

#include "quant/fp8.hpp"

namespace colibri::fp8 {
namespace {

inline __m256 e4m3x8(const uint8_t* p) {
  const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7),
                                 _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
  return _mm256_cvtph_ps(h);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace

void dot_rows_avx2(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                   const BlockScales& s, const float* x, float* out) {
  const int64_t nsc = scale_cols(n, s.block_cols);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint8_t* wr = w + static_cast<std::size_t>(r) * stride;
    const int64_t first = ((row0 + r) / s.block_rows) * nsc;
    __m256 acc = _mm256_setzero_ps();
    float tail = 0.0f;
    for (int64_t b = 0; b < nsc; ++b) {
      const int64_t j0 = b * s.block_cols, j1 = std::min<int64_t>(n, j0 + s.block_cols);
      __m256 p0 = _mm256_setzero_ps(), p1 = _mm256_setzero_ps();
      int64_t j = j0;
      for (; j + 16 <= j1; j += 16) {
        p0 = _mm256_fmadd_ps(e4m3x8(wr + j), _mm256_loadu_ps(x + j), p0);
        p1 = _mm256_fmadd_ps(e4m3x8(wr + j + 8), _mm256_loadu_ps(x + j + 8), p1);
      }
      for (; j + 8 <= j1; j += 8) p0 = _mm256_fmadd_ps(e4m3x8(wr + j), _mm256_loadu_ps(x + j), p0);
      const float sb = scale_at(s, first + b), scale = sb * 256.0f;
      if (j < j1) {  // fewer than 8 left in this block
        float part = 0.0f;
        for (; j < j1; ++j) part += e4m3_to_float(wr[j]) * x[j];
        tail += sb * part;
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_add_ps(p0, p1), acc);
    }
    out[r] = hsum(acc) + tail;
  }
}

}  // namespace colibri::fp8
