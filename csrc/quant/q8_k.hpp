// Q8_K: the activation format of the 256-element super-block types (K-quants, i-quants),
// byte-identical to ggml's block_q8_K. value[j] = qs[j] * d; bsums[k] = sum of qs[16k..16k+15].
// d is a float (not a half) and qs lie in [-127, 127]: the element of largest magnitude
// maps to -127 or 127 exactly (ggml's IQ kernels rely on -128 never occurring).
#pragma once
#include <cstdint>

namespace colibri {

struct BlockQ8K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(BlockQ8K) == 292, "ggml block_q8_K is 292 bytes");

// ggml's quantize_row_q8_K_ref arithmetic: iscale = -127 / max (max: the value of
// largest magnitude, sign kept), q = nearest_int(iscale * x) (round half to even),
// d = 1 / iscale; an all-zero block gets d = 0. n is a multiple of 256.
void quantize_row_q8_k(const float* src, void* dst, int64_t n);
void dequantize_row_q8_k(const void* src, float* dst, int64_t n);

}  // namespace colibri
