// Q5_0 . Q8_0 and Q5_1 . Q8_1 dot kernels for x86, written once and compiled twice like
// kquants_x86.hpp (include it only from kquants_avx2.cpp / kquants_avx512.cpp, after their
// `struct Ops`; internal linkage throughout). Scalar reference: q5_ref.cpp. They are the
// kernels of Q4_0 / Q4_1 (block32_dot_x86.hpp) with the five-bit unpack: each block's integer
// sum exact in 8 int32 lanes, the blocks accumulated in float vectors, so they agree with the
// reference to rounding (the bound of tests/kernels/test_quant.py), and vec_dot_rows is
// bit-identical to vec_dot.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "quant/block32_dot_x86.hpp"
#include "quant/blocks.hpp"
#include "quant/blocks_k.hpp"

namespace colibri {
namespace {

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

// The dot kernels (block32_dot_x86.hpp) with the five-bit unpack. Q5_0's kernel uses
// maddubs on either ISA; Q5_1's takes Ops::dot_u8_i8 (vpdpbusd on AVX-512 VNNI).
template <class B>
struct Unpack5 : block32::PlainLanes {
  using Block = B;
  static __m256i quants(const Block& x) { return unpack5(x.qs, x.qh); }
};
template <class Ops>
using Q5_0 = block32::Symmetric<Unpack5<BlockQ5_0>, 16>;
template <class Ops>
using Q5_1 = block32::WithMin<Unpack5<BlockQ5_1>, Ops>;

}  // namespace
}  // namespace colibri
