// AVX2 + FMA attention kernels (compiled with -mavx2 -mfma -mf16c -mbmi2, run only when
// the CPU has them). Scalar statement of each: attn_scalar.cpp; contract: kernels.hpp.
//
// Rows are read at the cache's type and converted on load (F16C for F16, a shift for BF16,
// int8 x scale for Q8_0: all exact), up to 4 query rows sharing each key / value load.
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

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/attention.hpp"
#include "attention/kernels.hpp"
#include "quant/blocks.hpp"

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

// How each cache type is read: elements [i, i + 8) of a row as F32 (exact), and the
// zero-padded tail of n < 8 elements at i (never read past the row).
struct F32Elems {
  static COLIBRI_INLINE __m256 load(const unsigned char* row, int64_t i) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  }
  static COLIBRI_INLINE __m256 tail(const unsigned char* row, int64_t i, int64_t n) {
    return _mm256_maskload_ps(reinterpret_cast<const float*>(row) + i, lane_mask(n));
  }
};

COLIBRI_INLINE __m128i half_tail(const unsigned char* p, int64_t n) {
  alignas(16) uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(h, p, static_cast<std::size_t>(n) * sizeof(uint16_t));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(h));
}

struct F16Elems {
  static COLIBRI_INLINE __m256 load(const unsigned char* row, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  }
  static COLIBRI_INLINE __m256 tail(const unsigned char* row, int64_t i, int64_t n) {
    return _mm256_cvtph_ps(half_tail(row + 2 * i, n));
  }
};

struct BF16Elems {
  static COLIBRI_INLINE __m256 widen(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static COLIBRI_INLINE __m256 load(const unsigned char* row, int64_t i) {
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  }
  static COLIBRI_INLINE __m256 tail(const unsigned char* row, int64_t i, int64_t n) {
    return widen(half_tail(row + 2 * i, n));
  }
};

// Q8_0: i is a multiple of 8 and the row whole blocks, so 8 elements never straddle a
// block. q * d is exact in F32 (an 8-bit integer times an 11-bit half mantissa).
struct Q8Elems {
  static COLIBRI_INLINE __m256 load(const unsigned char* row, int64_t i) {
    const unsigned char* block = row + (i / kQK) * static_cast<int64_t>(sizeof(BlockQ8_0));
    uint16_t d;
    std::memcpy(&d, block + offsetof(BlockQ8_0, d), sizeof d);
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + offsetof(BlockQ8_0, qs) + i % kQK));
    const __m256 scale = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(d)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), scale);
  }
  static COLIBRI_INLINE __m256 tail(const unsigned char* row, int64_t i, int64_t n) {
    return _mm256_and_ps(load(row, i), _mm256_castsi256_ps(lane_mask(n)));  // unreachable: whole blocks
  }
};

// Scores of R query rows against C keys (R * C <= 8 accumulators).
template <class E, int R, int C>
COLIBRI_INLINE void score_tile(const float* q, int64_t qs, const unsigned char* k, int64_t ks, int64_t dk, float scale,
                               float* s, int64_t ld) {
  static_assert(R * C <= 8, "one reduction of 8 sums");
  __m256 acc[8];
  COLIBRI_UNROLL for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= dk; i += 8) {
    __m256 qv[R];
    COLIBRI_UNROLL for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q + r * qs + i);
    COLIBRI_UNROLL for (int c = 0; c < C; ++c) {
      const __m256 kv = E::load(k + c * ks, i);
      COLIBRI_UNROLL for (int r = 0; r < R; ++r) acc[r * C + c] = _mm256_fmadd_ps(qv[r], kv, acc[r * C + c]);
    }
  }
  if (i < dk) {
    const __m256i m = lane_mask(dk - i);
    __m256 qv[R];
    COLIBRI_UNROLL for (int r = 0; r < R; ++r) qv[r] = _mm256_maskload_ps(q + r * qs + i, m);
    COLIBRI_UNROLL for (int c = 0; c < C; ++c) {
      const __m256 kv = E::tail(k + c * ks, i, dk - i);
      COLIBRI_UNROLL for (int r = 0; r < R; ++r) acc[r * C + c] = _mm256_fmadd_ps(qv[r], kv, acc[r * C + c]);
    }
  }
  alignas(32) float out[8];
  const __m256 sums = hsum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
  _mm256_store_ps(out, _mm256_mul_ps(sums, _mm256_set1_ps(scale)));
  COLIBRI_UNROLL for (int r = 0; r < R; ++r)
    COLIBRI_UNROLL for (int c = 0; c < C; ++c) s[r * ld + c] = out[r * C + c];
}

// R rows (1..4) against every key: up to 4 rows share each key load.
template <class E, int R>
void score_rows(const float* q, int64_t qs, const Rows& k, int64_t n_keys, int64_t dk, float scale, float* s,
                int64_t ld, bool prefetch) {
  constexpr int C = R <= 2 ? 4 : 2;
  int64_t j = 0;
  for (; j + C <= n_keys; j += C) {
    if (prefetch)
      COLIBRI_UNROLL for (int c = 0; c < C; ++c) prefetch_ahead(k, j + c);
    score_tile<E, R, C>(q, qs, k.data + j * k.stride, k.stride, dk, scale, s + j, ld);
  }
  for (; j < n_keys; ++j) {
    if (prefetch) prefetch_ahead(k, j);
    score_tile<E, R, 1>(q, qs, k.data + j * k.stride, k.stride, dk, scale, s + j, ld);
  }
}

template <class E>
void scores_as(const float* q, int64_t q_stride, int64_t n_rows, const Rows& k, int64_t n_keys, int64_t dk,
               float scale, float* s, int64_t ld) {
  for (int64_t r = 0; r < n_rows; r += 4) {
    const bool prefetch = r == 0 && k.prefetch > 0;  // the first pass over the keys asks ahead
    const float* qr = q + r * q_stride;
    float* sr = s + r * ld;
    switch (n_rows - r) {
      case 1: score_rows<E, 1>(qr, q_stride, k, n_keys, dk, scale, sr, ld, prefetch); break;
      case 2: score_rows<E, 2>(qr, q_stride, k, n_keys, dk, scale, sr, ld, prefetch); break;
      case 3: score_rows<E, 3>(qr, q_stride, k, n_keys, dk, scale, sr, ld, prefetch); break;
      default: score_rows<E, 4>(qr, q_stride, k, n_keys, dk, scale, sr, ld, prefetch); break;
    }
  }
}

void scores(const float* q, int64_t q_stride, int64_t n_rows, const Rows& k, int64_t n_keys, int64_t dk,
            float scale, float* s, int64_t ld) {
  switch (k.type) {
    case DType::F16: return scores_as<F16Elems>(q, q_stride, n_rows, k, n_keys, dk, scale, s, ld);
    case DType::BF16: return scores_as<BF16Elems>(q, q_stride, n_rows, k, n_keys, dk, scale, s, ld);
    case DType::Q8_0: return scores_as<Q8Elems>(q, q_stride, n_rows, k, n_keys, dk, scale, s, ld);
    default: return scores_as<F32Elems>(q, q_stride, n_rows, k, n_keys, dk, scale, s, ld);
  }
}

float softmax_block(float* s, float* m, float* l) {
  constexpr int kVecs = kBlockKeys / 8;
  __m256 v[kVecs];
  __m256 mx = _mm256_set1_ps(*m);
  COLIBRI_UNROLL for (int i = 0; i < kVecs; ++i) {
    v[i] = _mm256_loadu_ps(s + 8 * i);
    mx = _mm256_max_ps(mx, v[i]);
  }
  const float m_new = hmax(mx);
  const float alpha = _mm256_cvtss_f32(exp8(_mm256_set1_ps(*m - m_new)));  // 0 when m is -inf
  const __m256 mn = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  COLIBRI_UNROLL for (int i = 0; i < kVecs; ++i) {
    const __m256 p = exp8(_mm256_sub_ps(v[i], mn));
    _mm256_storeu_ps(s + 8 * i, p);
    sum = _mm256_add_ps(sum, p);
  }
  *l = *l * alpha + hsum1(sum);
  *m = m_new;
  return alpha;
}

// Output dims [d0, d0 + 8 * NC) of R rows; with Tail the last vector holds `tail` dims.
template <class E, int R, int NC, bool Tail>
COLIBRI_INLINE void pv_tile(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const Rows& v,
                            int64_t d0, int64_t n_keys, int64_t tail, bool prefetch) {
  const __m256i tmask = lane_mask(tail);
  __m256 acc[R][NC];
  COLIBRI_UNROLL for (int r = 0; r < R; ++r) {
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c)
      acc[r][c] = Tail && c == NC - 1 ? _mm256_maskload_ps(o + r * os + 8 * c, tmask)
                                      : _mm256_loadu_ps(o + r * os + 8 * c);
    if (alpha) {
      const __m256 a = _mm256_set1_ps(alpha[r]);
      COLIBRI_UNROLL for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_mul_ps(acc[r][c], a);
    }
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    if (prefetch) prefetch_ahead(v, j);
    const unsigned char* row = v.data + j * v.stride;
    __m256 pj[R];
    COLIBRI_UNROLL for (int r = 0; r < R; ++r) pj[r] = _mm256_broadcast_ss(p + r * ps + j);
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c) {
      const __m256 vv = Tail && c == NC - 1 ? E::tail(row, d0 + 8 * c, tail) : E::load(row, d0 + 8 * c);
      COLIBRI_UNROLL for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(pj[r], vv, acc[r][c]);
    }
  }
  COLIBRI_UNROLL for (int r = 0; r < R; ++r)
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c) {
      if (Tail && c == NC - 1)
        _mm256_maskstore_ps(o + r * os + 8 * c, tmask, acc[r][c]);
      else
        _mm256_storeu_ps(o + r * os + 8 * c, acc[r][c]);
    }
}

// R rows (1..4): 8 * NC output dims at a time, every key's value row read once per pass.
template <class E, int R>
void pv_rows(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const Rows& v, int64_t n_keys,
             int64_t dv, bool prefetch) {
  constexpr int NC = R <= 2 ? 4 : 2;
  int64_t d0 = 0;
  for (; d0 + 8 * NC <= dv; d0 += 8 * NC) {
    pv_tile<E, R, NC, false>(o + d0, os, p, ps, alpha, v, d0, n_keys, 8, prefetch);
    prefetch = false;  // the later passes find the rows in L1
  }
  const int64_t left = dv - d0;
  if (left == 0) return;
  const int64_t tail = (left - 1) % 8 + 1;
  switch ((left + 7) / 8) {
    case 1: pv_tile<E, R, 1, true>(o + d0, os, p, ps, alpha, v, d0, n_keys, tail, prefetch); break;
    case 2: pv_tile<E, R, NC < 2 ? NC : 2, true>(o + d0, os, p, ps, alpha, v, d0, n_keys, tail, prefetch); break;
    case 3: pv_tile<E, R, NC < 3 ? NC : 3, true>(o + d0, os, p, ps, alpha, v, d0, n_keys, tail, prefetch); break;
    default: pv_tile<E, R, NC, true>(o + d0, os, p, ps, alpha, v, d0, n_keys, tail, prefetch); break;
  }
}

template <class E>
void pv_as(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
           const Rows& v, int64_t n_keys, int64_t dv) {
  for (int64_t r = 0; r < n_rows; r += 4) {
    const bool prefetch = r == 0 && v.prefetch > 0;
    float* orow = o + r * o_stride;
    const float* pr = p + r * p_stride;
    const float* ar = alpha ? alpha + r : nullptr;
    switch (n_rows - r) {
      case 1: pv_rows<E, 1>(orow, o_stride, pr, p_stride, ar, v, n_keys, dv, prefetch); break;
      case 2: pv_rows<E, 2>(orow, o_stride, pr, p_stride, ar, v, n_keys, dv, prefetch); break;
      case 3: pv_rows<E, 3>(orow, o_stride, pr, p_stride, ar, v, n_keys, dv, prefetch); break;
      default: pv_rows<E, 4>(orow, o_stride, pr, p_stride, ar, v, n_keys, dv, prefetch); break;
    }
  }
}

void pv(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
        const Rows& v, int64_t n_keys, int64_t dv) {
  switch (v.type) {
    case DType::F16: return pv_as<F16Elems>(o, o_stride, n_rows, p, p_stride, alpha, v, n_keys, dv);
    case DType::BF16: return pv_as<BF16Elems>(o, o_stride, n_rows, p, p_stride, alpha, v, n_keys, dv);
    case DType::Q8_0: return pv_as<Q8Elems>(o, o_stride, n_rows, p, p_stride, alpha, v, n_keys, dv);
    default: return pv_as<F32Elems>(o, o_stride, n_rows, p, p_stride, alpha, v, n_keys, dv);
  }
}

const Kernels kAvx2{Isa::AVX2, scores, softmax_block, pv};

}  // namespace

const Kernels* avx2_kernels() { return &kAvx2; }

}  // namespace colibri::attn
