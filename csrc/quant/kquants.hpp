// Private to csrc/quant: the K-quant family (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K with Q8_K
// activations) and the 5-bit 32-element formats (Q5_0 with Q8_0, Q5_1 with Q8_1).
//
//   kquants_ref.cpp        scalar reference: dequantize (bit-identical to gguf.quants) and
//                          the dot products that define what the SIMD versions compute
//   kquants_quantize.cpp   ggml's reference quantizers (make_qkx2_quants & co.)
//   kquants_x86.hpp        AVX2 / AVX-512 dot kernels (one template, two int8 dot primitives)
//   kquants_avx2.cpp, kquants_avx512.cpp, kquants_neon.cpp   the per-ISA tables
//   q5_ref.cpp, q5_x86.hpp, q5_neon.hpp   Q5_0 / Q5_1 kernels (in the same tables)
//
// Each table file exports one lookup function per ISA (nullptr for a type it lacks);
// dispatch.cpp searches them after the 32-element formats' tables.
#pragma once
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri {
namespace ref {

// Scalar reference (kquants_ref.cpp, q5_ref.cpp, kquants_quantize.cpp). n is a whole number
// of blocks. Dequantization is bit-identical to gguf.quants.dequantize; quantization is
// ggml's quantize_row_*_ref arithmetic (byte-identical to gguf.quants.quantize for Q5_0 /
// Q5_1, which it implements); a dot product sums each block's integer products exactly and
// accumulates the blocks' float terms in order.
void dequantize_row_q2_k(const void* src, float* dst, int64_t n);
void dequantize_row_q3_k(const void* src, float* dst, int64_t n);
void dequantize_row_q4_k(const void* src, float* dst, int64_t n);
void dequantize_row_q5_k(const void* src, float* dst, int64_t n);
void dequantize_row_q6_k(const void* src, float* dst, int64_t n);
void dequantize_row_q5_0(const void* src, float* dst, int64_t n);
void dequantize_row_q5_1(const void* src, float* dst, int64_t n);

void quantize_row_q2_k(const float* src, void* dst, int64_t n);
void quantize_row_q3_k(const float* src, void* dst, int64_t n);
void quantize_row_q4_k(const float* src, void* dst, int64_t n);
void quantize_row_q5_k(const float* src, void* dst, int64_t n);
void quantize_row_q6_k(const float* src, void* dst, int64_t n);
void quantize_row_q5_0(const float* src, void* dst, int64_t n);
void quantize_row_q5_1(const float* src, void* dst, int64_t n);

float vec_dot_q2_k_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_q3_k_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_q4_k_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_q5_k_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_q6_k_q8_k(int64_t n, const void* w, const void* a);
float vec_dot_q5_0_q8_0(int64_t n, const void* w, const void* a);
float vec_dot_q5_1_q8_1(int64_t n, const void* w, const void* a);

}  // namespace ref

// Kernel tables of these types (and of Q8_K) per ISA.
const TypeKernels* kquant_scalar_kernels(DType type);
#if defined(COLIBRI_X86)
const TypeKernels* kquant_avx2_kernels(DType type);
const TypeKernels* kquant_avx512_kernels(DType type);
#endif
#if defined(COLIBRI_ARM)
const TypeKernels* kquant_neon_kernels(DType type);
#endif

}  // namespace colibri
