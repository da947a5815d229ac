// Private to csrc/quant: the K-quant family (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K with Q8_K
// activations) and the 5-bit 32-element formats (Q5_0 with Q8_0, Q5_1 with Q8_1).
//
//   kquants_ref.cpp        scalar reference: dequantize (bit-identical to gguf.quants) and
//                          the dot products that define what the SIMD versions compute
//   kquants_quantize.cpp   ggml's reference quantizers (make_qkx2_quants & co.)
//   kquants_x86.hpp        AVX2 / AVX-512 dot kernels (one template, two int8 dot primitives)
//   kquants_avx2.cpp, kquants_avx512.cpp, kquants_neon.cpp   the per-ISA tables
//   q5_*.cpp               Q5_0 / Q5_1, same split
//
// Each table file exports one lookup function per ISA (nullptr for a type it lacks);
// dispatch.cpp searches them after the 32-element formats' tables.
#pragma once
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri {

const TypeKernels* kquant_scalar_kernels(DType type);
#if defined(COLIBRI_X86)
const TypeKernels* kquant_avx2_kernels(DType type);
const TypeKernels* kquant_avx512_kernels(DType type);
#endif
#if defined(COLIBRI_ARM)
const TypeKernels* kquant_neon_kernels(DType type);
#endif

}  // namespace colibri
