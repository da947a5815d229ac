// The i-quant and MXFP4 dot kernels for x86, written once and compiled twice like
// kquants_x86.hpp: include it only from iquants_avx2.cpp / iquants_avx512.cpp, after their
// `struct Ops` and constants (internal linkage throughout, so no function compiled with one
// ISA's flags is picked by the linker for another). Scalar reference: quant/iquants_ref.cpp.
//  - Q8_K types (IQ4_XS, IQ2_*, IQ3_*, IQ1_*): the same exact integer sum per super-block
//    as the reference, then the same float steps: bit-identical to the scalar kernels.
//  - Q8_0 types (IQ4_NL, MXFP4): exact integer sums per 32-block, float accumulation in 8
//    lanes (agrees with the reference to rounding, like Q4_0).
//  - dequantize_row: the reference's (it is not on the matmul's hot path).
// The grid types (IQ2_*, IQ3_*, IQ1_*) are in iquants_grid_x86.hpp.
// Ops supplies the two integer multiply-accumulates: madd_acc(acc, p, s) = acc + pairwise
// int16 products p s (vpmaddwd + vpaddd on AVX2, vpdpwssd on AVX-512 VNNI) and
// dot_u8_i8(u, s) = sums of 4 u8 x i8 products (vpmaddubsw + vpmaddwd, or vpdpbusd). The
// two forms give the same integers whenever nothing saturates or overflows, which holds
// here: maddubs products stay below int16 saturation (|grid| <= 62 unsigned times
// |q8| <= 127, two per lane, <= 15748; IQ4's |value| <= 127 times |q8| <= 127, two per lane,
// <= 32258) and every int32 sum is bounded by 256 of those times a 6-bit scale. It also
// supplies Acc / acc_zero / acc_fold / pair_dot (two sub-blocks of a grid type) and
// kEvenSignsByTable (iquants_grid_x86.hpp).
#pragma once
#include <immintrin.h>

#include <cstring>

#include "quant/blocks.hpp"
#include "quant/blocks_iq.hpp"
#include "quant/dot_tiles.hpp"
#include "quant/fp16.hpp"
#include "quant/iquant_grids.hpp"
#include "quant/iquants_ref.hpp"
#include "quant/q8_k.hpp"
#include "quant/reference.hpp"

namespace colibri {
namespace {

inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 4 sign words -> 32 bytes of +1 / -1.
inline __m256i signs4(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) {
  return _mm256_set_epi64x(static_cast<long long>(s3), static_cast<long long>(s2), static_cast<long long>(s1),
                           static_cast<long long>(s0));
}

// 16 bytes of packed nibbles -> 32 table values: low nibbles first (elements 0..15).
inline __m256i lookup_nibbles(const uint8_t* qs, __m256i table) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_shuffle_epi8(table, _mm256_and_si256(both, _mm256_set1_epi8(0x0f)));
}

inline __m256i table16(const uint8_t* bytes) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
  return _mm256_set_m128i(t, t);
}

// Signed weights w times signed activations a, pairwise into int16 (sign trick).
inline __m256i dot_i8_pairs(__m256i w, __m256i a) {
  return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

// The same products summed per 4 bytes into int32 lanes.
inline __m256i dot_i8_quads(__m256i w, __m256i a) { return Ops::dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)); }

// ---- Q8_0 types ------------------------------------------------------------------------

template <bool Mxfp4>
float dot_4bit_table_q8_0(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const unsigned char*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
  constexpr std::size_t kStride = Mxfp4 ? sizeof(BlockMXFP4) : sizeof(BlockIQ4_NL);
  const __m256i table = table16(Mxfp4 ? iq::kKvaluesMxfp4Bits : iq::kKvaluesIq4nlBits);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 32; ++i) {
    const unsigned char* b = x + i * kStride;
    float dw;
    const uint8_t* qs;
    if constexpr (Mxfp4) {
      dw = e8m0_to_fp32_half(b[0]);
      qs = b + 1;
    } else {
      uint16_t h;
      std::memcpy(&h, b, 2);
      dw = _cvtsh_ss(h);
      qs = b + 2;
    }
    const __m256i p = dot_i8_quads(lookup_nibbles(qs, table), load256(y[i].qs));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(y[i].d) * dw);
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
  }
  return hsum_ps(acc);
}

float vec_dot_iq4_nl(int64_t n, const void* w, const void* a) { return dot_4bit_table_q8_0<false>(n, w, a); }
float vec_dot_mxfp4(int64_t n, const void* w, const void* a) { return dot_4bit_table_q8_0<true>(n, w, a); }

// ---- Q8_K types: one exact integer per super-block --------------------------------------

// _cvtsh_ss converts exactly like fp16_to_fp32 (NaN payloads included), in one instruction.
inline float dd(uint16_t d_half, const BlockQ8K& y) { return _cvtsh_ss(d_half) * y.d; }

float vec_dot_iq4_xs(int64_t n, const void* w, const void* a) {
  const BlockIQ4_XS* x = static_cast<const BlockIQ4_XS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const __m256i table = table16(iq::kKvaluesIq4nlBits);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    __m256i acc = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 15) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
      const __m256i p = dot_i8_pairs(lookup_nibbles(x[i].qs + 16 * ib, table), load256(y[i].qs + 32 * ib));
      acc = Ops::madd_acc(acc, p, _mm256_set1_epi16(static_cast<short>(ls - 32)));
    }
    sum += dd(x[i].d, y[i]) * static_cast<float>(hsum_epi32(acc));
  }
  return sum;
}

}  // namespace
}  // namespace colibri

#include "quant/iquants_grid_x86.hpp"

namespace colibri {
namespace {

// ---- Prefill tiles (dot_tiles.hpp) --------------------------------------------------------
// R rows x T tokens in one pass: each row's nibbles are looked up once per block instead of
// once per token, and each (row, token) pair keeps its own accumulator and repeats its
// vec_dot's operations in the same order, so the tile equals vec_dot bit for bit.

// IQ4_NL . Q8_0: as dot_4bit_table_q8_0<false>.
struct Iq4nlTile {
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    const __m256i table = table16(iq::kKvaluesIq4nlBits);
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      __m256i v[R], mag[R];
      float dw[R];
      for (int r = 0; r < R; ++r) {
        const BlockIQ4_NL* x = reinterpret_cast<const BlockIQ4_NL*>(w + r * ws) + i;
        v[r] = lookup_nibbles(x->qs, table);
        mag[r] = _mm256_sign_epi8(v[r], v[r]);
        dw[r] = _cvtsh_ss(x->d);
      }
      for (int t = 0; t < T; ++t) {
        const BlockQ8_0* y = reinterpret_cast<const BlockQ8_0*>(act + t * as) + i;
        const __m256i a = load256(y->qs);
        const float da = _cvtsh_ss(y->d);
        for (int r = 0; r < R; ++r) {
          const __m256i p = Ops::dot_u8_i8(mag[r], _mm256_sign_epi8(a, v[r]));
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(da * dw[r]), _mm256_cvtepi32_ps(p), acc[r][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) out[t * os + r] = hsum_ps(acc[r][t]);
  }
};

// IQ4_XS . Q8_K: as vec_dot_iq4_xs (one exact integer per super-block, then one float step).
struct Iq4xsTile {
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    const __m256i table = table16(iq::kKvaluesIq4nlBits);
    float sum[R][T] = {};
    for (int64_t i = 0; i < nb; ++i) {
      __m256i acc[R][T];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_si256();
      for (int ib = 0; ib < 8; ++ib) {
        __m256i v[R], mag[R], ls[R];
        for (int r = 0; r < R; ++r) {
          const BlockIQ4_XS* x = reinterpret_cast<const BlockIQ4_XS*>(w + r * ws) + i;
          const int s = ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 15) | (((x->scales_h >> 2 * ib) & 3) << 4);
          v[r] = lookup_nibbles(x->qs + 16 * ib, table);
          mag[r] = _mm256_sign_epi8(v[r], v[r]);
          ls[r] = _mm256_set1_epi16(static_cast<short>(s - 32));
        }
        for (int t = 0; t < T; ++t) {
          const BlockQ8K* y = reinterpret_cast<const BlockQ8K*>(act + t * as) + i;
          const __m256i a = load256(y->qs + 32 * ib);
          for (int r = 0; r < R; ++r) {
            const __m256i p = _mm256_maddubs_epi16(mag[r], _mm256_sign_epi8(a, v[r]));
            acc[r][t] = Ops::madd_acc(acc[r][t], p, ls[r]);
          }
        }
      }
      for (int t = 0; t < T; ++t) {
        const BlockQ8K* y = reinterpret_cast<const BlockQ8K*>(act + t * as) + i;
        for (int r = 0; r < R; ++r) {
          const BlockIQ4_XS* x = reinterpret_cast<const BlockIQ4_XS*>(w + r * ws) + i;
          sum[r][t] += dd(x->d, *y) * static_cast<float>(hsum_epi32(acc[r][t]));
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) out[t * os + r] = sum[r][t];
  }
};

const DotTile kTiles[] = {
    {vec_dot_iq4_nl, dot_tiles::run<Iq4nlTile, kTileRowsIq4nl, kTileTokens, 32>},
    {vec_dot_iq4_xs, dot_tiles::run<Iq4xsTile, kTileRowsIq4xs, kTileTokens, kQKK>},
    {nullptr, nullptr},
};

// Rows one after the other: each row is one sequential stream (which the hardware
// prefetchers follow), and the per-row arithmetic is vec_dot's by construction.
template <VecDotFn F>
void rows_each(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  const auto* base = static_cast<const unsigned char*>(w);
  for (int64_t r = 0; r < nrows; ++r) out[r] = F(n, base + r * stride, act);
}

const TypeKernels* table(DType type) {
  static const TypeKernels kTable[] = {
      {DType::IQ4_NL, DType::Q8_0, iq::dequantize_row_iq4_nl, iq::quantize_row_iq4_nl, vec_dot_iq4_nl,
       base_kernels(DType::Q8_0)->quantize_act, rows_each<vec_dot_iq4_nl>},
      {DType::MXFP4, DType::Q8_0, iq::dequantize_row_mxfp4, iq::quantize_row_mxfp4, vec_dot_mxfp4,
       base_kernels(DType::Q8_0)->quantize_act, rows_each<vec_dot_mxfp4>},
      {DType::IQ4_XS, DType::Q8_K, iq::dequantize_row_iq4_xs, iq::quantize_row_iq4_xs, vec_dot_iq4_xs,
       kQuantizeQ8K, rows_each<vec_dot_iq4_xs>},
      {DType::IQ2_XXS, DType::Q8_K, iq::dequantize_row_iq2_xxs, iq::low_bit_quantizer(DType::IQ2_XXS),
       vec_dot_iq2_xxs, kQuantizeQ8K, rows_each<vec_dot_iq2_xxs>},
      {DType::IQ2_XS, DType::Q8_K, iq::dequantize_row_iq2_xs, iq::low_bit_quantizer(DType::IQ2_XS), vec_dot_iq2_xs,
       kQuantizeQ8K, rows_each<vec_dot_iq2_xs>},
      {DType::IQ2_S, DType::Q8_K, iq::dequantize_row_iq2_s, iq::low_bit_quantizer(DType::IQ2_S), vec_dot_iq2_s,
       kQuantizeQ8K, rows_each<vec_dot_iq2_s>},
      {DType::IQ3_XXS, DType::Q8_K, iq::dequantize_row_iq3_xxs, iq::low_bit_quantizer(DType::IQ3_XXS),
       vec_dot_iq3_xxs, kQuantizeQ8K, rows_each<vec_dot_iq3_xxs>},
      {DType::IQ3_S, DType::Q8_K, iq::dequantize_row_iq3_s, iq::low_bit_quantizer(DType::IQ3_S), vec_dot_iq3_s,
       kQuantizeQ8K, rows_each<vec_dot_iq3_s>},
      {DType::IQ1_S, DType::Q8_K, iq::dequantize_row_iq1_s, iq::low_bit_quantizer(DType::IQ1_S), vec_dot_iq1_s,
       kQuantizeQ8K, rows_each<vec_dot_iq1_s>},
      {DType::IQ1_M, DType::Q8_K, iq::dequantize_row_iq1_m, iq::low_bit_quantizer(DType::IQ1_M), vec_dot_iq1_m,
       kQuantizeQ8K, rows_each<vec_dot_iq1_m>},
  };
  for (const TypeKernels& k : kTable)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace
}  // namespace colibri
