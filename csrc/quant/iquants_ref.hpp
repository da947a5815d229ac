// Scalar reference kernels of the i-quants (IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and MXFP4. Private to csrc/quant.
//  - dequantize_row_*: bit-identical to gguf.quants.dequantize (same float operations in
//    the same order as ggml's dequantize_row_*).
//  - vec_dot_*: against Q8_0 (IQ4_NL, MXFP4: ggml's float sum over 32-blocks) or Q8_K
//    (the 256-element types). For the Q8_K types the whole super-block is one exact integer
//    sum (the sub-block scales are small integers), then sum += d_w * d_a * isum: the same
//    arithmetic as ggml's generic kernels for IQ2/IQ3/IQ1, and for IQ4_XS an integer form
//    of ggml's per-32 float sum. SIMD kernels compute the same integers and the same float
//    steps, so for these types every ISA is bit-identical to this reference.
//  - quantize_row_*: IQ4_NL and IQ4_XS as llama.cpp's quantize_iq4_nl / quantize_iq4_xs
//    without an importance matrix (what `llama-quantize` writes); MXFP4 as ggml's
//    quantize_row_mxfp4_ref (= gguf's NumPy quantizer).
#pragma once
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri::iq {

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n);
void dequantize_row_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_row_iq2_xs(const void* src, float* dst, int64_t n);
void dequantize_row_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_row_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq1_m(const void* src, float* dst, int64_t n);
void dequantize_row_mxfp4(const void* src, float* dst, int64_t n);

void quantize_row_iq4_nl(const float* src, void* dst, int64_t n);
void quantize_row_iq4_xs(const float* src, void* dst, int64_t n);
void quantize_row_mxfp4(const float* src, void* dst, int64_t n);

float vec_dot_iq4_nl_q8_0(int64_t n, const void* w, const void* a);
float vec_dot_mxfp4_q8_0(int64_t n, const void* w, const void* a);
float vec_dot_iq4_xs_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_iq2_xxs_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_iq2_xs_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_iq2_s_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_iq3_xxs_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_iq3_s_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_iq1_s_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_iq1_m_q8_k(int64_t n, const void* w, const void* a);

// IQ1_M's half scale, assembled from the top nibbles of its four scale words.
static inline uint16_t iq1m_scale_bits(const uint8_t* scales) {
  uint16_t sc[4];
  __builtin_memcpy(sc, scales, sizeof sc);
  return static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
}

// colibri's own quantizers of the low-bit types (quant/iquants_quantize.cpp: IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M); nullptr for any other type.
QuantizeRowFn low_bit_quantizer(DType type);

// The scalar kernel table of these types (nullptr for any other type).
const TypeKernels* scalar_kernels(DType type);

}  // namespace colibri::iq
