// Q8_K activation quantizer, AVX2 (compiled with the AVX2 flags, run only where
// dispatch.cpp found AVX2). Byte-identical to q8k::quantize_row_ref: the same IEEE
// operations in the same order (contraction is off, so mul + add never fuse), ggml's
// rounding trick done on the integer bits, and the low byte of each value kept (not a
// saturating pack), so even inf/NaN input gives the reference's bytes.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <cstring>

#include "quant/q8_k.hpp"

namespace colibri::q8k {
namespace {

inline float hmax_ps(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// 8 floats -> ggml's nearest_int of each, capped at 127, as the low byte in each int32.
inline __m256i round_low_byte(__m256 p) {
  const __m256i bits = _mm256_castps_si256(_mm256_add_ps(p, _mm256_set1_ps(12582912.0f)));
  __m256i q = _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
  q = _mm256_min_epi32(q, _mm256_set1_epi32(127));
  return _mm256_and_si256(q, _mm256_set1_epi32(0xff));
}

}  // namespace

void quantize_row_avx2(const float* src, void* dst, int64_t n) {
  BlockQ8K* y = static_cast<BlockQ8K*>(dst);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    // max(|x|, acc) returns acc when |x| is NaN: NaNs never become the maximum.
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < kQK_K; k += 8) acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask), acc);
    const float amax = hmax_ps(acc);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8K));
      continue;
    }
    // The first element of that magnitude gives the sign (the reference's strict >).
    const __m256 vamax = _mm256_set1_ps(amax);
    float max = 0.0f;
    for (int k = 0; k < kQK_K; k += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask);
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(a, vamax, _CMP_EQ_OQ));
      if (mask) {
        max = x[k + __builtin_ctz(static_cast<unsigned>(mask))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 vis = _mm256_set1_ps(iscale);
    for (int k = 0; k < kQK_K; k += 32) {
      __m256i q[4];
      for (int u = 0; u < 4; ++u) q[u] = round_low_byte(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * u), vis));
      // Values are 0..255 here, so the unsigned saturating packs are exact; the permute
      // undoes their 128-bit lane interleave.
      const __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]), _mm256_packus_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + k),
                          _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    // Group sums of the stored int8 values: bytes times 1 in pairs, then quads; lanes 0..3
    // of each 32-byte step are one group of 16, lanes 4..7 the next.
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int k = 0; k < kQK_K; k += 32) {
      const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + k));
      __m256i quad = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, s), ones16);
      quad = _mm256_hadd_epi32(quad, quad);
      quad = _mm256_hadd_epi32(quad, quad);
      y[i].bsums[k / 16] = static_cast<int16_t>(_mm256_extract_epi32(quad, 0));
      y[i].bsums[k / 16 + 1] = static_cast<int16_t>(_mm256_extract_epi32(quad, 4));
    }
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace colibri::q8k
