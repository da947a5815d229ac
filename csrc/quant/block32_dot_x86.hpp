// The 32-element block dot kernels for x86 that differ only in how a block's quants are
// unpacked: Q4_0 / Q5_0 (d (q - offset), against Q8_0) and Q4_1 / Q5_1 (d q + m, against
// Q8_1). Each kernel is a template over an Unpack struct:
//
//   struct Unpack : block32::PlainLanes {
//     using Block = BlockQ4_1;                  // the weight block
//     static __m256i quants(const Block& x);    // its 32 quants, one per byte
//     static float sum(__m256 acc); };          // an accumulator's lanes -> the dot
//
// quants() gives them in element order with PlainLanes's sum() (adds the 8 lanes), or,
// for WithMin with a Dot that cannot saturate, in a layout whose lane factor sum() undoes:
// kernels_avx512.cpp's Q4_1 keeps the high nibbles times 16 in lanes 4..7 (VNNI) and
// scales those lanes back once in sum(). Symmetric needs element order (its offset term
// is computed from the activation alone).
// Included from kernels_avx2.cpp (Q4_x), kernels_avx512.cpp (Q4_1) and q5_x86.hpp (Q5_x,
// compiled for AVX2 and AVX-512); internal linkage throughout, so no function compiled
// with one ISA's flags is picked by the linker for another. The kernels keep each block's
// integer sum exact in 8 int32 lanes and accumulate the blocks in float vectors;
// tile<R, T> repeats rows<NR>'s operations per (row, token) in the same order, so prefill
// tiles equal vec_dot bit for bit (dot_tiles.hpp). Scalar references: reference.cpp
// (Q4_x), q5_ref.cpp (Q5_x).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.hpp"
#include "quant/dot_tiles.hpp"
#include "quant/group_prefetch.hpp"

namespace colibri {
namespace {
namespace block32 {

inline float hsum(__m256 v) {
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

inline __m256i load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Unpack's sum() for quants in element order: the plain sum of the 8 lanes.
struct PlainLanes {
  static float sum(__m256 acc) { return hsum(acc); }
};

// d d_a sum (q - kOffset) a = d d_a (sum q a - sum kOffset a); the second sum depends on the
// activation only (once per block for all rows). int16 range for 5-bit quants (the larger
// case): |q a pair| <= 7874, |16 a pair| <= 4064, so the difference cannot saturate.
template <class Unpack, int kOffset>
struct Symmetric {
  using Act = BlockQ8_0;
  using Block = typename Unpack::Block;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    GroupPrefetch pf(w, stride, NR, nb);
    for (int64_t i = 0; i < nb; ++i) {
      pf.step();
      const __m256i a = load(y[i].qs);
      const __m256i ea = _mm256_maddubs_epi16(_mm256_set1_epi8(kOffset), a);
      const __m128 da = half2(&y[i].d);  // lane 0 (lane 1 is the first quants: unused)
      for (int r = 0; r < NR; ++r) {
        const Block* x = reinterpret_cast<const Block*>(w + r * stride) + i;
        const __m256i qa = _mm256_sub_epi16(_mm256_maddubs_epi16(Unpack::quants(*x), a), ea);
        const __m256i p = _mm256_madd_epi16(qa, _mm256_set1_epi16(1));
        const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(half2(&x->d), da));
        acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = Unpack::sum(acc[r]);
  }
  // R rows x T tokens (dot_tiles::tile_loop): each row's quants unpacked once per block for
  // all T tokens, each token's offset term once for all R rows.
  struct Row {
    __m256i q;
    __m128 d;
  };
  struct Token {
    __m256i a, ea;
    __m128 d;
  };
  using Acc = __m256;
  static Row row(const Block& x) { return {Unpack::quants(x), half2(&x.d)}; }
  static Token token(const Act& y) {
    const __m256i a = load(y.qs);
    return {a, _mm256_maddubs_epi16(_mm256_set1_epi8(kOffset), a), half2(&y.d)};
  }
  static Acc zero() { return _mm256_setzero_ps(); }
  static void madd(const Row& x, const Token& y, Acc& acc) {
    const __m256i qa = _mm256_sub_epi16(_mm256_maddubs_epi16(x.q, y.a), y.ea);
    const __m256i p = _mm256_madd_epi16(qa, _mm256_set1_epi16(1));
    const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(x.d, y.d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
  }
  static float sum(const Acc& acc) { return Unpack::sum(acc); }
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    dot_tiles::tile_loop<Symmetric, R, T>(nb, w, ws, act, as, out, os);
  }
};

// d d_a sum q a + m s: (d, m) and (d_a, s) are adjacent half pairs, one multiply gives
// d d_a (lane 0) and m s (lane 1); lane 1 of `offs` sums the offsets. Dot::dot_u8_i8(u, s)
// sums u[i] s[i] over each group of 4 bytes into 8 int32 lanes (maddubs + madd on AVX2,
// vpdpbusd on AVX-512 VNNI: the same integers, as no product or sum here overflows).
template <class Unpack, class Dot>
struct WithMin {
  using Act = BlockQ8_1;
  using Block = typename Unpack::Block;
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
      const __m256i a = load(y[i].qs);
      const __m128 ds = half2(&y[i].d);
      for (int r = 0; r < NR; ++r) {
        const Block* x = reinterpret_cast<const Block*>(w + r * stride) + i;
        const __m128 prod = _mm_mul_ps(half2(&x->d), ds);
        offs[r] = _mm_add_ps(offs[r], prod);
        const __m256i p = Dot::dot_u8_i8(Unpack::quants(*x), a);
        acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = Unpack::sum(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(offs[r]));
  }
  // R rows x T tokens (dot_tiles::tile_loop): the quants and (d, m) once per row and block.
  struct Row {
    __m256i q;
    __m128 dm;
  };
  struct Token {
    __m256i a;
    __m128 ds;
  };
  struct Acc {
    __m256 dot;
    __m128 offs;
  };
  static Row row(const Block& x) { return {Unpack::quants(x), half2(&x.d)}; }
  static Token token(const Act& y) { return {load(y.qs), half2(&y.d)}; }
  static Acc zero() { return {_mm256_setzero_ps(), _mm_setzero_ps()}; }
  static void madd(const Row& x, const Token& y, Acc& acc) {
    const __m128 prod = _mm_mul_ps(x.dm, y.ds);
    acc.offs = _mm_add_ps(acc.offs, prod);
    const __m256i p = Dot::dot_u8_i8(x.q, y.a);
    acc.dot = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(p), acc.dot);
  }
  static float sum(const Acc& acc) { return Unpack::sum(acc.dot) + _mm_cvtss_f32(_mm_movehdup_ps(acc.offs)); }
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    dot_tiles::tile_loop<WithMin, R, T>(nb, w, ws, act, as, out, os);
  }
};

}  // namespace block32
}  // namespace
}  // namespace colibri
