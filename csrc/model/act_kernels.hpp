// The clamped SwiGLU activations (gpt-oss's swiglu_oai, DeepSeek-V4's swiglu_clamp) per
// ISA, chosen at run time like the matmul and attention kernels (quant/dispatch.cpp probes
// the CPU once). ops.hpp's swiglu_oai_mul / swiglu_clamp_mul run the best one.
//
// The scalar functions are the reference (std::exp, one value at a time). The AVX2 and
// AVX-512 ones compute the same formula eight / sixteen values at a time with a
// polynomial exp (Cephes' coefficients, range-reduced by ln 2 in two parts): within
// 6 x 2^-23 of the reference's magnitude, not bit-identical to it
// (tests/kernels/test_swiglu_kernels.py says why that bound). The clamps, the +1, the product and the division are IEEE operations
// in the reference's order; an argument past exp's float range gives inf (and so a zero
// product) as std::exp does, one below it 0.
#pragma once
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri {

struct ActKernels {
  // gate[i] = (u + 1) * g * sigmoid(alpha * g), g = min(gate[i], limit), u = clamp(up[i], +-limit)
  void (*swiglu_oai)(float* gate, const float* up, int64_t n, float limit, float alpha);
  // gate[i] = silu(min(gate[i], limit)) * clamp(up[i], -limit, limit)
  void (*swiglu_clamp)(float* gate, const float* up, int64_t n, float limit);
};

void swiglu_oai_mul_scalar(float* gate, const float* up, int64_t n, float limit, float alpha);
void swiglu_clamp_mul_scalar(float* gate, const float* up, int64_t n, float limit);

// Kernels at exactly `isa` (nullptr where not compiled in or not supported by this CPU;
// NEON has none yet and runs the scalar ones), and the best available.
const ActKernels* act_kernels_for(Isa isa);
const ActKernels& best_act_kernels();

#if defined(COLIBRI_X86)
const ActKernels* act_avx2_kernels();
const ActKernels* act_avx512_kernels();
#endif

}  // namespace colibri
