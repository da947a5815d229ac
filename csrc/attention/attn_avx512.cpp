// AVX-512 (F/BW/VL/DQ) attention kernels, compiled with the flags of quant's AVX-512 file
// and run only where the CPU has them (dispatch: quant/dispatch.cpp). Same structure as
// attn_avx2.cpp with 16 lanes: a score is 16 lanes of FMA partial sums (a tail of
// dk % 16 is zero-padded by a masked load), folded to 8 (lane i + lane i + 8) and reduced by
// the AVX2 tree; an output element is o * alpha then one FMA per key in key order.
// Not run on the development machine (it has no AVX-512): correct by construction and
// checked against the scalar reference by tests/test_attention_kernels.py where it runs.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <cstdint>

#include "attention/attention.hpp"
#include "attention/kernels.hpp"

namespace colibri::attn {
namespace {

static_assert(kBlockKeys % 16 == 0, "softmax_block loads whole vectors");

inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);  // x < lo, -inf (and NaN): 0
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), lo);
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
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(keep, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

inline __m256 fold(__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); }

// Lane i: the tree sum of a[i] (16 lanes folded to 8, then the 8-lane tree).
inline __m256 hsum8(const __m512* a) {
  __m256 f[8];
  for (int i = 0; i < 8; ++i) f[i] = fold(a[i]);
  const __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(f[0], f[1]), _mm256_hadd_ps(f[2], f[3]));
  const __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(f[4], f[5]), _mm256_hadd_ps(f[6], f[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

inline float hsum1(__m512 v) {
  const __m512 z = _mm512_setzero_ps();
  const __m512 a[8] = {v, z, z, z, z, z, z, z};
  return _mm256_cvtss_f32(hsum8(a));
}

inline __mmask16 lanes(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1); }

template <int R, int C>
inline void score_tile(const float* q, int64_t qs, const float* k, int64_t ks, int64_t dk, float scale, float* s,
                       int64_t ld) {
  __m512 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t i = 0; i < dk; i += 16) {
    const __mmask16 m = lanes(dk - i);
    __m512 qv[R];
    for (int r = 0; r < R; ++r) qv[r] = _mm512_maskz_loadu_ps(m, q + r * qs + i);
    for (int c = 0; c < C; ++c) {
      const __m512 kv = _mm512_maskz_loadu_ps(m, k + c * ks + i);
      for (int r = 0; r < R; ++r) acc[r * C + c] = _mm512_fmadd_ps(qv[r], kv, acc[r * C + c]);
    }
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) s[r * ld + c] = out[r * C + c];
}

template <int R>
inline void score_rows(const float* q, int64_t qs, const float* k, int64_t ks, int64_t n_keys, int64_t dk,
                       float scale, float* s, int64_t ld) {
  int64_t j = 0;
  for (; j + 4 <= n_keys; j += 4) score_tile<R, 4>(q, qs, k + j * ks, ks, dk, scale, s + j, ld);
  switch (n_keys - j) {
    case 3: score_tile<R, 3>(q, qs, k + j * ks, ks, dk, scale, s + j, ld); break;
    case 2: score_tile<R, 2>(q, qs, k + j * ks, ks, dk, scale, s + j, ld); break;
    case 1: score_tile<R, 1>(q, qs, k + j * ks, ks, dk, scale, s + j, ld); break;
    default: break;
  }
}

void scores(const float* q, int64_t q_stride, int64_t n_rows, const float* k, int64_t k_stride, int64_t n_keys,
            int64_t dk, float scale, float* s, int64_t ld) {
  int64_t r = 0;
  for (; r + 2 <= n_rows; r += 2)
    score_rows<2>(q + r * q_stride, q_stride, k, k_stride, n_keys, dk, scale, s + r * ld, ld);
  if (r < n_rows) score_rows<1>(q + r * q_stride, q_stride, k, k_stride, n_keys, dk, scale, s + r * ld, ld);
}

float softmax_block(float* s, float* m, float* l) {
  constexpr int kVecs = kBlockKeys / 16;
  __m512 v[kVecs];
  __m512 mx = _mm512_set1_ps(*m);
  for (int i = 0; i < kVecs; ++i) {
    v[i] = _mm512_loadu_ps(s + 16 * i);
    mx = _mm512_max_ps(mx, v[i]);
  }
  const float m_new = _mm512_reduce_max_ps(mx);
  const float alpha = _mm512_cvtss_f32(exp16(_mm512_set1_ps(*m - m_new)));
  const __m512 mn = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < kVecs; ++i) {
    const __m512 p = exp16(_mm512_sub_ps(v[i], mn));
    _mm512_storeu_ps(s + 16 * i, p);
    sum = _mm512_add_ps(sum, p);
  }
  *l = *l * alpha + hsum1(sum);
  *m = m_new;
  return alpha;
}

template <int R, int NC>
inline void pv_tile(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const float* v,
                    int64_t vs, int64_t n_keys, __mmask16 tail) {
  __m512 acc[R][NC];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NC; ++c)
      acc[r][c] = _mm512_maskz_loadu_ps(c == NC - 1 ? tail : static_cast<__mmask16>(0xffff), o + r * os + 16 * c);
    if (alpha) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_mul_ps(acc[r][c], a);
    }
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    __m512 vv[NC];
    for (int c = 0; c < NC; ++c)
      vv[c] = _mm512_maskz_loadu_ps(c == NC - 1 ? tail : static_cast<__mmask16>(0xffff), v + j * vs + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 pj = _mm512_set1_ps(p[r * ps + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(pj, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c)
      _mm512_mask_storeu_ps(o + r * os + 16 * c, c == NC - 1 ? tail : static_cast<__mmask16>(0xffff), acc[r][c]);
}

template <int R>
inline void pv_rows(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const float* v,
                    int64_t vs, int64_t n_keys, int64_t dv) {
  for (int64_t d0 = 0; d0 < dv; d0 += 64) {
    const int64_t left = dv - d0;
    const __mmask16 tail = lanes(left >= 64 ? 16 : (left - 1) % 16 + 1);
    switch (left >= 64 ? 4 : (left + 15) / 16) {
      case 4: pv_tile<R, 4>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, tail); break;
      case 3: pv_tile<R, 3>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, tail); break;
      case 2: pv_tile<R, 2>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, tail); break;
      default: pv_tile<R, 1>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, tail); break;
    }
  }
}

void pv(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
        const float* v, int64_t v_stride, int64_t n_keys, int64_t dv) {
  int64_t r = 0;
  for (; r + 2 <= n_rows; r += 2)
    pv_rows<2>(o + r * o_stride, o_stride, p + r * p_stride, p_stride, alpha ? alpha + r : nullptr, v, v_stride,
               n_keys, dv);
  if (r < n_rows)
    pv_rows<1>(o + r * o_stride, o_stride, p + r * p_stride, p_stride, alpha ? alpha + r : nullptr, v, v_stride,
               n_keys, dv);
}

const Kernels kAvx512{Isa::AVX512, scores, softmax_block, pv};

}  // namespace

const Kernels* avx512_kernels() { return &kAvx512; }

}  // namespace colibri::attn
