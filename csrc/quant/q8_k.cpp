// Q8_K activation quantizer (see q8_k.hpp). No FMA contraction: ggml rounds each step.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant/q8_k.hpp"

#include <cmath>
#include <cstring>

namespace colibri {
namespace {

// ggml's nearest_int: adding 1.5 * 2^23 rounds to an integer (ties to even) in the low
// mantissa bits. Valid for |v| <= 2^22; iscale * x stays within [-127.5, 127.5].
inline int nearest_int(float v) {
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

}  // namespace

void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
  BlockQ8K* y = static_cast<BlockQ8K*>(dst);
  for (int64_t i = 0; i < n / 256; ++i) {
    const float* x = src + i * 256;
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < 256; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (!(amax > 0.0f) || !std::isfinite(amax)) {  // zero block (or non-finite data): all zero
      y[i].d = 0.0f;
      std::memset(y[i].qs, 0, sizeof y[i].qs);
      std::memset(y[i].bsums, 0, sizeof y[i].bsums);
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(v < 127 ? (v > -127 ? v : -127) : 127);
    }
    for (int k = 0; k < 16; ++k) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[i].qs[16 * k + j];
      y[i].bsums[k] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

void dequantize_row_q8_k(const void* src, float* dst, int64_t n) {
  const BlockQ8K* y = static_cast<const BlockQ8K*>(src);
  for (int64_t i = 0; i < n / 256; ++i)
    for (int j = 0; j < 256; ++j) dst[i * 256 + j] = y[i].d * static_cast<float>(y[i].qs[j]);
}

}  // namespace colibri
