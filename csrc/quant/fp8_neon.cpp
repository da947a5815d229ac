// NEON kernel for FP8 e4m3 block-scaled weights (see fp8.hpp): fp8_x86.hpp's method on
// 2 x 4 lanes. e4m3 -> half is a shift ((c & 0x7f) << 7, sign << 8) read as a half, the
// 2^-8 it leaves is folded into the block scale, and fcvtl converts it exactly. Agrees with
// the scalar reference to rounding (FMA); scripts/check_iquants_arm64_qemu.sh checks it
// under qemu against the bound of test_fp8_direct.
#include <arm_neon.h>

#include <algorithm>

#include "quant/fp8.hpp"

namespace colibri::fp8 {
namespace {

// The 8 codes at p as 8 halves (each e4m3 value * 2^-8).
inline float16x8_t e4m3x8(const uint8_t* p) {
  const uint16x8_t b = vmovl_u8(vld1_u8(p));
  const uint16x8_t h = vorrq_u16(vshlq_n_u16(vandq_u16(b, vdupq_n_u16(0x7f)), 7),
                                 vshlq_n_u16(vandq_u16(b, vdupq_n_u16(0x80)), 8));
  return vreinterpretq_f16_u16(h);
}

}  // namespace

void dot_rows_neon(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                   const BlockScales& s, const float* x, float* out) {
  const int64_t nsc = scale_cols(n, s.block_cols);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint8_t* wr = w + static_cast<std::size_t>(r) * stride;
    const int64_t first = ((row0 + r) / s.block_rows) * nsc;
    float32x4_t acc = vdupq_n_f32(0.0f);
    float tail = 0.0f;
    for (int64_t b = 0; b < nsc; ++b) {
      const int64_t j0 = b * s.block_cols, j1 = std::min<int64_t>(n, j0 + s.block_cols);
      float32x4_t p0 = vdupq_n_f32(0.0f), p1 = vdupq_n_f32(0.0f);
      int64_t j = j0;
      for (; j + 8 <= j1; j += 8) {
        const float16x8_t h = e4m3x8(wr + j);
        p0 = vfmaq_f32(p0, vcvt_f32_f16(vget_low_f16(h)), vld1q_f32(x + j));
        p1 = vfmaq_f32(p1, vcvt_high_f32_f16(h), vld1q_f32(x + j + 4));
      }
      const float sb = scale_at(s, first + b), scale = sb * 256.0f;
      if (j < j1) {  // fewer than 8 left in this block
        float part = 0.0f;
        for (; j < j1; ++j) part += e4m3_to_float(wr[j]) * x[j];
        tail += sb * part;
      }
      acc = vfmaq_n_f32(acc, vaddq_f32(p0, p1), scale);
    }
    out[r] = vaddvq_f32(acc) + tail;
  }
}

}  // namespace colibri::fp8
