// AArch64 NEON kernels of the K-quant family and Q5_0 / Q5_1 (see kquants.hpp); compiled
// only on arm64. Scalar reference: kquants_ref.cpp / q5_ref.cpp. Exactness as on x86
// (kquants_x86.hpp): the K-quant dots compute each super-block's integer sums exactly and
// then the reference's own float expression, so they are bit-identical to the scalar
// reference; Q5_0 / Q5_1 accumulate blocks in float vectors (agree to rounding).
//
// Integer dots use SDOT (vdotq_s32) with the dot-product extension, otherwise widening
// multiplies and pairwise adds (every product here fits int16: |q| <= 63, |a| <= 128).
// Shift counts that vary with the loop use vshlq by a negative count (vshrq_n needs an
// immediate).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>

#include <cstring>
#include <type_traits>

#include "quant/blocks.hpp"
#include "quant/blocks_k.hpp"
#include "quant/kquant_common.hpp"
#include "quant/kquants.hpp"
#include "quant/q8_k.hpp"
#include "quant/reference.hpp"
#include "quant/row_groups.hpp"

namespace colibri {
namespace {

inline float half_at(const void* p) {
  __fp16 h;
  std::memcpy(&h, p, sizeof h);
  return static_cast<float>(h);  // exact, like fp16_to_fp32
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

inline uint8x16_t shr(uint8x16_t v, int n) { return vshlq_u8(v, vdupq_n_s8(static_cast<int8_t>(-n))); }
inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

// Dot of 16 unsigned quants (as int8, all <= 63) with 16 activation bytes -> 4 int32 lanes.
inline int32x4_t dot16(uint8x16_t q, const int8_t* a) { return dot_i8(vdupq_n_s32(0), s8(q), vld1q_s8(a)); }

// sum over the 16 activation groups of coef[g] * bsums[g] (exact int32).
inline int bsums_dot(const BlockQ8K& a, const int16_t coef[16]) {
  int32x4_t acc = vmull_s16(vld1_s16(a.bsums), vld1_s16(coef));
  acc = vmlal_s16(acc, vld1_s16(a.bsums + 4), vld1_s16(coef + 4));
  acc = vmlal_s16(acc, vld1_s16(a.bsums + 8), vld1_s16(coef + 8));
  acc = vmlal_s16(acc, vld1_s16(a.bsums + 12), vld1_s16(coef + 12));
  return vaddvq_s32(acc);
}

int q2k_block(const BlockQ2K& x, const BlockQ8K& a, int* msum) {
  int16_t mins[16];
  for (int g = 0; g < 16; ++g) mins[g] = static_cast<int16_t>(x.scales[g] >> 4);
  *msum = bsums_dot(a, mins);
  int32x4_t acc = vdupq_n_s32(0);
  for (int h = 0; h < 2; ++h) {
    const uint8x16_t b0 = vld1q_u8(x.qs + 32 * h), b1 = vld1q_u8(x.qs + 32 * h + 16);
    for (int k = 0; k < 4; ++k) {
      const int g = 8 * h + 2 * k;
      const int8_t* ak = a.qs + 128 * h + 32 * k;
      acc = vmlaq_n_s32(acc, dot16(vandq_u8(shr(b0, 2 * k), vdupq_n_u8(3)), ak), x.scales[g] & 0x0f);
      acc = vmlaq_n_s32(acc, dot16(vandq_u8(shr(b1, 2 * k), vdupq_n_u8(3)), ak + 16), x.scales[g + 1] & 0x0f);
    }
  }
  return vaddvq_s32(acc);
}

// quant + 4 (0..7) and the 4 * activation sum back through the group sums, as on x86.
int q3k_block(const BlockQ3K& x, const BlockQ8K& a) {
  int8_t sc[16];
  kq::q3k_scales(x.scales, sc);
  int16_t coef[16];
  for (int g = 0; g < 16; ++g) coef[g] = sc[g];
  const int corr = 4 * bsums_dot(a, coef);
  const uint8x16_t m0 = vld1q_u8(x.hmask), m1 = vld1q_u8(x.hmask + 16);
  int32x4_t acc = vdupq_n_s32(0);
  for (int h = 0; h < 2; ++h) {
    const uint8x16_t b0 = vld1q_u8(x.qs + 32 * h), b1 = vld1q_u8(x.qs + 32 * h + 16);
    for (int k = 0; k < 4; ++k) {
      const int g = 8 * h + 2 * k, hb = 4 * h + k;
      const int8_t* ak = a.qs + 128 * h + 32 * k;
      const uint8x16_t q0 = vorrq_u8(vandq_u8(shr(b0, 2 * k), vdupq_n_u8(3)),
                                     vshlq_n_u8(vandq_u8(shr(m0, hb), vdupq_n_u8(1)), 2));
      const uint8x16_t q1 = vorrq_u8(vandq_u8(shr(b1, 2 * k), vdupq_n_u8(3)),
                                     vshlq_n_u8(vandq_u8(shr(m1, hb), vdupq_n_u8(1)), 2));
      acc = vmlaq_n_s32(acc, dot16(q0, ak), sc[g]);
      acc = vmlaq_n_s32(acc, dot16(q1, ak + 16), sc[g + 1]);
    }
  }
  return vaddvq_s32(acc) - corr;
}

template <bool Five>
int q45k_block(const std::conditional_t<Five, BlockQ5K, BlockQ4K>& x, const BlockQ8K& a, int* msum) {
  uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) kq::scale_min_k4(s, x.scales, &sc[s], &mn[s]);
  int m = 0;
  for (int s = 0; s < 8; ++s) m += mn[s] * (a.bsums[2 * s] + a.bsums[2 * s + 1]);
  *msum = m;
  uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
  if constexpr (Five) {
    h0 = vld1q_u8(x.qh);
    h1 = vld1q_u8(x.qh + 16);
  }
  int32x4_t acc = vdupq_n_s32(0);
  for (int j = 0; j < 4; ++j) {
    const uint8x16_t b0 = vld1q_u8(x.qs + 32 * j), b1 = vld1q_u8(x.qs + 32 * j + 16);
    uint8x16_t lo0 = vandq_u8(b0, vdupq_n_u8(0x0f)), lo1 = vandq_u8(b1, vdupq_n_u8(0x0f));
    uint8x16_t hi0 = vshrq_n_u8(b0, 4), hi1 = vshrq_n_u8(b1, 4);
    if constexpr (Five) {
      const uint8x16_t one = vdupq_n_u8(1);
      lo0 = vorrq_u8(lo0, vshlq_n_u8(vandq_u8(shr(h0, 2 * j), one), 4));
      lo1 = vorrq_u8(lo1, vshlq_n_u8(vandq_u8(shr(h1, 2 * j), one), 4));
      hi0 = vorrq_u8(hi0, vshlq_n_u8(vandq_u8(shr(h0, 2 * j + 1), one), 4));
      hi1 = vorrq_u8(hi1, vshlq_n_u8(vandq_u8(shr(h1, 2 * j + 1), one), 4));
    }
    const int8_t* aj = a.qs + 64 * j;
    acc = vmlaq_n_s32(acc, dot_i8(dot16(lo0, aj), s8(lo1), vld1q_s8(aj + 16)), sc[2 * j]);
    acc = vmlaq_n_s32(acc, dot_i8(dot16(hi0, aj + 32), s8(hi1), vld1q_s8(aj + 48)), sc[2 * j + 1]);
  }
  return vaddvq_s32(acc);
}

// quant + 32 (0..63) and the 32 * activation sum back through the group sums.
int q6k_block(const BlockQ6K& x, const BlockQ8K& a) {
  int16_t coef[16];
  for (int g = 0; g < 16; ++g) coef[g] = x.scales[g];
  const int corr = 32 * bsums_dot(a, coef);
  int32x4_t acc = vdupq_n_s32(0);
  const uint8x16_t m4 = vdupq_n_u8(0x0f), m2 = vdupq_n_u8(3);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = x.ql + 64 * h;
    const uint8_t* qh = x.qh + 32 * h;
    for (int half = 0; half < 2; ++half) {  // l = 0..15, then 16..31
      const uint8x16_t A = vld1q_u8(ql + 16 * half), B = vld1q_u8(ql + 32 + 16 * half);
      const uint8x16_t H = vld1q_u8(qh + 16 * half);
      const uint8x16_t q[4] = {vorrq_u8(vandq_u8(A, m4), vshlq_n_u8(vandq_u8(H, m2), 4)),
                               vorrq_u8(vandq_u8(B, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(H, 2), m2), 4)),
                               vorrq_u8(vshrq_n_u8(A, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(H, 4), m2), 4)),
                               vorrq_u8(vshrq_n_u8(B, 4), vshlq_n_u8(vshrq_n_u8(H, 6), 4))};
      for (int k = 0; k < 4; ++k)
        acc = vmlaq_n_s32(acc, dot16(q[k], a.qs + 128 * h + 32 * k + 16 * half), x.scales[8 * h + 2 * k + half]);
    }
  }
  return vaddvq_s32(acc) - corr;
}

// Row-group drivers: the per-row float expression is the reference's, in its order.
struct Q2 {
  using Act = BlockQ8K;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    float sum[NR] = {};
    for (int64_t i = 0; i < nb; ++i)
      for (int r = 0; r < NR; ++r) {
        const BlockQ2K& x = reinterpret_cast<const BlockQ2K*>(w + r * stride)[i];
        int msum;
        const int isum = q2k_block(x, y[i], &msum);
        const float dall = y[i].d * half_at(&x.d), dmin = y[i].d * half_at(&x.dmin);
        sum[r] += dall * static_cast<float>(isum) - dmin * static_cast<float>(msum);
      }
    for (int r = 0; r < NR; ++r) out[r] = sum[r];
  }
};

template <bool Five>
struct Q45 {
  using Act = BlockQ8K;
  using Block = std::conditional_t<Five, BlockQ5K, BlockQ4K>;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    float sum[NR] = {};
    for (int64_t i = 0; i < nb; ++i)
      for (int r = 0; r < NR; ++r) {
        const Block& x = reinterpret_cast<const Block*>(w + r * stride)[i];
        int msum;
        const int isum = q45k_block<Five>(x, y[i], &msum);
        const float dall = y[i].d * half_at(&x.d), dmin = y[i].d * half_at(&x.dmin);
        sum[r] += dall * static_cast<float>(isum) - dmin * static_cast<float>(msum);
      }
    for (int r = 0; r < NR; ++r) out[r] = sum[r];
  }
};

template <class Block, int (*Fn)(const Block&, const BlockQ8K&)>
struct ScaleOnly {  // Q3_K, Q6_K: sum += d_a d isum
  using Act = BlockQ8K;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    float sum[NR] = {};
    for (int64_t i = 0; i < nb; ++i)
      for (int r = 0; r < NR; ++r) {
        const Block& x = reinterpret_cast<const Block*>(w + r * stride)[i];
        sum[r] += y[i].d * half_at(&x.d) * static_cast<float>(Fn(x, y[i]));
      }
    for (int r = 0; r < NR; ++r) out[r] = sum[r];
  }
};

// Q5_0 / Q5_1: five-bit quants from the nibbles and the bits of qh (element j: bit j).
inline void unpack5(const uint8_t* qs, const uint8_t* qh, uint8x16_t* lo, uint8x16_t* hi) {
  static const uint8_t kBits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  uint32_t h;
  std::memcpy(&h, qh, sizeof h);
  const uint8x16_t bit = vld1q_u8(kBits);
  const uint8x16_t h01 = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(h)), vdup_n_u8(static_cast<uint8_t>(h >> 8)));
  const uint8x16_t h23 = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(h >> 16)), vdup_n_u8(static_cast<uint8_t>(h >> 24)));
  const uint8x16_t v = vld1q_u8(qs);
  *lo = vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0f)), vandq_u8(vtstq_u8(h01, bit), vdupq_n_u8(0x10)));
  *hi = vorrq_u8(vshrq_n_u8(v, 4), vandq_u8(vtstq_u8(h23, bit), vdupq_n_u8(0x10)));
}

struct Q5_0 {
  using Act = BlockQ8_0;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    float32x4_t acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = vdupq_n_f32(0.0f);
    const uint8x16_t sixteen = vdupq_n_u8(16);
    for (int64_t i = 0; i < nb; ++i) {
      const int8x16_t a0 = vld1q_s8(y[i].qs), a1 = vld1q_s8(y[i].qs + 16);
      const float da = half_at(&y[i].d);
      for (int r = 0; r < NR; ++r) {
        const BlockQ5_0* x = reinterpret_cast<const BlockQ5_0*>(w + r * stride) + i;
        uint8x16_t lo, hi;
        unpack5(x->qs, x->qh, &lo, &hi);
        const int8x16_t l = vsubq_s8(s8(lo), s8(sixteen)), u = vsubq_s8(s8(hi), s8(sixteen));
        const int32x4_t p = dot_i8(dot_i8(vdupq_n_s32(0), l, a0), u, a1);
        acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(p), vdupq_n_f32(half_at(&x->d) * da));
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = vaddvq_f32(acc[r]);
  }
};

struct Q5_1 {
  using Act = BlockQ8_1;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    float32x4_t acc[NR];
    float offs[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = vdupq_n_f32(0.0f);
      offs[r] = 0.0f;
    }
    for (int64_t i = 0; i < nb; ++i) {
      const int8x16_t a0 = vld1q_s8(y[i].qs), a1 = vld1q_s8(y[i].qs + 16);
      const float da = half_at(&y[i].d), sa = half_at(&y[i].s);
      for (int r = 0; r < NR; ++r) {
        const BlockQ5_1* x = reinterpret_cast<const BlockQ5_1*>(w + r * stride) + i;
        uint8x16_t lo, hi;
        unpack5(x->qs, x->qh, &lo, &hi);
        const int32x4_t p = dot_i8(dot_i8(vdupq_n_s32(0), s8(lo), a0), s8(hi), a1);
        acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(p), vdupq_n_f32(half_at(&x->d) * da));
        offs[r] += half_at(&x->m) * sa;
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = vaddvq_f32(acc[r]) + offs[r];
  }
};

template <class K, int64_t Block>
constexpr VecDotRowsFn rows_fn = row_groups::vec_dot_rows<K, 4, 0, Block>;
template <class K, int64_t Block>
constexpr VecDotFn dot_fn = row_groups::vec_dot<K, Block>;

using Q3 = ScaleOnly<BlockQ3K, q3k_block>;
using Q6 = ScaleOnly<BlockQ6K, q6k_block>;

const TypeKernels kTable[] = {
    {DType::Q2_K, DType::Q8_K, ref::dequantize_row_q2_k, ref::quantize_row_q2_k, dot_fn<Q2, kQK_K>,
     q8k::quantize_row_neon, rows_fn<Q2, kQK_K>},
    {DType::Q3_K, DType::Q8_K, ref::dequantize_row_q3_k, ref::quantize_row_q3_k, dot_fn<Q3, kQK_K>,
     q8k::quantize_row_neon, rows_fn<Q3, kQK_K>},
    {DType::Q4_K, DType::Q8_K, ref::dequantize_row_q4_k, ref::quantize_row_q4_k, dot_fn<Q45<false>, kQK_K>,
     q8k::quantize_row_neon, rows_fn<Q45<false>, kQK_K>},
    {DType::Q5_K, DType::Q8_K, ref::dequantize_row_q5_k, ref::quantize_row_q5_k, dot_fn<Q45<true>, kQK_K>,
     q8k::quantize_row_neon, rows_fn<Q45<true>, kQK_K>},
    {DType::Q6_K, DType::Q8_K, ref::dequantize_row_q6_k, ref::quantize_row_q6_k, dot_fn<Q6, kQK_K>,
     q8k::quantize_row_neon, rows_fn<Q6, kQK_K>},
    // Q8_0 / Q8_1 activations use kernels_neon.cpp's quantizers (byte-identical to the reference).
    {DType::Q5_0, DType::Q8_0, ref::dequantize_row_q5_0, ref::quantize_row_q5_0, dot_fn<Q5_0, 32>,
     neon_kernels(DType::Q8_0)->quantize_act, rows_fn<Q5_0, 32>},
    {DType::Q5_1, DType::Q8_1, ref::dequantize_row_q5_1, ref::quantize_row_q5_1, dot_fn<Q5_1, 32>,
     neon_kernels(DType::Q8_1)->quantize_act, rows_fn<Q5_1, 32>},
    {DType::Q8_K, DType::Q8_K, q8k::dequantize_row_ref, q8k::quantize_row_neon, nullptr, q8k::quantize_row_neon,
     nullptr},
};

}  // namespace

const TypeKernels* kquant_neon_kernels(DType type) {
  for (const TypeKernels& k : kTable)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
