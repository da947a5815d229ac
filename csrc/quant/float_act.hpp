// How activations meet quantized weights in a matrix product.
#pragma once
#include "common/errors.hpp"
#include "quant/kernels.hpp"

namespace colibri {

enum class ActPrecision : int {
  Int8 = 0,     // activations rounded to 8-bit blocks, integer dot products (llama.cpp's way)
  Float32 = 1,  // weights dequantized per row, float dot products (transformers' way)
};

// Kernels for `type` at the given activation precision. Float weights (F32, F16, BF16)
// always use float activations; the two precisions give them the same kernels.
const TypeKernels& kernels(DType type, ActPrecision precision);

}  // namespace colibri
