// AVX-512 kernel for FP8 e4m3 block-scaled weights (see fp8.hpp): fp8_avx2.cpp's method on
// 16 lanes. e4m3 -> half is a shift ((c & 0x7f) << 7, sign << 8), the 2^-8 it leaves is
// folded into the block scale, and vcvtph2ps converts exactly. Agrees with the scalar
// reference to rounding (16 lanes, FMA). Compiled warnings-clean; the development host
// has no AVX-512, so it was not run there (test_fp8_direct checks it on a CPU that has it).
#include <immintrin.h>

#include <algorithm>

#include "quant/fp8.hpp"

namespace colibri::fp8 {
namespace {

inline __m512 e4m3x16(const uint8_t* p) {
  const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
                                    _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
  return _mm512_cvtph_ps(h);
}

}  // namespace

void dot_rows_avx512(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                     const BlockScales& s, const float* x, float* out) {
  const int64_t nsc = scale_cols(n, s.block_cols);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint8_t* wr = w + static_cast<std::size_t>(r) * stride;
    const int64_t first = ((row0 + r) / s.block_rows) * nsc;
    __m512 acc = _mm512_setzero_ps();
    float tail = 0.0f;
    for (int64_t b = 0; b < nsc; ++b) {
      const int64_t j0 = b * s.block_cols, j1 = std::min<int64_t>(n, j0 + s.block_cols);
      __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
      int64_t j = j0;
      for (; j + 32 <= j1; j += 32) {
        p0 = _mm512_fmadd_ps(e4m3x16(wr + j), _mm512_loadu_ps(x + j), p0);
        p1 = _mm512_fmadd_ps(e4m3x16(wr + j + 16), _mm512_loadu_ps(x + j + 16), p1);
      }
      for (; j + 16 <= j1; j += 16) p0 = _mm512_fmadd_ps(e4m3x16(wr + j), _mm512_loadu_ps(x + j), p0);
      const float sb = scale_at(s, first + b), scale = sb * 256.0f;
      if (j < j1) {  // fewer than 16 left in this block
        float part = 0.0f;
        for (; j < j1; ++j) part += e4m3_to_float(wr[j]) * x[j];
        tail += sb * part;
      }
      acc = _mm512_fmadd_ps(_mm512_set1_ps(scale), _mm512_add_ps(p0, p1), acc);
    }
    out[r] = _mm512_reduce_add_ps(acc) + tail;
  }
}

}  // namespace colibri::fp8
