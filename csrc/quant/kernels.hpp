// The kernel interface for every block type: dequantize, quantize and a dot product
// against an activation row. Each type has a scalar reference implementation
// (quant/reference.cpp) and optional SIMD versions (quant/*_avx2.cpp, *_avx512.cpp,
// *_neon.cpp); quant/dispatch.cpp picks the best one the CPU supports at run time.
// Matrix-vector products quantize the activation once per row-block (act_type) and
// reuse it for every weight row.
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/dtype.hpp"

namespace colibri {

enum class Isa : int { Scalar = 0, AVX2 = 1, AVX512 = 2, NEON = 3 };
const char* isa_name(Isa isa);

// Converts n elements (a whole number of blocks) of a row to float.
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
// Converts n floats to the type (n a whole number of blocks). Same rounding as ggml's
// reference quantizers, so our blocks are byte-identical to llama.cpp's.
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);
// Dot product of one weight row (n elements of the weight type) with one activation row
// (n elements of the kernel's act_type).
using VecDotFn = float (*)(int64_t n, const void* weight_row, const void* act_row);
// out[r] = dot of weight row r (at w + r * w_stride bytes) with one activation row, for
// r < nrows. Bit-identical to calling VecDotFn row by row (the matmul relies on it: results
// must not depend on how rows are grouped); SIMD versions run several rows per pass so each
// activation block is loaded and converted once.
using VecDotRowsFn = void (*)(int64_t n, const void* w, std::size_t w_stride, int64_t nrows,
                              const void* act_row, float* out);

struct TypeKernels {
  DType type;
  DType act_type;                  // F32 for float weights, Q8_0 / Q8_1 for 4/8-bit blocks
  DequantizeRowFn dequantize_row;
  QuantizeRowFn quantize_row;      // float -> `type` (model conversion; byte-exact with ggml)
  VecDotFn vec_dot;                // nullptr for activation-only formats (Q8_1)
  QuantizeRowFn quantize_act;      // float -> `act_type` with this ISA: pairs with vec_dot.
                                   // Byte-identical to the scalar quantizer on every ISA.
  VecDotRowsFn vec_dot_rows;       // several rows against one activation (nullptr with vec_dot)
};

bool isa_available(Isa isa);       // compiled in and supported by this CPU
Isa best_isa();

// Kernels for `type` at exactly `isa`; nullptr where that combination does not exist
// (tests walk every (type, isa) pair and compare with Isa::Scalar).
const TypeKernels* kernels_for(DType type, Isa isa);
// Best available kernels for `type`; throws Error(Unsupported) if there are none.
const TypeKernels& kernels(DType type);

}  // namespace colibri
