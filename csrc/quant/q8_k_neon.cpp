// Q8_K activation quantizer, NEON (AArch64). Byte-identical to q8k::quantize_row_ref by
// the same construction as q8_k_avx2.cpp: the same IEEE operations in the same order (no
// contraction), ggml's rounding trick on the integer bits, and narrowing moves that keep
// each value's low byte as the reference does. vmaxnm ignores NaNs like the reference's >.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>

#include <cstring>

#include "quant/q8_k.hpp"

namespace colibri::q8k {

void quantize_row_neon(const float* src, void* dst, int64_t n) {
  BlockQ8K* y = static_cast<BlockQ8K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int k = 0; k < kQK_K; k += 4) acc = vmaxnmq_f32(acc, vabsq_f32(vld1q_f32(x + k)));
    const float amax = vmaxnmvq_f32(acc);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8K));
      continue;
    }
    float max = 0.0f;
    for (int k = 0; k < kQK_K; ++k)  // the first element of that magnitude gives the sign
      if (__builtin_fabsf(x[k]) == amax) {
        max = x[k];
        break;
      }
    const float iscale = -127.0f / max;
    const float32x4_t vis = vdupq_n_f32(iscale), magic = vdupq_n_f32(12582912.0f);
    const int32x4_t mant = vdupq_n_s32(0x007fffff), bias = vdupq_n_s32(0x00400000), cap = vdupq_n_s32(127);
    for (int k = 0; k < kQK_K; k += 16) {
      int16x4_t h[4];
      for (int u = 0; u < 4; ++u) {
        const float32x4_t t = vaddq_f32(vmulq_f32(vld1q_f32(x + k + 4 * u), vis), magic);
        int32x4_t q = vsubq_s32(vandq_s32(vreinterpretq_s32_f32(t), mant), bias);
        h[u] = vmovn_s32(vminq_s32(q, cap));  // narrowing keeps the low half
      }
      const int8x16_t b = vcombine_s8(vmovn_s16(vcombine_s16(h[0], h[1])), vmovn_s16(vcombine_s16(h[2], h[3])));
      vst1q_s8(y[i].qs + k, b);
      y[i].bsums[k / 16] = static_cast<int16_t>(vaddlvq_s8(b));
    }
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace colibri::q8k
