// AVX-512 clamped SwiGLU (compiled with -mavx512f and friends, run only when the CPU has
// them): act_avx2.cpp's arithmetic sixteen values at a time, the tail through masked
// loads and stores. Contract and accuracy: act_kernels.hpp; reference: ops.cpp.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <cstdint>

#include "model/act_kernels.hpp"

namespace colibri {
namespace {

// act_avx2.cpp's exp8, sixteen wide.
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.0f)), lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  const __mmask16 top = _mm512_cmp_ps_mask(n, _mm512_set1_ps(128.0f), _CMP_EQ_OQ);
  y = _mm512_mask_add_ps(y, top, y, y);  // exact
  const __m512i ni = _mm512_cvtps_epi32(_mm512_min_ps(n, _mm512_set1_ps(127.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~underflow), y, _mm512_castsi512_ps(e));
}

inline __m512 neg(__m512 x) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
}
inline __m512 clamp_gate(__m512 g, __m512 limit) { return _mm512_min_ps(limit, g); }
inline __m512 clamp_up(__m512 u, __m512 limit) {
  return _mm512_min_ps(limit, _mm512_max_ps(neg(limit), u));
}

inline __m512 oai16(__m512 g, __m512 u, __m512 limit, __m512 neg_alpha) {
  g = clamp_gate(g, limit);
  u = clamp_up(u, limit);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 sig = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_mul_ps(neg_alpha, g))));
  return _mm512_mul_ps(_mm512_add_ps(u, one), sig);
}

inline __m512 clamp16(__m512 g, __m512 u, __m512 limit) {
  g = clamp_gate(g, limit);
  u = clamp_up(u, limit);
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, exp16(neg(g)))), u);
}

template <class F>
void each16(float* gate, const float* up, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(gate + i, f(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  if (i == n) return;
  const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
  _mm512_mask_storeu_ps(gate + i, m, f(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
}

void swiglu_oai_avx512(float* gate, const float* up, int64_t n, float limit, float alpha) {
  const __m512 l = _mm512_set1_ps(limit), na = _mm512_set1_ps(-alpha);
  each16(gate, up, n, [&](__m512 g, __m512 u) { return oai16(g, u, l, na); });
}

void swiglu_clamp_avx512(float* gate, const float* up, int64_t n, float limit) {
  const __m512 l = _mm512_set1_ps(limit);
  each16(gate, up, n, [&](__m512 g, __m512 u) { return clamp16(g, u, l); });
}

const ActKernels kAvx512{swiglu_oai_avx512, swiglu_clamp_avx512};

}  // namespace

const ActKernels* act_avx512_kernels() { return &kAvx512; }

}  // namespace colibri
