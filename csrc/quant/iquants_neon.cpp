// AArch64 NEON kernels of the i-quants and MXFP4; compiled only on arm64. Scalar reference:
// quant/iquants_ref.cpp, which these follow step for step: each block's integer sum is
// computed exactly in int32 lanes (SDOT with the dot-product extension, otherwise widening
// multiplies and pairwise adds), then the reference's own float expression is applied in the
// reference's order. So every kernel here is BIT-IDENTICAL to the scalar one, the Q8_0 types
// (IQ4_NL, MXFP4, whose scalar kernel adds one float per 32-block) included. Checked against
// scalar under qemu-aarch64 by scripts/check_iquants_arm64_qemu.sh.
//
// Ranges: grid magnitudes <= 62 (IQ2 / IQ3) or values in {-1, 0, 1} (IQ1), IQ4 / MXFP4
// values |v| <= 127, activations |q8| <= 127 (Q8_0 / Q8_K never produce -128), so every
// product fits int16 (the fallback path) and applying a +1 / -1 sign byte to an activation
// by multiplication cannot wrap.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>

#include <cstring>

#include "quant/blocks.hpp"
#include "quant/blocks_iq.hpp"
#include "quant/fp16.hpp"
#include "quant/iquant_grids.hpp"
#include "quant/iquants_ref.hpp"
#include "quant/q8_k.hpp"
#include "quant/reference.hpp"

namespace colibri {
namespace {

using iq::kSigns8;

inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline int32x4_t dot_i8(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  const int16x8_t hi = vmull_high_s8(a, b);
  return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

inline int32x4_t dot16(int8x16_t a, int8x16_t b) { return dot_i8(vdupq_n_s32(0), a, b); }

// Two 8-byte words (grid entries or sign words) as 16 int8 lanes, w0 in lanes 0..7.
inline int8x16_t pair(uint64_t w0, uint64_t w1) { return vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(w0), vcreate_u64(w1))); }

// Four 4-byte grid entries as 16 int8 lanes.
inline int8x16_t quad(uint32_t g0, uint32_t g1, uint32_t g2, uint32_t g3) {
  const uint32_t g[4] = {g0, g1, g2, g3};
  return vreinterpretq_s8_u32(vld1q_u32(g));
}

// Sign word for a 7-bit ksigns index (the 8th sign is implied).
inline uint64_t ksign_word(uint32_t k) { return kSigns8.v[iq::kKsignsIq2xs[k & 127]]; }

// 16 grid magnitudes g times 16 activations q with +1 / -1 signs s: 4 int32 lanes.
inline int32x4_t signed_dot16(int8x16_t g, const int8_t* q, int8x16_t s) { return dot16(g, vmulq_s8(vld1q_s8(q), s)); }

// 16 packed bytes of nibbles -> table values of the low nibbles (elements 0..15) and of the
// high nibbles (elements 16..31).
inline void lookup_nibbles(const uint8_t* qs, int8x16_t table, int8x16_t* lo, int8x16_t* hi) {
  const uint8x16_t b = vld1q_u8(qs);
  *lo = vqtbl1q_s8(table, vandq_u8(b, vdupq_n_u8(0x0f)));
  *hi = vqtbl1q_s8(table, vshrq_n_u8(b, 4));
}

// One 32-block of a 4-bit table type against Q8_0's quants: the exact integer sum.
inline int32_t table_block_dot(const uint8_t* qs, int8x16_t table, const int8_t* q8) {
  int8x16_t lo, hi;
  lookup_nibbles(qs, table, &lo, &hi);
  return vaddvq_s32(dot_i8(dot16(lo, vld1q_s8(q8)), hi, vld1q_s8(q8 + 16)));
}

// ---- Q8_0 types ------------------------------------------------------------------------

float vec_dot_iq4_nl(int64_t n, const void* w, const void* a) {
  const BlockIQ4_NL* x = static_cast<const BlockIQ4_NL*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
  const int8x16_t table = vld1q_s8(iq::kvalues_iq4nl());
  float sum = 0.0f;
  for (int64_t i = 0; i < n / 32; ++i) {
    const float d = fp16_to_fp32(y[i].d) * fp16_to_fp32(x[i].d);
    sum += d * static_cast<float>(table_block_dot(x[i].qs, table, y[i].qs));
  }
  return sum;
}

float vec_dot_mxfp4(int64_t n, const void* w, const void* a) {
  const BlockMXFP4* x = static_cast<const BlockMXFP4*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
  const int8x16_t table = vld1q_s8(iq::kvalues_mxfp4());
  float sum = 0.0f;
  for (int64_t i = 0; i < n / 32; ++i) {
    const float d = fp16_to_fp32(y[i].d) * e8m0_to_fp32_half(x[i].e);
    sum += d * static_cast<float>(table_block_dot(x[i].qs, table, y[i].qs));
  }
  return sum;
}

// ---- Q8_K types: one exact integer per super-block ---------------------------------------

float vec_dot_iq4_xs(int64_t n, const void* w, const void* a) {
  const BlockIQ4_XS* x = static_cast<const BlockIQ4_XS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const int8x16_t table = vld1q_s8(iq::kvalues_iq4nl());
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 15) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
      int8x16_t lo, hi;
      lookup_nibbles(x[i].qs + 16 * ib, table, &lo, &hi);
      const int8_t* q8 = y[i].qs + 32 * ib;
      acc = vmlaq_n_s32(acc, dot_i8(dot16(lo, vld1q_s8(q8)), hi, vld1q_s8(q8 + 16)), ls - 32);
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(vaddvq_s32(acc));
  }
  return sum;
}

float vec_dot_iq2_xxs(int64_t n, const void* w, const void* a) {
  const BlockIQ2_XXS* x = static_cast<const BlockIQ2_XXS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint64_t* grid = iq::kIq2xxsGrid;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t idx = load_u32(x[i].qs + 4 * ib), sg = load_u32(x[i].qs + 4 * ib + 2);
      const int8_t* q8 = y[i].qs + 32 * ib;
      const int32x4_t s0 = signed_dot16(pair(grid[idx & 255], grid[(idx >> 8) & 255]), q8,
                                        pair(ksign_word(sg), ksign_word(sg >> 7)));
      const int32x4_t s1 = signed_dot16(pair(grid[(idx >> 16) & 255], grid[idx >> 24]), q8 + 16,
                                        pair(ksign_word(sg >> 14), ksign_word(sg >> 21)));
      acc = vmlaq_n_s32(acc, vaddq_s32(s0, s1), static_cast<int32_t>(2 * (sg >> 28) + 1));
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(vaddvq_s32(acc));
  }
  return 0.125f * sum;
}

float vec_dot_iq2_xs(int64_t n, const void* w, const void* a) {
  const BlockIQ2_XS* x = static_cast<const BlockIQ2_XS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint64_t* grid = iq::kIq2xsGrid;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t* q = x[i].qs + 4 * ib;
      const int8_t* q8 = y[i].qs + 32 * ib;
      const int32x4_t s0 = signed_dot16(pair(grid[q[0] & 511], grid[q[1] & 511]), q8,
                                        pair(ksign_word(q[0] >> 9), ksign_word(q[1] >> 9)));
      const int32x4_t s1 = signed_dot16(pair(grid[q[2] & 511], grid[q[3] & 511]), q8 + 16,
                                        pair(ksign_word(q[2] >> 9), ksign_word(q[3] >> 9)));
      acc = vmlaq_n_s32(acc, s0, 2 * (x[i].scales[ib] & 15) + 1);
      acc = vmlaq_n_s32(acc, s1, 2 * (x[i].scales[ib] >> 4) + 1);
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(vaddvq_s32(acc));
  }
  return 0.125f * sum;
}

float vec_dot_iq2_s(int64_t n, const void* w, const void* a) {
  const BlockIQ2_S* x = static_cast<const BlockIQ2_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint64_t* grid = iq::kIq2sGrid;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const uint8_t* signs = x[i].qs + kQKK / 8;
    int32x4_t acc = vdupq_n_s32(0);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = x[i].qs + 4 * ib;
      const unsigned qh = x[i].qh[ib];
      const uint8_t* sb = signs + 4 * ib;
      const int8_t* q8 = y[i].qs + 32 * ib;
      const int32x4_t s0 = signed_dot16(pair(grid[qs[0] | ((qh << 8) & 0x300)], grid[qs[1] | ((qh << 6) & 0x300)]),
                                        q8, pair(kSigns8.v[sb[0]], kSigns8.v[sb[1]]));
      const int32x4_t s1 = signed_dot16(pair(grid[qs[2] | ((qh << 4) & 0x300)], grid[qs[3] | ((qh << 2) & 0x300)]),
                                        q8 + 16, pair(kSigns8.v[sb[2]], kSigns8.v[sb[3]]));
      acc = vmlaq_n_s32(acc, s0, 2 * (x[i].scales[ib] & 15) + 1);
      acc = vmlaq_n_s32(acc, s1, 2 * (x[i].scales[ib] >> 4) + 1);
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(vaddvq_s32(acc));
  }
  return 0.125f * sum;
}

float vec_dot_iq3_xxs(int64_t n, const void* w, const void* a) {
  const BlockIQ3_XXS* x = static_cast<const BlockIQ3_XXS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint32_t* grid = iq::kIq3xxsGrid;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* q = x[i].qs + 8 * ib;
      const uint32_t sg = load_u32(x[i].qs + kQKK / 4 + 4 * ib);
      const int8_t* q8 = y[i].qs + 32 * ib;
      const int32x4_t s0 = signed_dot16(quad(grid[q[0]], grid[q[1]], grid[q[2]], grid[q[3]]), q8,
                                        pair(ksign_word(sg), ksign_word(sg >> 7)));
      const int32x4_t s1 = signed_dot16(quad(grid[q[4]], grid[q[5]], grid[q[6]], grid[q[7]]), q8 + 16,
                                        pair(ksign_word(sg >> 14), ksign_word(sg >> 21)));
      acc = vmlaq_n_s32(acc, vaddq_s32(s0, s1), static_cast<int32_t>(2 * (sg >> 28) + 1));
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(vaddvq_s32(acc));
  }
  return 0.25f * sum;
}

float vec_dot_iq3_s(int64_t n, const void* w, const void* a) {
  const BlockIQ3_S* x = static_cast<const BlockIQ3_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint32_t* grid = iq::kIq3sGrid;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32x4_t acc = vdupq_n_s32(0);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* q = x[i].qs + 8 * ib;
      const unsigned h = x[i].qh[ib];
      uint32_t g[8];
      for (int k = 0; k < 8; ++k) g[k] = grid[q[k] | (((h >> k) & 1u) << 8)];
      const uint8_t* sb = x[i].signs + 4 * ib;
      const int8_t* q8 = y[i].qs + 32 * ib;
      const int32x4_t s0 = signed_dot16(quad(g[0], g[1], g[2], g[3]), q8, pair(kSigns8.v[sb[0]], kSigns8.v[sb[1]]));
      const int32x4_t s1 = signed_dot16(quad(g[4], g[5], g[6], g[7]), q8 + 16, pair(kSigns8.v[sb[2]], kSigns8.v[sb[3]]));
      acc = vmlaq_n_s32(acc, vaddq_s32(s0, s1), 2 * ((x[i].scales[ib / 2] >> 4 * (ib % 2)) & 15) + 1);
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(vaddvq_s32(acc));
  }
  return sum;
}

float vec_dot_iq1_s(int64_t n, const void* w, const void* a) {
  const BlockIQ1_S* x = static_cast<const BlockIQ1_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint64_t* grid = iq::kIq1sGrid;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32x4_t acc = vdupq_n_s32(0);
    int32_t sumd = 0;  // the delta part (sum of activations, signed), as the reference's
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* q = x[i].qs + 4 * ib;
      const unsigned qh = x[i].qh[ib];
      const int8_t* q8 = y[i].qs + 32 * ib;
      const int32x4_t s0 = dot16(pair(grid[q[0] | ((qh & 7u) << 8)], grid[q[1] | (((qh >> 3) & 7u) << 8)]), vld1q_s8(q8));
      const int32x4_t s1 =
          dot16(pair(grid[q[2] | (((qh >> 6) & 7u) << 8)], grid[q[3] | (((qh >> 9) & 7u) << 8)]), vld1q_s8(q8 + 16));
      const int ls = 2 * ((qh >> 12) & 7) + 1;
      acc = vmlaq_n_s32(acc, vaddq_s32(s0, s1), ls);
      sumd += ls * (qh & 0x8000 ? -1 : 1) * (y[i].bsums[2 * ib] + y[i].bsums[2 * ib + 1]);
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d *
           (static_cast<float>(vaddvq_s32(acc)) + 0.125f * static_cast<float>(sumd));
  }
  return sum;
}

float vec_dot_iq1_m(int64_t n, const void* w, const void* a) {
  const BlockIQ1_M* x = static_cast<const BlockIQ1_M*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const uint64_t* grid = iq::kIq1sGrid;
  constexpr uint64_t kPlus = 0x0101010101010101ull, kMinus = 0xffffffffffffffffull;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint16_t sc[4];
    std::memcpy(sc, x[i].scales, sizeof sc);
    int32x4_t acc = vdupq_n_s32(0), accd = vdupq_n_s32(0);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* q = x[i].qs + 4 * ib;
      const unsigned h0 = x[i].qh[2 * ib], h1 = x[i].qh[2 * ib + 1];
      const int8x16_t a0 = vld1q_s8(y[i].qs + 32 * ib), a1 = vld1q_s8(y[i].qs + 32 * ib + 16);
      const int32x4_t s0 = dot16(pair(grid[q[0] | ((h0 << 8) & 0x700)], grid[q[1] | ((h0 << 4) & 0x700)]), a0);
      const int32x4_t s1 = dot16(pair(grid[q[2] | ((h1 << 8) & 0x700)], grid[q[3] | ((h1 << 4) & 0x700)]), a1);
      // The delta of each 8 elements is +1 or -1 times their activation sum.
      const int32x4_t d0 = dot16(pair(h0 & 0x08 ? kMinus : kPlus, h0 & 0x80 ? kMinus : kPlus), a0);
      const int32x4_t d1 = dot16(pair(h1 & 0x08 ? kMinus : kPlus, h1 & 0x80 ? kMinus : kPlus), a1);
      const int ls0 = 2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1;
      const int ls1 = 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1;
      acc = vmlaq_n_s32(vmlaq_n_s32(acc, s0, ls0), s1, ls1);
      accd = vmlaq_n_s32(vmlaq_n_s32(accd, d0, ls0), d1, ls1);
    }
    sum += fp16_to_fp32(iq::iq1m_scale_bits(x[i].scales)) * y[i].d *
           (static_cast<float>(vaddvq_s32(acc)) + 0.125f * static_cast<float>(vaddvq_s32(accd)));
  }
  return sum;
}

// Rows one after the other: each row one sequential stream, vec_dot's arithmetic per row.
template <VecDotFn F>
void rows_each(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  const auto* base = static_cast<const unsigned char*>(w);
  for (int64_t r = 0; r < nrows; ++r) out[r] = F(n, base + r * stride, act);
}

const TypeKernels* table(DType type) {
  // Q8_0 activations use kernels_neon.cpp's quantizer (byte-identical to the reference).
  static const TypeKernels kNeon[] = {
      {DType::IQ4_NL, DType::Q8_0, iq::dequantize_row_iq4_nl, iq::quantize_row_iq4_nl, vec_dot_iq4_nl,
       neon_kernels(DType::Q8_0)->quantize_act, rows_each<vec_dot_iq4_nl>},
      {DType::MXFP4, DType::Q8_0, iq::dequantize_row_mxfp4, iq::quantize_row_mxfp4, vec_dot_mxfp4,
       neon_kernels(DType::Q8_0)->quantize_act, rows_each<vec_dot_mxfp4>},
      {DType::IQ4_XS, DType::Q8_K, iq::dequantize_row_iq4_xs, iq::quantize_row_iq4_xs, vec_dot_iq4_xs,
       q8k::quantize_row_neon, rows_each<vec_dot_iq4_xs>},
      {DType::IQ2_XXS, DType::Q8_K, iq::dequantize_row_iq2_xxs, iq::low_bit_quantizer(DType::IQ2_XXS),
       vec_dot_iq2_xxs, q8k::quantize_row_neon, rows_each<vec_dot_iq2_xxs>},
      {DType::IQ2_XS, DType::Q8_K, iq::dequantize_row_iq2_xs, iq::low_bit_quantizer(DType::IQ2_XS), vec_dot_iq2_xs,
       q8k::quantize_row_neon, rows_each<vec_dot_iq2_xs>},
      {DType::IQ2_S, DType::Q8_K, iq::dequantize_row_iq2_s, iq::low_bit_quantizer(DType::IQ2_S), vec_dot_iq2_s,
       q8k::quantize_row_neon, rows_each<vec_dot_iq2_s>},
      {DType::IQ3_XXS, DType::Q8_K, iq::dequantize_row_iq3_xxs, iq::low_bit_quantizer(DType::IQ3_XXS),
       vec_dot_iq3_xxs, q8k::quantize_row_neon, rows_each<vec_dot_iq3_xxs>},
      {DType::IQ3_S, DType::Q8_K, iq::dequantize_row_iq3_s, iq::low_bit_quantizer(DType::IQ3_S), vec_dot_iq3_s,
       q8k::quantize_row_neon, rows_each<vec_dot_iq3_s>},
      {DType::IQ1_S, DType::Q8_K, iq::dequantize_row_iq1_s, iq::low_bit_quantizer(DType::IQ1_S), vec_dot_iq1_s,
       q8k::quantize_row_neon, rows_each<vec_dot_iq1_s>},
      {DType::IQ1_M, DType::Q8_K, iq::dequantize_row_iq1_m, iq::low_bit_quantizer(DType::IQ1_M), vec_dot_iq1_m,
       q8k::quantize_row_neon, rows_each<vec_dot_iq1_m>},
  };
  for (const TypeKernels& k : kNeon)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace

const TypeKernels* iq_neon_kernels(DType type) { return table(type); }

}  // namespace colibri
