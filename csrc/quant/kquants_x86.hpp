// K-quant dot kernels against Q8_K for x86 (AVX2 instructions, 256-bit), written once and
// compiled twice: kquants_avx2.cpp with the AVX2 flags and AVX2's multiply-add, and
// kquants_avx512.cpp with the AVX-512 flags and VNNI's vpdpwssd (the multiply-add and the
// accumulation in one instruction; 32 vector registers allow 8-row groups). Include it only
// from those files, after defining `struct Ops` (see them): everything here has internal
// linkage, so no function built with one ISA's flags can be picked by the linker for
// another's caller.
//
// Exactness: each super-block's integer sums (isum, msum of kquants_ref.cpp) are computed
// exactly in int32 lanes and reduced to one int, then combined with the scales by the
// reference's own float expression in its order (contraction off). So every kernel here is
// BIT-IDENTICAL to the scalar reference, whatever the ISA or the row group, not merely
// close. Integer ranges: maddubs pairs of an unsigned quant (<= 63) and an int8 (|a| <= 128)
// stay within int16 (2 * 63 * 128 = 16128 < 32767); times a scale (|sc| <= 128) and summed
// in pairs by the multiply-add they stay far inside int32.
//
// Structure: `decode` turns a weight super-block into a Decoded (below): the 256 quants as
// eight 32-byte chunks of unsigned values, a register of sub-block scales and the int16
// coefficients of the activation's 16 group sums (the mins, or the scales for the offset
// of a signed quant). `isum_of` then meets it with one activation block. Decode rows<NR>
// decodes each row's block and uses it once; prefill tiles (dot_tiles.hpp) decode it once
// for several tokens. Both end in the reference's float expression per (row, token).
//
// Layout of the per-16 scales in a register: [sc0 sc2 .. sc14 | sc1 sc3 .. sc15] as int16
// (evens in the low 128-bit lane, odds in the high one), so broadcasting int16 lane c within
// each lane (bcast16(c)) gives the scale of both 16-element halves of 32-element chunk c;
// per-32 scales are [sc0 .. sc7 | sc0 .. sc7], so the same broadcast gives sub-block c's.
#pragma once
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "quant/blocks_k.hpp"
#include "quant/group_prefetch.hpp"
#include "quant/q8_k.hpp"

namespace colibri {
namespace {

inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }  // F16C: exact, as fp16_to_fp32

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

inline int hsum_i32(__m128i s) {
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// shuffle_epi8 control broadcasting int16 lane c (within each 128-bit lane).
inline __m256i bcast16(int c) { return _mm256_set1_epi16(static_cast<short>((2 * c) | ((2 * c + 1) << 8))); }

// 16 int8 scales in natural order -> [evens | odds] as int16 (signed or unsigned bytes).
inline __m128i deinterleave_bytes(__m128i s) {
  return _mm_shuffle_epi8(s, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
}

inline __m256i mask8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }

struct Decoded {
  __m256i q[8];  // quants of elements 32c .. 32c + 31, unsigned (offset added where signed)
  __m256i sc;    // sub-block scales; shuffle_epi8(sc, bcast16(c)) = chunk c's (int16)
  __m256i coef;  // int16 coefficient of each activation group sum (bsums[g])
};

// The 16 activation group sums times 16 coefficients, summed: exact.
inline int bsums_dot(const BlockQ8K& a, __m256i coef16) {
  return hsum_i32(_mm256_madd_epi16(load256(a.bsums), coef16));
}

// sum over chunks of scale * (sum of q * a): exact in int32 lanes.
template <class Ops>
inline int scaled_dot(const Decoded& d, const BlockQ8K& a) {
  __m256i acc = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    const __m256i p = _mm256_maddubs_epi16(d.q[c], load256(a.qs + 32 * c));
    acc = Ops::madd_acc(acc, p, _mm256_shuffle_epi8(d.sc, bcast16(c)));
  }
  return hsum_i32(acc);
}

// Q2_K: quants 0..3 with per-16 scales and mins (4 bits each).
struct Q2KCodec {
  using Block = BlockQ2K;
  static constexpr bool kMins = true;
  static Decoded decode(const BlockQ2K& x) {
    Decoded d;
    const __m128i s = load128(x.scales);
    d.sc = _mm256_cvtepu8_epi16(deinterleave_bytes(_mm_and_si128(s, _mm_set1_epi8(0x0f))));
    d.coef = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f)));
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load256(x.qs + 32 * h);
      for (int k = 0; k < 4; ++k) d.q[4 * h + k] = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), mask8(3));
    }
    return d;
  }
};

// Q3_K: quant + 4 = low two bits + 4 * hmask bit (0..7); the 4 * sum of the activation comes
// back through the group sums: isum = sum_g sc_g (sum (q+4) a - 4 bsum_g).
struct Q3KCodec {
  using Block = BlockQ3K;
  static constexpr bool kMins = false;
  static constexpr int kOffset = 4;
  static Decoded decode(const BlockQ3K& x) {
    Decoded d;
    uint32_t u[3];
    std::memcpy(u, x.scales, 12);
    const uint32_t m2 = 0x03030303, m4 = 0x0f0f0f0f;
    const __m128i raw = _mm_setr_epi32(static_cast<int>((u[0] & m4) | ((u[2] & m2) << 4)),
                                       static_cast<int>((u[1] & m4) | (((u[2] >> 2) & m2) << 4)),
                                       static_cast<int>(((u[0] >> 4) & m4) | (((u[2] >> 4) & m2) << 4)),
                                       static_cast<int>(((u[1] >> 4) & m4) | (((u[2] >> 6) & m2) << 4)));
    const __m128i s = _mm_sub_epi8(raw, _mm_set1_epi8(32));  // the 16 scales, -32..31
    d.sc = _mm256_cvtepi8_epi16(deinterleave_bytes(s));
    d.coef = _mm256_cvtepi8_epi16(s);
    const __m256i hm = load256(x.hmask);
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load256(x.qs + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), mask8(3));
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + k), mask8(1));
        d.q[4 * h + k] = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
      }
    }
    return d;
  }
};

// Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scales and mins (kq::scale_min_k4 unpacked four
// at a time in 32-bit words); a min meets the sum of its sub-block's two activation groups.
template <bool Five>
struct Q45KCodec {
  using Block = std::conditional_t<Five, BlockQ5K, BlockQ4K>;
  static constexpr bool kMins = true;
  static Decoded decode(const Block& x) {
    Decoded d;
    uint32_t u[3];
    std::memcpy(u, x.scales, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t sc_lo = u[0] & m6, m_lo = u[1] & m6;
    const uint32_t sc_hi = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    const uint32_t m_hi = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    d.sc = _mm256_broadcastsi128_si256(
        _mm_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), 0, 0)));
    const __m128i mins = _mm_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(m_lo), static_cast<int>(m_hi), 0, 0));
    d.coef = _mm256_setr_m128i(_mm_unpacklo_epi16(mins, mins), _mm_unpackhi_epi16(mins, mins));  // m0 m0 m1 m1 ..
    __m256i hb = _mm256_setzero_si256();
    if constexpr (Five) hb = load256(x.qh);
    for (int j = 0; j < 4; ++j) {  // 64 elements: sub-block 2j (low nibbles), 2j+1 (high)
      const __m256i bits = load256(x.qs + 32 * j);
      __m256i lo = _mm256_and_si256(bits, mask8(0x0f));
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), mask8(0x0f));
      if constexpr (Five) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), mask8(1)), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), mask8(1)), 4));
      }
      d.q[2 * j] = lo;
      d.q[2 * j + 1] = hi;
    }
    return d;
  }
};

// Q6_K: quant + 32 (0..63) from a nibble and two high bits; the 32 * sum of the activation
// comes back through the group sums: isum = sum_g sc_g (sum (q+32) a - 32 bsum_g).
struct Q6KCodec {
  using Block = BlockQ6K;
  static constexpr bool kMins = false;
  static constexpr int kOffset = 32;
  static Decoded decode(const BlockQ6K& x) {
    Decoded d;
    const __m128i s = load128(x.scales);
    d.sc = _mm256_cvtepi8_epi16(deinterleave_bytes(s));
    d.coef = _mm256_cvtepi8_epi16(s);
    for (int h = 0; h < 2; ++h) {
      const __m256i A = load256(x.ql + 64 * h), B = load256(x.ql + 64 * h + 32), H = load256(x.qh + 32 * h);
      const __m256i nib[4] = {_mm256_and_si256(A, mask8(0x0f)), _mm256_and_si256(B, mask8(0x0f)),
                              _mm256_and_si256(_mm256_srli_epi16(A, 4), mask8(0x0f)),
                              _mm256_and_si256(_mm256_srli_epi16(B, 4), mask8(0x0f))};
      for (int k = 0; k < 4; ++k) {
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2 * k), mask8(3)), 4);
        d.q[4 * h + k] = _mm256_or_si256(nib[k], hi);
      }
    }
    return d;
  }
};

// One (decoded row block, activation block) pair added into a row's sum with the
// reference's float expression: sum += d_a d isum [- d_a dmin msum].
template <class Ops, class C>
inline void accumulate(const Decoded& dec, const typename C::Block& x, const BlockQ8K& a, float* sum) {
  const int dot = scaled_dot<Ops>(dec, a);
  if constexpr (C::kMins) {
    const int msum = bsums_dot(a, dec.coef);
    const float dall = a.d * half_to_float(x.d), dmin = a.d * half_to_float(x.dmin);
    *sum += dall * static_cast<float>(dot) - dmin * static_cast<float>(msum);
  } else {
    const int isum = dot - C::kOffset * bsums_dot(a, dec.coef);
    *sum += a.d * half_to_float(x.d) * static_cast<float>(isum);
  }
}

// The kernel struct of a K-quant type: rows<NR> for decode (row_groups.hpp), tile<R, T>
// for prefill (dot_tiles.hpp). Both give every (row, token) the same operations.
template <class Ops, class C>
struct KQuant {
  using Act = BlockQ8K;
  using Block = typename C::Block;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    float sum[NR] = {};
    GroupPrefetch pf(w, stride, NR, nb);
    for (int64_t i = 0; i < nb; ++i) {
      pf.step();
      for (int r = 0; r < NR; ++r) {
        const Block& x = reinterpret_cast<const Block*>(w + r * stride)[i];
        accumulate<Ops, C>(C::decode(x), x, y[i], &sum[r]);
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = sum[r];
  }
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    float sum[R][T] = {};
    for (int64_t i = 0; i < nb; ++i)
      for (int r = 0; r < R; ++r) {
        const Block& x = reinterpret_cast<const Block*>(w + r * ws)[i];
        const Decoded dec = C::decode(x);
        for (int t = 0; t < T; ++t)
          accumulate<Ops, C>(dec, x, reinterpret_cast<const BlockQ8K*>(act + t * as)[i], &sum[r][t]);
      }
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) out[t * os + r] = sum[r][t];
  }
};

template <class Ops>
using Q2K = KQuant<Ops, Q2KCodec>;
template <class Ops>
using Q3K = KQuant<Ops, Q3KCodec>;
template <class Ops, bool Five>
using Q45K = KQuant<Ops, Q45KCodec<Five>>;
template <class Ops>
using Q6K = KQuant<Ops, Q6KCodec>;

}  // namespace
}  // namespace colibri
