// WGSL decoders of the weight-type families kept in their own files (matvec_wgsl_k.cpp,
// matvec_wgsl_iq.cpp). Each returns the `sub_scale` / `sub_value` pair that matvec_wgsl.cpp's
// 32-element sub-block driver calls, or nullptr for a type the family does not hold.
#pragma once

#include <string>

#include "quant/dtype.hpp"

namespace colibri::gpu {

const char* wgsl_kquant_body(DType type);  // Q2_K .. Q6_K
const char* wgsl_iquant_body(DType type);  // IQ4_NL, IQ4_XS, MXFP4
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: their lattice read from the aux
// binding (shader_table). IQ2_XXS brings its own row_part.
const char* wgsl_iquant_grid_body(DType type);
const char* wgsl_fp8_body();  // F8_E4M3 with its block scales at the aux binding

}  // namespace colibri::gpu
