// WGSL decoders of the weight-type families kept in their own files (matvec_wgsl_k.cpp,
// matvec_wgsl_iq.cpp). Each returns the `sub_scale` / `sub_value` pair that matvec_wgsl.cpp's
// 32-element sub-block driver calls, or nullptr for a type the family does not hold.
#pragma once

#include <string>

#include "quant/dtype.hpp"

namespace colibri::gpu {

const char* wgsl_kquant_body(DType type);  // Q2_K .. Q6_K
const char* wgsl_iquant_body(DType type);  // IQ4_NL, IQ4_XS, IQ2_XXS, IQ3_XXS, IQ3_S, MXFP4
// IQ2_XS, IQ2_S, IQ1_S, IQ1_M: their lattice read from the table binding (shader_table).
const char* wgsl_iquant_table_body(DType type);
const char* wgsl_fp8_body();  // F8_E4M3 with its block scales at the aux binding
// u32_at, grid_byte, sign_bit and ksigns, shared by the IQ2 / IQ3 decoders.
const char* wgsl_grid_helpers();

}  // namespace colibri::gpu
