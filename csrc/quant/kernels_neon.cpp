// AArch64 Advanced SIMD (NEON) kernels; compiled only on arm64 (see CMakeLists.txt), where
// NEON is always present. Scalar reference: quant/reference.cpp. Same exactness rules as
// the x86 kernels: dequantize_row and the activation quantizers are bit-identical to the
// reference; vec_dot keeps exact integer block sums and accumulates floats in another order.
//
// Integer dots use SDOT (vdotq_s32) when the compiler targets the dot-product extension
// (__ARM_FEATURE_DOTPROD: Apple M1 and later, -march=armv8.2-a+dotprod); otherwise widening
// multiplies (vmull_s8) and pairwise adds, which every AArch64 core has.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>

#include <cstring>

#include "quant/blocks.hpp"
#include "quant/fp16.hpp"
#include "quant/reference.hpp"
#include "quant/row_groups.hpp"

namespace colibri {
namespace {

// Half to float with the hardware conversion (exact, like fp16_to_fp32).
inline float half_at(const void* p) {
  __fp16 h;
  std::memcpy(&h, p, sizeof h);
  return static_cast<float>(h);
}

// 16 packed bytes -> low nibbles (elements 0..15) and high nibbles (16..31), 0..15 each.
inline void unpack_nibbles(const uint8_t* qs, int8x16_t* lo, int8x16_t* hi) {
  const uint8x16_t v = vld1q_u8(qs);
  *lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
  *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
}

// Sum of a[i] * b[i] over each group of 4 bytes -> 4 int32 lanes (exact). Without SDOT:
// int8 x int8 products widened to int16 (|p| <= 128 * 127 fits), then pairwise-added into
// the int32 lanes. The lane grouping differs from SDOT's; the block total does not.
inline int32x4_t dot_i8(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  const int16x8_t hi = vmull_high_s8(a, b);
  return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

// ---- activation quantizers (bit-identical to ref::quantize_row_q8_0 / q8_1) -----------

// FCVTAS rounds to nearest with ties away from zero (roundf) and maps NaN to 0; the
// saturating narrows clamp to [-128, 127] like the reference.
inline int8x16_t round_narrow(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
  const int16x8_t ab = vcombine_s16(vqmovn_s32(vcvtaq_s32_f32(a)), vqmovn_s32(vcvtaq_s32_f32(b)));
  const int16x8_t cd = vcombine_s16(vqmovn_s32(vcvtaq_s32_f32(c)), vqmovn_s32(vcvtaq_s32_f32(d)));
  return vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd));
}

// Quantizes 32 floats into qs; returns the sum of the quantized values, d via d_out.
inline int32_t quantize_block_q8(const float* x, int8_t* qs, float* d_out) {
  float32x4_t v[8];
  float32x4_t amax = vdupq_n_f32(0.0f);
  for (int k = 0; k < 8; ++k) {
    v[k] = vld1q_f32(x + 4 * k);
    amax = vmaxq_f32(amax, vabsq_f32(v[k]));
  }
  const float d = vmaxvq_f32(amax) / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int k = 0; k < 8; ++k) v[k] = vmulq_n_f32(v[k], id);
  const int8x16_t q0 = round_narrow(v[0], v[1], v[2], v[3]);
  const int8x16_t q1 = round_narrow(v[4], v[5], v[6], v[7]);
  vst1q_s8(qs, q0);
  vst1q_s8(qs + 16, q1);
  *d_out = d;
  return vaddlvq_s8(q0) + vaddlvq_s8(q1);
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    float d;
    quantize_block_q8(src + i * kQK, b[i].qs, &d);
    b[i].d = fp32_to_fp16(d);
  }
}

void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
  BlockQ8_1* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    float d;
    const int32_t sum = quantize_block_q8(src + i * kQK, b[i].qs, &d);
    b[i].d = fp32_to_fp16(d);
    b[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

// ---- dequantize (bit-identical to the reference) ---------------------------------------

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}

inline float32x4_t bf16x4_to_f32(const uint16_t* p) {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, bf16x4_to_f32(h + i));
  for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

// 16 int8 -> 16 floats times d.
inline void store_scaled_i8(int8x16_t q, float d, float* dst) {
  const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
  vst1q_f32(dst + 0, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
  vst1q_f32(dst + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
  vst1q_f32(dst + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
  vst1q_f32(dst + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
}

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
  const int8x16_t eight = vdupq_n_s8(8);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8x16_t lo, hi;
    unpack_nibbles(b[i].qs, &lo, &hi);
    const float d = half_at(&b[i].d);
    store_scaled_i8(vsubq_s8(lo, eight), d, dst + i * kQK);
    store_scaled_i8(vsubq_s8(hi, eight), d, dst + i * kQK + 16);
  }
}

// q * d + m for 16 nibbles, rounded after the multiply and after the add (no FMA).
inline void store_q4_1(int8x16_t q, float d, float m, float* dst) {
  const float32x4_t vm = vdupq_n_f32(m);
  const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
  const int32x4_t parts[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_high_s16(lo), vmovl_s16(vget_low_s16(hi)),
                              vmovl_high_s16(hi)};
  for (int k = 0; k < 4; ++k) vst1q_f32(dst + 4 * k, vaddq_f32(vmulq_n_f32(vcvtq_f32_s32(parts[k]), d), vm));
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int8x16_t lo, hi;
    unpack_nibbles(b[i].qs, &lo, &hi);
    const float d = half_at(&b[i].d), m = half_at(&b[i].m);
    store_q4_1(lo, d, m, dst + i * kQK);
    store_q4_1(hi, d, m, dst + i * kQK + 16);
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = half_at(&b[i].d);
    store_scaled_i8(vld1q_s8(b[i].qs), d, dst + i * kQK);
    store_scaled_i8(vld1q_s8(b[i].qs + 16), d, dst + i * kQK + 16);
  }
}

void dequantize_row_q8_1(const void* src, float* dst, int64_t n) {
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = half_at(&b[i].d);
    store_scaled_i8(vld1q_s8(b[i].qs), d, dst + i * kQK);
    store_scaled_i8(vld1q_s8(b[i].qs + 16), d, dst + i * kQK + 16);
  }
}

// ---- float dot products (weights F32/F16/BF16, activation F32) --------------------------

template <typename LoadVec, typename LoadOne>
inline float dot_float(int64_t n, const float* x, LoadVec load4, LoadOne load1) {
  float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; ++k) acc[k] = vfmaq_f32(acc[k], load4(i + 4 * k), vld1q_f32(x + i + 4 * k));
  for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], load4(i), vld1q_f32(x + i));
  float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
  for (; i < n; ++i) sum += load1(i) * x[i];
  return sum;
}

float vec_dot_f32(int64_t n, const void* w, const void* x) {
  const float* a = static_cast<const float*>(w);
  return dot_float(
      n, static_cast<const float*>(x), [a](int64_t i) { return vld1q_f32(a + i); }, [a](int64_t i) { return a[i]; });
}

float vec_dot_f16(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  return dot_float(
      n, static_cast<const float*>(x),
      [a](int64_t i) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(a + i))); },
      [a](int64_t i) { return fp16_to_fp32(a[i]); });
}

float vec_dot_bf16(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  return dot_float(
      n, static_cast<const float*>(x), [a](int64_t i) { return bf16x4_to_f32(a + i); },
      [a](int64_t i) { return bf16_to_fp32(a[i]); });
}

// ---- block dot products -----------------------------------------------------------------
// K::rows<NR> runs NR weight rows against one activation (each activation block loaded
// once); every row has its own accumulator and the same operations in the same order for
// any NR, so vec_dot_rows is bit-identical to vec_dot.

struct Q4_0 {
  using Act = BlockQ8_0;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    float32x4_t acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = vdupq_n_f32(0.0f);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t i = 0; i < nb; ++i) {
      const int8x16_t a0 = vld1q_s8(y[i].qs), a1 = vld1q_s8(y[i].qs + 16);
      const float da = half_at(&y[i].d);
      for (int r = 0; r < NR; ++r) {
        const BlockQ4_0* x = reinterpret_cast<const BlockQ4_0*>(w + r * stride) + i;
        int8x16_t lo, hi;
        unpack_nibbles(x->qs, &lo, &hi);
        const int32x4_t p = dot_i8(dot_i8(vdupq_n_s32(0), vsubq_s8(lo, eight), a0), vsubq_s8(hi, eight), a1);
        acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(p), vdupq_n_f32(half_at(&x->d) * da));
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = vaddvq_f32(acc[r]);
  }
};

struct Q8_0 {
  using Act = BlockQ8_0;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    float32x4_t acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < nb; ++i) {
      const int8x16_t a0 = vld1q_s8(y[i].qs), a1 = vld1q_s8(y[i].qs + 16);
      const float da = half_at(&y[i].d);
      for (int r = 0; r < NR; ++r) {
        const BlockQ8_0* x = reinterpret_cast<const BlockQ8_0*>(w + r * stride) + i;
        const int32x4_t p = dot_i8(dot_i8(vdupq_n_s32(0), vld1q_s8(x->qs), a0), vld1q_s8(x->qs + 16), a1);
        acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(p), vdupq_n_f32(half_at(&x->d) * da));
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = vaddvq_f32(acc[r]);
  }
};

// Q4_1 . Q8_1: d d_a sum q a + m s; the offsets m s accumulate in a scalar per row.
struct Q4_1 {
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
        const BlockQ4_1* x = reinterpret_cast<const BlockQ4_1*>(w + r * stride) + i;
        int8x16_t lo, hi;
        unpack_nibbles(x->qs, &lo, &hi);
        const int32x4_t p = dot_i8(dot_i8(vdupq_n_s32(0), lo, a0), hi, a1);
        acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(p), vdupq_n_f32(half_at(&x->d) * da));
        offs[r] += half_at(&x->m) * sa;
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = vaddvq_f32(acc[r]) + offs[r];
  }
};

template <class K>
constexpr VecDotRowsFn vec_dot_rows = row_groups::vec_dot_rows<K, 4, 0>;
using row_groups::rows_each;
using row_groups::vec_dot;

const TypeKernels kNeon[] = {
    {DType::F32, DType::F32, ref::dequantize_row_f32, ref::quantize_row_f32, vec_dot_f32, ref::quantize_row_f32,
     rows_each<vec_dot_f32>},
    {DType::F16, DType::F32, dequantize_row_f16, ref::quantize_row_f16, vec_dot_f16, ref::quantize_row_f32,
     rows_each<vec_dot_f16>},
    {DType::BF16, DType::F32, dequantize_row_bf16, ref::quantize_row_bf16, vec_dot_bf16, ref::quantize_row_f32,
     rows_each<vec_dot_bf16>},
    {DType::Q4_0, DType::Q8_0, dequantize_row_q4_0, ref::quantize_row_q4_0, vec_dot<Q4_0>, quantize_row_q8_0,
     vec_dot_rows<Q4_0>},
    {DType::Q4_1, DType::Q8_1, dequantize_row_q4_1, ref::quantize_row_q4_1, vec_dot<Q4_1>, quantize_row_q8_1,
     vec_dot_rows<Q4_1>},
    {DType::Q8_0, DType::Q8_0, dequantize_row_q8_0, quantize_row_q8_0, vec_dot<Q8_0>, quantize_row_q8_0,
     vec_dot_rows<Q8_0>},
    {DType::Q8_1, DType::Q8_1, dequantize_row_q8_1, quantize_row_q8_1, nullptr, quantize_row_q8_1, nullptr},
};

}  // namespace

const TypeKernels* neon_kernels(DType type) {
  for (const TypeKernels& k : kNeon)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
