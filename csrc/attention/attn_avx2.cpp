// AVX2 + FMA attention kernels (compiled with -mavx2 -mfma -mf16c -mbmi2, run only when
// the CPU has them). Scalar statement of each: attn_scalar.cpp; contract: kernels.hpp.
//
// Fixed arithmetic per element, whatever the tile: a score is 8 lanes of FMA partial sums
// (lane l takes elements l, l + 8, ...; a tail of dk % 8 is zero-padded) reduced by the
// same tree, ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)), then times the scale; an output element
// is o * alpha then one FMA per key in key order. exp is a Cephes-style polynomial (about
// 1 ulp; exactly 1 at 0, exactly 0 at -inf). Contraction is off: FMA only where written.
// Internal linkage throughout (see quant/kernels_avx2.cpp for why).
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

static_assert(kBlockKeys % 8 == 0, "softmax_block loads whole vectors");

// e^x for x <= 88; 0 for x < -87.33 (and -inf).
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), lo);
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
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

#define COLIBRI_INLINE inline __attribute__((always_inline))

// Lane i of the result is the tree sum of the 8 lanes of the i-th argument.
COLIBRI_INLINE __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                            __m256 a7) {
  const __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

COLIBRI_INLINE float hsum1(__m256 v) {
  const __m256 z = _mm256_setzero_ps();
  return _mm256_cvtss_f32(hsum8(v, z, z, z, z, z, z, z));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// Lanes [0, n) set, n in 0..8.
inline __m256i lane_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Scores of R query rows against C keys.
template <int R, int C>
COLIBRI_INLINE void score_tile(const float* q, int64_t qs, const float* k, int64_t ks, int64_t dk, float scale, float* s,
                       int64_t ld) {
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= dk; i += 8) {
    __m256 qv[R];
    for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q + r * qs + i);
    for (int c = 0; c < C; ++c) {
      const __m256 kv = _mm256_loadu_ps(k + c * ks + i);
      for (int r = 0; r < R; ++r) acc[r * C + c] = _mm256_fmadd_ps(qv[r], kv, acc[r * C + c]);
    }
  }
  if (i < dk) {
    const __m256i m = lane_mask(dk - i);
    __m256 qv[R];
    for (int r = 0; r < R; ++r) qv[r] = _mm256_maskload_ps(q + r * qs + i, m);
    for (int c = 0; c < C; ++c) {
      const __m256 kv = _mm256_maskload_ps(k + c * ks + i, m);
      for (int r = 0; r < R; ++r) acc[r * C + c] = _mm256_fmadd_ps(qv[r], kv, acc[r * C + c]);
    }
  }
  alignas(32) float out[8];
  const __m256 sums = hsum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
  _mm256_store_ps(out, _mm256_mul_ps(sums, _mm256_set1_ps(scale)));
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) s[r * ld + c] = out[r * C + c];
}

template <int R>
void score_rows(const float* q, int64_t qs, const float* k, int64_t ks, int64_t n_keys, int64_t dk,
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
  constexpr int kVecs = kBlockKeys / 8;
  __m256 v[kVecs];
  __m256 mx = _mm256_set1_ps(*m);
  for (int i = 0; i < kVecs; ++i) {
    v[i] = _mm256_loadu_ps(s + 8 * i);
    mx = _mm256_max_ps(mx, v[i]);
  }
  const float m_new = hmax(mx);
  const float alpha = _mm256_cvtss_f32(exp8(_mm256_set1_ps(*m - m_new)));  // 0 when m is -inf
  const __m256 mn = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int i = 0; i < kVecs; ++i) {
    const __m256 p = exp8(_mm256_sub_ps(v[i], mn));
    _mm256_storeu_ps(s + 8 * i, p);
    sum = _mm256_add_ps(sum, p);
  }
  *l = *l * alpha + hsum1(sum);
  *m = m_new;
  return alpha;
}

// Output dims [0, 8 * NC) of R rows; with Tail the last vector is masked by `tail`.
template <bool Tail>
COLIBRI_INLINE __m256 load_part(const float* p, __m256i tail) {
  return Tail ? _mm256_maskload_ps(p, tail) : _mm256_loadu_ps(p);
}

template <int R, int NC, bool Tail>
COLIBRI_INLINE void pv_tile(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const float* v,
                            int64_t vs, int64_t n_keys, __m256i tail) {
  __m256 acc[R][NC];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NC; ++c)
      acc[r][c] = c == NC - 1 ? load_part<Tail>(o + r * os + 8 * c, tail) : _mm256_loadu_ps(o + r * os + 8 * c);
    if (alpha) {
      const __m256 a = _mm256_set1_ps(alpha[r]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_mul_ps(acc[r][c], a);
    }
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    __m256 vv[NC];
    for (int c = 0; c < NC; ++c)
      vv[c] = c == NC - 1 ? load_part<Tail>(v + j * vs + 8 * c, tail) : _mm256_loadu_ps(v + j * vs + 8 * c);
    for (int r = 0; r < R; ++r) {
      const __m256 pj = _mm256_broadcast_ss(p + r * ps + j);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_fmadd_ps(pj, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) {
      if (Tail && c == NC - 1)
        _mm256_maskstore_ps(o + r * os + 8 * c, tail, acc[r][c]);
      else
        _mm256_storeu_ps(o + r * os + 8 * c, acc[r][c]);
    }
}

template <int R>
void pv_rows(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const float* v, int64_t vs,
             int64_t n_keys, int64_t dv) {
  int64_t d0 = 0;
  const __m256i all = lane_mask(8);
  for (; d0 + 32 <= dv; d0 += 32) pv_tile<R, 4, false>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, all);
  const int64_t left = dv - d0;
  if (left == 0) return;
  const __m256i tail = lane_mask((left - 1) % 8 + 1);
  switch ((left + 7) / 8) {
    case 3: pv_tile<R, 3, true>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, tail); break;
    case 2: pv_tile<R, 2, true>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, tail); break;
    default: pv_tile<R, 1, true>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, tail); break;
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

const Kernels kAvx2{Isa::AVX2, scores, softmax_block, pv};

}  // namespace

const Kernels* avx2_kernels() { return &kAvx2; }

}  // namespace colibri::attn
