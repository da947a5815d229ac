// Q8_K: the activation format of every 256-element super-block weight type (the K-quants,
// and the i-quants that llama.cpp pairs with Q8_K). Byte-identical to ggml's block_q8_K:
//   value[j] = qs[j] * d   (d a float, not a half),   bsums[g] = sum of qs[16 g .. 16 g + 15].
// The group sums let a weight type with per-16 or per-32 offsets (Q2_K, Q4_K, Q5_K mins)
// subtract them without touching the activation again.
//
// Quantizer arithmetic (ggml's quantize_row_q8_K_ref): max = the element of largest
// magnitude (the first one on ties, its sign kept; NaNs never win), iscale = -127 / max,
// q = min(127, nearest_int(iscale * x)) stored as int8 (the low byte), d = 1 / iscale.
// nearest_int is ggml's float trick: round to nearest, ties to even, through the bits of
// v + 1.5 * 2^23 (so an inf or NaN product gives a defined, ggml-identical byte). A block
// whose max is 0 becomes d = 0, qs = 0, bsums = 0 (ggml leaves its bsums unwritten).
//
// Every ISA's quantizer here is byte-identical to the scalar one (tests/kernels/test_kquants.py).
#pragma once
#include <cstdint>

namespace colibri {

constexpr int64_t kQK_K = 256;  // elements per super-block (ggml's QK_K)

struct BlockQ8K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8K) == 292, "GGUF Q8_K block is 292 bytes");

namespace q8k {

// Scalar reference (csrc/quant/q8_k.cpp). n is a multiple of 256.
void quantize_row_ref(const float* src, void* dst, int64_t n);
void dequantize_row_ref(const void* src, float* dst, int64_t n);

// SIMD quantizers, byte-identical to quantize_row_ref (q8_k_<isa>.cpp; compiled only where
// the ISA exists, called only where dispatch.cpp found it).
#if defined(COLIBRI_X86)
void quantize_row_avx2(const float* src, void* dst, int64_t n);
void quantize_row_avx512(const float* src, void* dst, int64_t n);
#endif
#if defined(COLIBRI_ARM)
void quantize_row_neon(const float* src, void* dst, int64_t n);
#endif

}  // namespace q8k
}  // namespace colibri
