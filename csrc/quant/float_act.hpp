// How activations meet quantized weights in a matrix product.
#pragma once
#include "common/errors.hpp"
#include "quant/kernels.hpp"

namespace colibri {

enum class ActPrecision : int {
  Int8 = 0,     // activations rounded to 8-bit blocks, integer dot products (llama.cpp's way)
  Float32 = 1,  // weights dequantized per row, float dot products (transformers' way)
};

// A float-activation dot that dequantizes each weight vector in registers instead of
// writing the row out (the decode path): the same products, rounded the same, accumulated
// as `f32_dot` accumulates, so it equals f32_dot of the dequantized row bit for bit.
struct FloatActDot {
  DType type;
  VecDotFn f32_dot;  // the F32 vec_dot it reproduces
  VecDotFn dot;
};

// Per-ISA lists ending with {DType::F32, nullptr, nullptr} (kernels_<isa>.cpp).
#if defined(COLIBRI_X86)
const FloatActDot* float_act_dots_avx2();
const FloatActDot* float_act_dots_avx512();
#endif

// The registered in-register dot for `type` that reproduces `f32_dot`, or nullptr (then
// the row is dequantized and dotted by f32_dot).
VecDotFn float_act_fused_dot(DType type, VecDotFn f32_dot);

// Kernels for `type` at the given activation precision. Float weights (F32, F16, BF16)
// always use float activations; the two precisions give them the same kernels.
const TypeKernels& kernels(DType type, ActPrecision precision);

}  // namespace colibri
