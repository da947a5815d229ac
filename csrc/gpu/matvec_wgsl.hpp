// WGSL source of the matrix-vector and dequantization kernels, one shader per weight
// type, built from a shared prelude and the type's decoder.
#pragma once
#include <string>

#include "quant/dtype.hpp"

namespace colibri::gpu {

constexpr unsigned kMatvecWorkgroup = 64;  // threads per row; the reduction tree's width
constexpr unsigned kParamsBytes = 32;      // struct Params below

// The shader for `type` (entry points "matvec" and "dequant"). Throws Unsupported for a
// type without a GPU kernel.
std::string matvec_shader(DType type);

}  // namespace colibri::gpu
