// AVX2 + FMA clamped SwiGLU (compiled with -mavx2 -mfma, run only when the CPU has them).
// Contract and accuracy: act_kernels.hpp; reference: ops.cpp's *_scalar. Contraction is
// off: an FMA only where written (inside exp's polynomial), so the clamps, 1 + e, the
// division and the products round as the reference's do.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "model/act_kernels.hpp"

namespace colibri {
namespace {

// e^x: 0 below -87.34 (the reference gives subnormals there, which vanish in 1 + e^x),
// inf past float's range (x > 88.72) as std::exp. x is clamped to 89 so that n <= 128;
// 2^n is applied as 2^min(n, 127) times 2 when n is 128, so the one overflowing multiply
// gives inf exactly where the value does not fit.
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(89.0f)), lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // x - n ln2, in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256 top = _mm256_set1_ps(128.0f);
  y = _mm256_blendv_ps(y, _mm256_add_ps(y, y), _mm256_cmp_ps(n, top, _CMP_EQ_OQ));  // exact
  const __m256i ni = _mm256_cvtps_epi32(_mm256_min_ps(n, _mm256_set1_ps(127.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// min_ps(a, b) is a < b ? a : b, as std::min(b, a) is (NaN in b passes through); max_ps
// likewise. The reference clamps min(max(up, -limit), limit).
inline __m256 clamp_gate(__m256 g, __m256 limit) { return _mm256_min_ps(limit, g); }
inline __m256 neg(__m256 x) { return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f)); }
inline __m256 clamp_up(__m256 u, __m256 limit) {
  return _mm256_min_ps(limit, _mm256_max_ps(neg(limit), u));
}

inline __m256 oai8(__m256 g, __m256 u, __m256 limit, __m256 neg_alpha) {
  g = clamp_gate(g, limit);
  u = clamp_up(u, limit);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sig = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_mul_ps(neg_alpha, g))));
  return _mm256_mul_ps(_mm256_add_ps(u, one), sig);
}

inline __m256 clamp8(__m256 g, __m256 u, __m256 limit) {
  g = clamp_gate(g, limit);
  u = clamp_up(u, limit);
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, exp8(neg(g)))), u);
}

// Whole vectors, then the tail through a zero-padded copy (same arithmetic per lane).
template <class F>
void each8(float* gate, const float* up, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(gate + i, f(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i == n) return;
  alignas(32) float g[8] = {}, u[8] = {};
  std::copy(gate + i, gate + n, g);
  std::copy(up + i, up + n, u);
  _mm256_store_ps(g, f(_mm256_load_ps(g), _mm256_load_ps(u)));
  std::copy(g, g + (n - i), gate + i);
}

void swiglu_oai_avx2(float* gate, const float* up, int64_t n, float limit, float alpha) {
  const __m256 l = _mm256_set1_ps(limit), na = _mm256_set1_ps(-alpha);
  each8(gate, up, n, [&](__m256 g, __m256 u) { return oai8(g, u, l, na); });
}

void swiglu_clamp_avx2(float* gate, const float* up, int64_t n, float limit) {
  const __m256 l = _mm256_set1_ps(limit);
  each8(gate, up, n, [&](__m256 g, __m256 u) { return clamp8(g, u, l); });
}

const ActKernels kAvx2{swiglu_oai_avx2, swiglu_clamp_avx2};

}  // namespace

const ActKernels* act_avx2_kernels() { return &kAvx2; }

}  // namespace colibri
