// AVX-512 kernel for FP8 e4m3 block-scaled weights (see fp8.hpp): fp8_x86.hpp's loop on
// 16 lanes. Agrees with the scalar reference to rounding (16 lanes, FMA). Compiled
// warnings-clean; the development host has no AVX-512, so it was not run there
// (test_fp8_direct checks it on a CPU that has it).
#include <immintrin.h>

#include "quant/fp8_x86.hpp"

namespace colibri::fp8 {
namespace {

struct Avx512 {
  using F = __m512;
  static constexpr int64_t kLanes = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F e4m3(const uint8_t* p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
                                      _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    return _mm512_cvtph_ps(h);
  }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static float sum(F v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace

void dot_rows_avx512(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                     const BlockScales& s, const float* x, float* out) {
  dot_rows_x86<Avx512>(n, w, stride, nrows, row0, s, x, out);
}

}  // namespace colibri::fp8
