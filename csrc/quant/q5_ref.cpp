// Scalar reference of Q5_0 / Q5_1 (32-element blocks with a fifth bit per element in qh):
// quantizers with ggml's quantize_row_q5_*_ref arithmetic (byte-identical to
// gguf.quants.quantize), dequantization bit-identical to gguf.quants.dequantize, and the
// dot products against Q8_0 / Q8_1 (exact integer block sums, blocks accumulated in order).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cfloat>
#include <cmath>
#include <cstring>

#include "quant/blocks.hpp"
#include "quant/blocks_k.hpp"
#include "quant/fp16.hpp"
#include "quant/kquants.hpp"

namespace colibri {
namespace ref {
namespace {

inline uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, sizeof v);
  return v;
}

// Element j's 5-bit quant (0..31): nibble j (low nibbles first) plus 16 * bit j of qh.
inline int q5(const uint8_t* qs, uint32_t qh, int j) {
  const int lo = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
  return lo | static_cast<int>(((qh >> j) & 1u) << 4);
}

// ggml's `MIN(31, (int8_t)v)` / gguf's trunc-then-clip for v in [0, 32.5]; no undefined
// behaviour for the out-of-range or NaN values that only inf/NaN data produce.
inline uint8_t trunc5(float v) {
  if (!(v > 0.0f)) return 0;
  if (v >= 31.0f) return 31;
  return static_cast<uint8_t>(static_cast<int>(v));
}

// Packs 32 quants (0..31) into the nibbles and the qh bits.
inline void pack5(const uint8_t* q, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    qh |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, sizeof qh);
}

}  // namespace

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  const BlockQ5_0* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = d * static_cast<float>(q5(b[i].qs, qh, j) - 16);
  }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  const BlockQ5_1* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = d * static_cast<float>(q5(b[i].qs, qh, j)) + m;
  }
}

void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  BlockQ5_0* b = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, sign kept (first wins)
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16.0f;  // maps max to quant 0, so the range is [-16, 15] * d
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    uint8_t q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = trunc5(x[j] * id + 16.5f);
    pack5(q, b[i].qs, b[i].qh);
  }
}

void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  BlockQ5_1* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    uint8_t q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = trunc5((x[j] - min) * id + 0.5f);
    pack5(q, b[i].qs, b[i].qh);
  }
}

float vec_dot_q5_0_q8_0(int64_t n, const void* w, const void* act) {
  const BlockQ5_0* x = static_cast<const BlockQ5_0*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint32_t qh = load_qh(x[i].qh);
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += (q5(x[i].qs, qh, j) - 16) * y[i].qs[j];
    sum += fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d) * static_cast<float>(isum);
  }
  return sum;
}

float vec_dot_q5_1_q8_1(int64_t n, const void* w, const void* act) {
  const BlockQ5_1* x = static_cast<const BlockQ5_1*>(w);
  const BlockQ8_1* y = static_cast<const BlockQ8_1*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint32_t qh = load_qh(x[i].qh);
    int isum = 0;
    for (int j = 0; j < kQK; ++j) isum += q5(x[i].qs, qh, j) * y[i].qs[j];
    // sum_j (q_j d + m) a_j d_a = d d_a isum + m s  (s = d_a sum a_j, stored in the block)
    sum += fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d) * static_cast<float>(isum) +
           fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  return sum;
}

}  // namespace ref
}  // namespace colibri
