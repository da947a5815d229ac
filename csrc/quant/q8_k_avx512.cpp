// Q8_K activation quantizer, AVX-512 F/BW (run only where dispatch.cpp found AVX-512).
// Byte-identical to q8k::quantize_row_ref by the same construction as q8_k_avx2.cpp:
// the same IEEE operations in the same order (no contraction), ggml's rounding trick on
// the integer bits, and vpmovdb's truncation keeps each value's low byte as the reference.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <cstring>

#include "quant/q8_k.hpp"

namespace colibri::q8k {

void quantize_row_avx512(const float* src, void* dst, int64_t n) {
  BlockQ8K* y = static_cast<BlockQ8K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    // max(|x|, acc) returns acc when |x| is NaN: NaNs never become the maximum.
    __m512 acc = _mm512_setzero_ps();
    for (int k = 0; k < kQK_K; k += 16) acc = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), acc);
    const float amax = _mm512_reduce_max_ps(acc);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8K));
      continue;
    }
    const __m512 vamax = _mm512_set1_ps(amax);
    float max = 0.0f;
    for (int k = 0; k < kQK_K; k += 16) {
      const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + k)), vamax, _CMP_EQ_OQ);
      if (m) {
        max = x[k + __builtin_ctz(static_cast<unsigned>(m))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 vis = _mm512_set1_ps(iscale);
    for (int k = 0; k < kQK_K; k += 16) {
      const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x + k), vis);
      const __m512i bits = _mm512_castps_si512(_mm512_add_ps(p, _mm512_set1_ps(12582912.0f)));
      __m512i q = _mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x007fffff)),
                                   _mm512_set1_epi32(0x00400000));
      q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
      const __m128i b = _mm512_cvtepi32_epi8(q);  // truncation: the low byte of each
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[i].qs + k), b);
      y[i].bsums[k / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(b)));
    }
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace colibri::q8k
