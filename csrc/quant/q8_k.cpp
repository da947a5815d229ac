// Q8_K scalar reference (see q8_k.hpp for the arithmetic). No FMA contraction: ggml rounds
// the product iscale * x before adding the rounding constant.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant/q8_k.hpp"

#include <cmath>
#include <cstring>

#include "quant/kquant_common.hpp"

namespace colibri::q8k {

void quantize_row_ref(const float* src, void* dst, int64_t n) {
  BlockQ8K* y = static_cast<BlockQ8K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    float amax = 0.0f, max = 0.0f;
    for (int64_t j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8K));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int64_t j = 0; j < kQK_K; ++j) {
      const int v = kq::nearest_int(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(static_cast<uint8_t>(v < 127 ? v : 127));  // the low byte
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[i].qs[16 * g + j];
      y[i].bsums[g] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

void dequantize_row_ref(const void* src, float* dst, int64_t n) {
  const BlockQ8K* x = static_cast<const BlockQ8K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i)
    for (int64_t j = 0; j < kQK_K; ++j) dst[i * kQK_K + j] = x[i].d * static_cast<float>(x[i].qs[j]);
}

}  // namespace colibri::q8k
