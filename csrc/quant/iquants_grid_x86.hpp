// Matrix-vector kernels of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
// IQ1_M) for x86: included only by iquants_x86.hpp, after its helpers (internal linkage,
// compiled once per ISA with that ISA's Ops). The same exact integer per super-block as the
// scalar reference (quant/iquants_ref.cpp), then the same float step: bit-identical to it.
//
// Per 32 weights: the grid rows are gathered with scalar table loads into one vector (a
// hardware gather measured slower), the activations get the weights' signs, and unsigned grid
// x signed activation pairs (vpmaddubsw) are weighted by the sub-block scale. IQ1_* instead
// make the weights unsigned (an offset per weight, taken back once per super-block from the
// Q8_K block sums) and need no signs (Ops::pair_madd). Grid indices, signs and scales are
// prepared for a whole super-block (8 sub-blocks) at once with vector ops (16-bit indices
// read back 4 per 64-bit word); for IQ2_* / IQ3_* the signs are applied by Ops::pair_dot (AVX2: a byte mask built by
// compare, then two ymm multiply-adds; AVX-512: one masked subtract and one zmm
// multiply-add for both sub-blocks). The 8th sign of a 7-bit group (IQ2_XXS, IQ2_XS,
// IQ3_XXS) is the parity of the other 7, the rule behind kKsignsIq2xs. IQ2_XXS on AVX2
// instead loads 8 sign bytes per 8 weights from a 128-entry table (Ops::kEvenSignsByTable),
// measured faster there. Two 32-weight sub-blocks per step (two accumulators on AVX2) keep
// the multiply-accumulate chains short.
#pragma once

namespace colibri {
namespace {

// Bytes of 7 sign bits each (bit 7 clear) -> the same with bit 7 set where the other 7 have
// an odd count: kKsignsIq2xs[k] = k | parity(k) << 7, computed 32 bytes at a time.
inline __m256i with_even_parity(__m256i b) {
  __m256i t = _mm256_xor_si256(b, _mm256_srli_epi32(b, 4));  // bit 0 of each byte: its parity
  t = _mm256_xor_si256(t, _mm256_srli_epi32(t, 2));
  t = _mm256_xor_si256(t, _mm256_srli_epi32(t, 1));
  return _mm256_or_si256(b, _mm256_slli_epi32(_mm256_and_si256(t, _mm256_set1_epi8(1)), 7));
}

// The sign masks and scales of one super-block's 8 sub-blocks, computed from their 8 sign
// words at once. bits, 32-bit lane k: bit j of byte l set where weight 8 l + j of sub-block k
// is negative, from the word's 4 x 7 sign bits plus an 8th bit per byte that makes the count
// of negatives even (kKsignsIq2xs[k] = k | parity(k) << 7, computed instead of looked up).
// ls16: the 8 sub-blocks' odd scales 2 s + 1 (s = the word's top 4 bits) as int16, in both
// 128-bit lanes.
struct EvenSigns {
  __m256i bits, ls16;

  explicit EvenSigns(__m256i words) {
    const __m256i m7 = _mm256_set1_epi32(0x7f);
    __m256i b = _mm256_and_si256(words, m7);
    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi32(words, 1), _mm256_slli_epi32(m7, 8)));
    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi32(words, 2), _mm256_slli_epi32(m7, 16)));
    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi32(words, 3), _mm256_slli_epi32(m7, 24)));
    bits = with_even_parity(b);
    const __m256i s = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(words, 28), 1), _mm256_set1_epi32(1));
    ls16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(s, s), 0x88);  // s0..s7 | s0..s7
  }

  // Sub-block k's scale in all 16 int16 lanes.
  __m256i scale(int k) const;
};

// vpshufb controls for the scale picks below, as data: loaded by the shuffle as a memory
// operand, where a constant written as _mm256_set1_epi16 / _mm256_set_m128i was built with a
// scalar move, a broadcast and an insert per use. word[k]: int16 k (bytes 2 k, 2 k + 1) in
// every lane; same[k]: byte k zero-extended into every int16 lane; pair[k]: byte 2 k into
// lanes 0..7, byte 2 k + 1 into lanes 8..15.
struct ScalePicks {
  alignas(32) uint8_t word[8][32];
  alignas(32) uint8_t same[8][32];
  alignas(32) uint8_t pair[8][32];
  constexpr ScalePicks() : word(), same(), pair() {
    for (int k = 0; k < 8; ++k) {
      for (int b = 0; b < 32; b += 2) {
        word[k][b] = static_cast<uint8_t>(2 * k);
        word[k][b + 1] = static_cast<uint8_t>(2 * k + 1);
        same[k][b] = static_cast<uint8_t>(k);
        same[k][b + 1] = 0xff;
        pair[k][b] = static_cast<uint8_t>(b < 16 ? 2 * k : 2 * k + 1);
        pair[k][b + 1] = 0xff;
      }
    }
  }
};
inline constexpr ScalePicks kScalePicks{};

inline __m256i EvenSigns::scale(int k) const { return _mm256_shuffle_epi8(ls16, load256(kScalePicks.word[k])); }

// Sign bytes (+1 / -1, element 0 lowest) of an 8-weight group from its 7 sign bits, with the
// 8th sign making the count of negatives even: the bytes kSigns8 holds for kKsignsIq2xs[k].
struct EvenSignTable {
  uint64_t v[128];
  constexpr EvenSignTable() : v() {
    for (int k = 0; k < 128; ++k) {
      int bits = k, parity = 0;
      for (int j = 0; j < 7; ++j) parity ^= (k >> j) & 1;
      bits |= parity << 7;
      uint64_t w = 0;
      for (int j = 0; j < 8; ++j) w |= static_cast<uint64_t>((bits >> j) & 1 ? 0xffu : 0x01u) << (8 * j);
      v[k] = w;
    }
  }
};
inline constexpr EvenSignTable kEvenSigns8{};

// Four 8-byte grid rows, element 0 of row 0 in the lowest byte.
inline __m256i grid_rows4(const uint64_t* grid, const uint8_t* idx) {
  return _mm256_set_epi64x(static_cast<long long>(grid[idx[3]]), static_cast<long long>(grid[idx[2]]),
                           static_cast<long long>(grid[idx[1]]), static_cast<long long>(grid[idx[0]]));
}

// Eight 4-byte grid rows.
inline __m256i grid_rows8(const uint32_t* grid, const uint8_t* idx) {
  return _mm256_set_epi32(static_cast<int>(grid[idx[7]]), static_cast<int>(grid[idx[6]]), static_cast<int>(grid[idx[5]]),
                          static_cast<int>(grid[idx[4]]), static_cast<int>(grid[idx[3]]), static_cast<int>(grid[idx[2]]),
                          static_cast<int>(grid[idx[1]]), static_cast<int>(grid[idx[0]]));
}

float vec_dot_iq2_xxs(int64_t n, const void* w, const void* a) {
  const BlockIQ2_XXS* x = static_cast<const BlockIQ2_XXS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Per 32 weights 8 bytes: 4 grid indices, then the sign / scale word (words 1, 3, .., 15).
    const auto* q = reinterpret_cast<const uint8_t*>(x[i].qs);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    if constexpr (Ops::kEvenSignsByTable) {
      const uint64_t* sv = kEvenSigns8.v;
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const uint32_t sg = load_u32(q + 8 * k + 4);
        const __m256i s = signs4(sv[sg & 127], sv[(sg >> 7) & 127], sv[(sg >> 14) & 127], sv[(sg >> 21) & 127]);
        const __m256i p = _mm256_maddubs_epi16(grid_rows4(iq::kIq2xxsGrid, q + 8 * k),
                                               _mm256_sign_epi8(load256(y[i].qs + 32 * k), s));
        const __m256i ls = _mm256_set1_epi16(static_cast<short>(2 * (sg >> 28) + 1));
        if (k & 1) {
          acc1 = Ops::madd_acc(acc1, p, ls);
        } else {
          acc0 = Ops::madd_acc(acc0, p, ls);
        }
      }
    } else {
      const __m256 lo = _mm256_castsi256_ps(load256(q)), hi = _mm256_castsi256_ps(load256(q + 32));
      const __m256i odd = _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, 0xdd));  // words 1 3 9 11 | 5 7 13 15
      const EvenSigns es(_mm256_permute4x64_epi64(odd, 0xd8));
      Ops::Acc acc = Ops::acc_zero();
#pragma GCC unroll 4
      for (int k = 0; k < 8; k += 2) {
        acc = Ops::pair_dot(acc, grid_rows4(iq::kIq2xxsGrid, q + 8 * k), grid_rows4(iq::kIq2xxsGrid, q + 8 * k + 8),
                            y[i].qs + 32 * k, es.bits, k, es.scale(k), es.scale(k + 1));
      }
      acc0 = Ops::acc_fold(acc);
    }
    sum += dd(x[i].d, y[i]) * static_cast<float>(hsum_epi32(_mm256_add_epi32(acc0, acc1)));
  }
  return 0.125f * sum;
}

float vec_dot_iq3_xxs(int64_t n, const void* w, const void* a) {
  const BlockIQ3_XXS* x = static_cast<const BlockIQ3_XXS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // 8 grid indices per 32 weights, then (qs + 64) one sign / scale word per 32.
    const uint8_t* q = x[i].qs;
    const EvenSigns es(load256(x[i].qs + kQKK / 4));
    Ops::Acc acc = Ops::acc_zero();
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      acc = Ops::pair_dot(acc, grid_rows8(iq::kIq3xxsGrid, q + 8 * k), grid_rows8(iq::kIq3xxsGrid, q + 8 * k + 8),
                          y[i].qs + 32 * k, es.bits, k, es.scale(k), es.scale(k + 1));
    }
    sum += dd(x[i].d, y[i]) * static_cast<float>(hsum_epi32(Ops::acc_fold(acc)));
  }
  return 0.25f * sum;
}

// ---- IQ2_XS, IQ2_S, IQ3_S: 9- or 10-bit grid indices, 4-bit scales ------------------------
// The indices of IQ2_S / IQ3_S are assembled with vector ops into an array first (a scalar
// assembly costs 3-4 operations per index; IQ2_XS's are one mask each, read in scalar code),
// the signs are 32 bits per sub-block (IQ2_S, IQ3_S: stored as such; IQ2_XS: 7 per 8 weights
// plus the even-parity 8th) applied by Ops::pair_dot, and the scales are picked per
// sub-block by one byte shuffle from a table of the super-block's 16 (or 8) odd scales.

// Per 16 weights the odd scale 2 s + 1 of 4-bit scale nibbles: 8 scale bytes (low nibble:
// weights 0..15 of sub-block k, high: 16..31) -> bytes lo0 hi0 lo1 hi1 .. in both halves.
inline __m256i odd_scale_bytes(const uint8_t* scales, int nbytes) {
  const __m128i b = nbytes == 8 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales))
                                : _mm_cvtsi32_si128(static_cast<int>(load_u32(scales)));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
  const __m128i odd = _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1));
  return _mm256_set_m128i(odd, odd);
}

// Scale bytes picked into int16 lanes: lanes 0..7 get byte `lo`, lanes 8..15 byte `hi`, where
// hi == lo (0..7) or lo even and hi == lo + 1 (constants once inlined).
inline __m256i pick_scales(__m256i table, int lo, int hi) {
  const uint8_t* ctrl = hi == lo ? kScalePicks.same[lo] : kScalePicks.pair[lo / 2];
  return _mm256_shuffle_epi8(table, load256(ctrl));
}

// Four 8-byte grid rows / eight 4-byte grid rows from 16-bit indices, read 4 to a 64-bit
// word and split with shifts: left to itself the compiler reads the index array it just
// stored back with one vpextrw per index (two vector micro-ops each, on the ports the dot
// products need); a 64-bit move per 4 indices and integer shifts cost the vector side less.
inline uint64_t four_indices(const uint16_t* idx) {
  uint64_t v;
  std::memcpy(&v, idx, sizeof v);
  return v;
}
inline __m256i grid_rows4(const uint64_t* grid, const uint16_t* idx) {
  const uint64_t v = four_indices(idx);
  return _mm256_set_epi64x(static_cast<long long>(grid[v >> 48]), static_cast<long long>(grid[(v >> 32) & 0xffff]),
                           static_cast<long long>(grid[(v >> 16) & 0xffff]), static_cast<long long>(grid[v & 0xffff]));
}
inline __m256i grid_rows8(const uint32_t* grid, const uint16_t* idx) {
  const uint64_t v = four_indices(idx), u = four_indices(idx + 4);
  return _mm256_set_epi32(static_cast<int>(grid[u >> 48]), static_cast<int>(grid[(u >> 32) & 0xffff]),
                          static_cast<int>(grid[(u >> 16) & 0xffff]), static_cast<int>(grid[u & 0xffff]),
                          static_cast<int>(grid[v >> 48]), static_cast<int>(grid[(v >> 32) & 0xffff]),
                          static_cast<int>(grid[(v >> 16) & 0xffff]), static_cast<int>(grid[v & 0xffff]));
}

// Four grid rows with their indices computed in scalar code from the block's bytes (IQ2_XS:
// a load and a mask each): integer work beside the vector work, where indices assembled with
// vector ops are read back per row with vpextrw (the compiler's choice), on the vector ports.
// Measured slower than the vector assembly for IQ2_S / IQ3_S / IQ1_* (more scalar work per
// index there).
template <class Index>
inline __m256i grid_rows4_at(const uint64_t* grid, Index index) {
  return _mm256_set_epi64x(static_cast<long long>(grid[index(3)]), static_cast<long long>(grid[index(2)]),
                           static_cast<long long>(grid[index(1)]), static_cast<long long>(grid[index(0)]));
}

float vec_dot_iq2_xs(int64_t n, const void* w, const void* a) {
  const BlockIQ2_XS* x = static_cast<const BlockIQ2_XS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // qs[g] = 9-bit grid index | 7 sign bits << 9, per 8 weights.
    const __m256i w0 = load256(x[i].qs), w1 = load256(x[i].qs + 16);
    const uint16_t* qs = x[i].qs;
    const __m256i sign7 = _mm256_packus_epi16(_mm256_srli_epi16(w0, 9), _mm256_srli_epi16(w1, 9));
    const __m256i signs = with_even_parity(_mm256_permute4x64_epi64(sign7, 0xd8));  // group g in byte g
    const __m256i ls = odd_scale_bytes(x[i].scales, 8);
    Ops::Acc acc = Ops::acc_zero();
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      const __m256i g0 = grid_rows4_at(iq::kIq2xsGrid, [&](int j) { return qs[4 * k + j] & 511; });
      const __m256i g1 = grid_rows4_at(iq::kIq2xsGrid, [&](int j) { return qs[4 * k + 4 + j] & 511; });
      acc = Ops::pair_dot(acc, g0, g1, y[i].qs + 32 * k, signs, k,
                          pick_scales(ls, 2 * k, 2 * k + 1), pick_scales(ls, 2 * k + 2, 2 * k + 3));
    }
    sum += dd(x[i].d, y[i]) * static_cast<float>(hsum_epi32(Ops::acc_fold(acc)));
  }
  return 0.125f * sum;
}

float vec_dot_iq2_s(int64_t n, const void* w, const void* a) {
  const BlockIQ2_S* x = static_cast<const BlockIQ2_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Index g (0..31) = qs[g] | bits 2 (g % 4) .. +1 of qh[g / 4] << 8; sign bytes at qs + 32.
    alignas(32) uint16_t idx[32];
    for (int h = 0; h < 2; ++h) {
      const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 16 * h)));
      // qh bytes 4h..4h+3 into every 32-bit lane, each 16-bit lane g shifted right by 2 (g % 4)
      // - 8 (as a multiply by 2^(8 - 2 (g % 4)) of the byte for g / 4, within 16 bits).
      const __m256i qh = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32(x[i].qh + 4 * h))),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0));
      const __m256i qh16 = _mm256_and_si256(qh, _mm256_set1_epi16(0xff));
      const __m256i hi =
          _mm256_mullo_epi16(qh16, _mm256_set_epi16(4, 16, 64, 256, 4, 16, 64, 256, 4, 16, 64, 256, 4, 16, 64, 256));
      const __m256i top = _mm256_and_si256(hi, _mm256_set1_epi16(0x300));
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 16 * h), _mm256_or_si256(lo, top));
    }
    const __m256i signs = load256(x[i].qs + kQKK / 8);
    const __m256i ls = odd_scale_bytes(x[i].scales, 8);
    Ops::Acc acc = Ops::acc_zero();
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      const __m256i g0 = grid_rows4(iq::kIq2sGrid, idx + 4 * k), g1 = grid_rows4(iq::kIq2sGrid, idx + 4 * k + 4);
      acc = Ops::pair_dot(acc, g0, g1, y[i].qs + 32 * k, signs, k,
                          pick_scales(ls, 2 * k, 2 * k + 1), pick_scales(ls, 2 * k + 2, 2 * k + 3));
    }
    sum += dd(x[i].d, y[i]) * static_cast<float>(hsum_epi32(Ops::acc_fold(acc)));
  }
  return 0.125f * sum;
}

float vec_dot_iq3_s(int64_t n, const void* w, const void* a) {
  const BlockIQ3_S* x = static_cast<const BlockIQ3_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Index g (0..63) = qs[g] | bit g % 8 of qh[g / 8] << 8.
    alignas(32) uint16_t idx[64];
    const __m256i bit = _mm256_set_epi16(-32768, 16384, 8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1);
    for (int h = 0; h < 4; ++h) {
      const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 16 * h)));
      uint16_t qh2;
      std::memcpy(&qh2, x[i].qh + 2 * h, 2);
      const __m256i m = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(static_cast<short>(qh2)), bit), bit);
      const __m256i top = _mm256_and_si256(m, _mm256_set1_epi16(0x100));
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 16 * h), _mm256_or_si256(lo, top));
    }
    const __m256i signs = load256(x[i].signs);
    const __m256i ls = odd_scale_bytes(x[i].scales, 4);  // byte k: sub-block k's scale
    Ops::Acc acc = Ops::acc_zero();
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      const __m256i g0 = grid_rows8(iq::kIq3sGrid, idx + 8 * k), g1 = grid_rows8(iq::kIq3sGrid, idx + 8 * k + 8);
      acc = Ops::pair_dot(acc, g0, g1, y[i].qs + 32 * k, signs, k,
                          pick_scales(ls, k, k), pick_scales(ls, k + 1, k + 1));
    }
    sum += dd(x[i].d, y[i]) * static_cast<float>(hsum_epi32(Ops::acc_fold(acc)));
  }
  return sum;
}

// ---- IQ1_M, IQ1_S: {-1, 0, 1} grids ---------------------------------------------------------

// Multipliers moving bits 3 m .. 3 m + 2 of a 16-bit lane (m = lane % 4) to bits 13..15 (a
// function, not a global: no AVX instruction may run at load time).
inline __m256i shift3x4() {
  return _mm256_set_epi16(16, 128, 1024, 8192, 16, 128, 1024, 8192, 16, 128, 1024, 8192, 16, 128, 1024, 8192);
}
// IQ1_M: per 8 weights an 11-bit index into the {-1, 0, 1} grid and a delta sign, 3-bit scales
// per 16. The grid value g and the delta +-1/8 are one signed byte 8 g +- 1 (|.| <= 9), so one
// dot per sub-block gives C = 8 A + D for the reference's A (grid) and D (delta) sums; with
// |C| < 2^24, 0.125f * C is the reference's A + 0.125f * D exactly (both are C / 8, a float).
// The byte is kept unsigned, u = 8 g +- 1 + 9 in 0..18, so u . q8 is one vpmaddubsw without
// sign fixes; the 9 q8 per weight that adds are taken back once per super-block from the
// activations' 16-element block sums, times the same scales (all exact int32 sums).
//
// IQ1_M's weight bytes u for every 12-bit (delta sign bit 11 | 11-bit grid index): a group's
// qh nibble is exactly its index's top 3 bits and its delta bit, so one row load gives the
// 8 bytes 8 g +- 1 + 9 without vector work per group. Built on first use in scalar code
// (32 KiB; the grid is not a constant expression), only where this ISA's kernel runs.
struct Iq1mRows {
  uint64_t v[4096];
};
inline const uint64_t* iq1m_rows() {
  static const Iq1mRows table = [] {
    Iq1mRows t{};
    for (int i = 0; i < 4096; ++i) {
      const uint64_t g = iq::kIq1sGrid[i & 2047];
      const int delta9 = i & 2048 ? 8 : 10;  // delta -1 / +1, plus 9
      uint64_t row = 0;
      for (int j = 0; j < 8; ++j) {
        const int gv = static_cast<int8_t>(static_cast<uint8_t>(g >> (8 * j)));
        row |= static_cast<uint64_t>(8 * gv + delta9) << (8 * j);
      }
      t.v[i] = row;
    }
    return t;
  }();
  return table.v;
}

float vec_dot_iq1_m(int64_t n, const void* w, const void* a) {
  const BlockIQ1_M* x = static_cast<const BlockIQ1_M*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint64_t* rows = iq1m_rows();
  const __m128i m15 = _mm_set1_epi8(15);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Group g (0..31): nibble g % 2 of qh[g / 2] = 3 index bits | delta sign << 3; its row
    // of u is rows[qs[g] | nibble << 8].
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qh));
    const __m128i lo = _mm_and_si128(qh, m15), hi = _mm_and_si128(_mm_srli_epi16(qh, 4), m15);
    const __m128i nib[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
    alignas(32) uint16_t idx[32];
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 16 * h)));
      const __m256i top = _mm256_slli_epi16(_mm256_cvtepu8_epi16(nib[h]), 8);
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 16 * h), _mm256_or_si256(q, top));
    }
    // 3-bit scale (lane 2 k + half) = bits 3 m .. 3 m + 2 of scale word j, lane = 4 j + m:
    // shifted to the top by a multiply, then down.
    uint64_t sc8;
    std::memcpy(&sc8, x[i].scales, sizeof sc8);
    const __m256i words = _mm256_shuffle_epi8(_mm256_set1_epi64x(static_cast<long long>(sc8)),
                                              _mm256_set_epi64x(0x0706070607060706, 0x0504050405040504,
                                                                0x0302030203020302, 0x0100010001000100));
    const __m256i s3 = _mm256_srli_epi16(_mm256_mullo_epi16(words, shift3x4()), 13);
    const __m256i s16 = _mm256_or_si256(_mm256_add_epi16(s3, s3), _mm256_set1_epi16(1));
    const __m128i s8 = _mm_packus_epi16(_mm256_castsi256_si128(s16), _mm256_extracti128_si256(s16, 1));
    const __m256i ls = _mm256_set_m128i(s8, s8);
    // -9 x (scale . block sum) per 16 weights: the offset of u taken back.
    const __m256i neg9 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_add_epi16(_mm256_slli_epi16(s16, 3), s16));
    const __m256i offset = _mm256_madd_epi16(neg9, load256(y[i].bsums));
    Ops::Acc acc = Ops::acc_zero();
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      acc = Ops::pair_madd(acc, grid_rows4(rows, idx + 4 * k), grid_rows4(rows, idx + 4 * k + 4), y[i].qs + 32 * k,
                           pick_scales(ls, 2 * k, 2 * k + 1), pick_scales(ls, 2 * k + 2, 2 * k + 3));
    }
    sum += fp16_to_fp32(iq::iq1m_scale_bits(x[i].scales)) * y[i].d *
           (0.125f * static_cast<float>(hsum_epi32(_mm256_add_epi32(Ops::acc_fold(acc), offset))));
  }
  return sum;
}

// IQ1_S's grid rows plus 1 (bytes 0..2, the u of the dot below), built on first use like
// iq1m_rows: the same 16 KiB as the grid, one vector add per 8 weights less.
struct Iq1sRowsPlusOne {
  uint64_t v[2048];
};
inline const uint64_t* iq1s_rows_plus_one() {
  static const Iq1sRowsPlusOne table = [] {
    Iq1sRowsPlusOne t{};
    for (int i = 0; i < 2048; ++i) {
      uint64_t row = 0;
      for (int j = 0; j < 8; ++j) {
        row |= static_cast<uint64_t>(static_cast<uint8_t>((iq::kIq1sGrid[i] >> (8 * j)) + 1)) << (8 * j);
      }
      t.v[i] = row;
    }
    return t;
  }();
  return table.v;
}

// IQ1_S: an 11-bit grid index per 8 weights, a scale and a delta sign per 32 (qh bits
// 12..15). The grid part is a {-1, 0, 1} dot taken as (g + 1) . q8 (unsigned bytes 0..2, one
// vpmaddubsw) less the activations' block sums times the same scales; the delta part goes
// through those block sums as in the reference, 8 sub-blocks at once.
float vec_dot_iq1_s(int64_t n, const void* w, const void* a) {
  const BlockIQ1_S* x = static_cast<const BlockIQ1_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint64_t* rows = iq1s_rows_plus_one();
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    // Index g (0..31) = qs[g] | bits 3 (g % 4) .. +2 of qh[g / 4] << 8: each qh word copied to
    // 4 lanes, the 3 bits shifted to the top by a multiply, then down.
    alignas(32) uint16_t idx[32];
    for (int h = 0; h < 2; ++h) {
      uint64_t qh4;
      std::memcpy(&qh4, x[i].qh + 4 * h, sizeof qh4);
      const __m256i words = _mm256_shuffle_epi8(_mm256_set1_epi64x(static_cast<long long>(qh4)),
                                                _mm256_set_epi64x(0x0706070607060706, 0x0504050405040504,
                                                                  0x0302030203020302, 0x0100010001000100));
      const __m256i top = _mm256_srli_epi16(
          _mm256_mullo_epi16(words, shift3x4()), 13);
      const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 16 * h)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(idx + 16 * h), _mm256_or_si256(q, _mm256_slli_epi16(top, 8)));
    }
    // Sub-block k: odd scale 2 s + 1 (int16 lane k, and byte k in both 128-bit halves).
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qh));
    const __m128i s = _mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7));
    const __m128i ls16 = _mm_or_si128(_mm_add_epi16(s, s), _mm_set1_epi16(1));
    const __m128i ls8 = _mm_packus_epi16(ls16, _mm_setzero_si128());
    const __m256i ls = _mm256_set_m128i(ls8, ls8);
    // The delta term as the reference's: sum over k of +-ls_k (sign: qh bit 15) times the
    // activations' block sums 2 k and 2 k + 1 (|each| <= 16 x 127: their sum fits int16).
    const __m128i signed_ls = _mm_sign_epi16(ls16, _mm_or_si128(_mm_srai_epi16(qh, 15), _mm_set1_epi16(1)));
    const __m128i bsums = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y[i].bsums)),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(y[i].bsums + 8)));
    const __m128i dsum = _mm_madd_epi16(signed_ls, bsums);
    __m128i t4 = _mm_add_epi32(dsum, _mm_shuffle_epi32(dsum, 0x4e));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
    const int32_t sumd = _mm_cvtsi128_si32(t4);
    // The grid dot's offset: (g + 1) . q8 counts each activation once more, times ls_k.
    const __m128i offset = _mm_madd_epi16(ls16, bsums);
    Ops::Acc acc = Ops::acc_zero();
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      const __m256i u0 = grid_rows4(rows, idx + 4 * k), u1 = grid_rows4(rows, idx + 4 * k + 4);
      acc = Ops::pair_madd(acc, u0, u1, y[i].qs + 32 * k, pick_scales(ls, k, k), pick_scales(ls, k + 1, k + 1));
    }
    const __m256i grid = _mm256_sub_epi32(Ops::acc_fold(acc), _mm256_inserti128_si256(_mm256_setzero_si256(), offset, 0));
    const float isum = static_cast<float>(hsum_epi32(grid));
    sum += dd(x[i].d, y[i]) * (isum + 0.125f * static_cast<float>(sumd));
  }
  return sum;
}

}  // namespace
}  // namespace colibri
