// WGSL source of the matrix-vector and dequantization kernels, one shader per weight
// type, built from a shared prelude and the type's decoder.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quant/dtype.hpp"

namespace colibri::gpu {

constexpr unsigned kMatvecWorkgroup = 64;  // threads per row; the reduction tree's width
constexpr unsigned kParamsBytes = 32;      // struct Params below

// The shader for `type` (entry points "matvec" and "dequant"). Throws Unsupported for a
// type without a GPU kernel.
std::string matvec_shader(DType type);

// Binding 4 of the shaders that have one: the lattice of an i-quant with one (IQ2_*, IQ3_*,
// IQ1_*; uploaded once per device, shader_table), or an F8_E4M3 chunk's block scales.
constexpr unsigned kAuxBinding = 4;
// The words of the table `type`'s shader reads at kAuxBinding; empty for the other types.
const std::vector<uint32_t>& shader_table(DType type);

}  // namespace colibri::gpu
