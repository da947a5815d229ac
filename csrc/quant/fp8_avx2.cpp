// AVX2 + F16C kernel for FP8 e4m3 block-scaled weights (see fp8.hpp): fp8_x86.hpp's loop
// on 8 lanes. Agrees with the scalar reference to rounding (8 lanes, FMA).
#include <immintrin.h>

#include "quant/fp8_x86.hpp"

namespace colibri::fp8 {
namespace {

struct Avx2 {
  using F = __m256;
  static constexpr int64_t kLanes = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F e4m3(const uint8_t* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    return _mm256_cvtph_ps(h);
  }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static float sum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace

void dot_rows_avx2(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                   const BlockScales& s, const float* x, float* out) {
  dot_rows_x86<Avx2>(n, w, stride, nrows, row0, s, x, out);
}

}  // namespace colibri::fp8
