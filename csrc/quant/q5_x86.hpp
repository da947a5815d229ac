// Q5_0 . Q8_0 and Q5_1 . Q8_1 dot kernels for x86, written once and compiled twice like
// kquants_x86.hpp (include it only from kquants_avx2.cpp / kquants_avx512.cpp, after their
// `struct Ops`; internal linkage throughout). Scalar reference: q5_ref.cpp. As the 32-element
// kernels of kernels_avx2.cpp, they keep each block's integer sum exact in 8 int32 lanes and
// accumulate the blocks in float vectors, so they agree with the reference to rounding (the
// bound of tests/test_quant.py), and vec_dot_rows is bit-identical to vec_dot.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "quant/blocks.hpp"
#include "quant/blocks_k.hpp"
#include "quant/group_prefetch.hpp"

namespace colibri {
namespace {

inline float hsum_f32(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Half-precision pair at p (lanes 0, 1) as floats.
inline __m128 half2(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

// The 32 five-bit quants of a block (0..31) in element order: nibbles (low nibbles are
// elements 0..15) plus 16 where bit j of qh is set. The qh word is spread so that byte j
// holds byte j / 8 of it, then each byte keeps its own bit j % 8.
inline __m256i unpack5(const uint8_t* qs, const uint8_t* qh) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i nib = _mm256_and_si256(
      _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1), _mm256_set1_epi8(0x0f));
  int32_t h;
  std::memcpy(&h, qh, sizeof h);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(h), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

// sum (q - 16) a = sum q a - sum 16 a; the second term depends on the activation only (once
// per block for all rows). int16 range: |q a pair| <= 7874, |16 a pair| <= 4064.
template <class Ops>
struct Q5_0 {
  using Act = BlockQ8_0;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    GroupPrefetch pf(w, stride, NR, nb);
    for (int64_t i = 0; i < nb; ++i) {
      pf.step();
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs));
      const __m256i sa = _mm256_maddubs_epi16(_mm256_set1_epi8(16), a);
      const __m128 da = half2(&y[i].d);  // lane 0 (lane 1 is the first quants: unused)
      for (int r = 0; r < NR; ++r) {
        const BlockQ5_0* x = reinterpret_cast<const BlockQ5_0*>(w + r * stride) + i;
        const __m256i qa = _mm256_sub_epi16(_mm256_maddubs_epi16(unpack5(x->qs, x->qh), a), sa);
        const __m256i p = _mm256_madd_epi16(qa, _mm256_set1_epi16(1));
        const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(half2(&x->d), da));
        acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = hsum_f32(acc[r]);
  }
  // R rows x T tokens (dot_tiles.hpp): each row's quants unpacked once per block, each
  // (row, token) accumulating exactly as rows<NR> does for that row.
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      __m256i q[R];
      __m128 dw[R];
      for (int r = 0; r < R; ++r) {
        const BlockQ5_0* x = reinterpret_cast<const BlockQ5_0*>(w + r * ws) + i;
        q[r] = unpack5(x->qs, x->qh);
        dw[r] = half2(&x->d);
      }
      for (int t = 0; t < T; ++t) {
        const Act* y = reinterpret_cast<const Act*>(act + t * as) + i;
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y->qs));
        const __m256i sa = _mm256_maddubs_epi16(_mm256_set1_epi8(16), a);
        const __m128 da = half2(&y->d);
        for (int r = 0; r < R; ++r) {
          const __m256i qa = _mm256_sub_epi16(_mm256_maddubs_epi16(q[r], a), sa);
          const __m256i p = _mm256_madd_epi16(qa, _mm256_set1_epi16(1));
          const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(dw[r], da));
          acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) out[t * os + r] = hsum_f32(acc[r][t]);
  }
};

// d d_a sum q a + m s: (d, m) and (d_a, s) are adjacent half pairs, one multiply gives
// d d_a (lane 0) and m s (lane 1); lane 1 of `offs` sums the offsets.
template <class Ops>
struct Q5_1 {
  using Act = BlockQ8_1;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    __m256 acc[NR];
    __m128 offs[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = _mm256_setzero_ps();
      offs[r] = _mm_setzero_ps();
    }
    GroupPrefetch pf(w, stride, NR, nb);
    for (int64_t i = 0; i < nb; ++i) {
      pf.step();
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs));
      const __m128 ds = half2(&y[i].d);
      for (int r = 0; r < NR; ++r) {
        const BlockQ5_1* x = reinterpret_cast<const BlockQ5_1*>(w + r * stride) + i;
        const __m128 prod = _mm_mul_ps(half2(&x->d), ds);
        offs[r] = _mm_add_ps(offs[r], prod);
        const __m256i p = Ops::dot_u8_i8(unpack5(x->qs, x->qh), a);
        acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = hsum_f32(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(offs[r]));
  }
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    __m256 acc[R][T];
    __m128 offs[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) {
        acc[r][t] = _mm256_setzero_ps();
        offs[r][t] = _mm_setzero_ps();
      }
    for (int64_t i = 0; i < nb; ++i) {
      __m256i q[R];
      __m128 dm[R];
      for (int r = 0; r < R; ++r) {
        const BlockQ5_1* x = reinterpret_cast<const BlockQ5_1*>(w + r * ws) + i;
        q[r] = unpack5(x->qs, x->qh);
        dm[r] = half2(&x->d);
      }
      for (int t = 0; t < T; ++t) {
        const Act* y = reinterpret_cast<const Act*>(act + t * as) + i;
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y->qs));
        const __m128 ds = half2(&y->d);
        for (int r = 0; r < R; ++r) {
          const __m128 prod = _mm_mul_ps(dm[r], ds);
          offs[r][t] = _mm_add_ps(offs[r][t], prod);
          const __m256i p = Ops::dot_u8_i8(q[r], a);
          acc[r][t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(p), acc[r][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r)
        out[t * os + r] = hsum_f32(acc[r][t]) + _mm_cvtss_f32(_mm_movehdup_ps(offs[r][t]));
  }
};

}  // namespace
}  // namespace colibri
