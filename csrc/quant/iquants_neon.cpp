// NEON kernels of the i-quants and MXFP4: none yet; the scalar reference runs on arm64.
#include "quant/reference.hpp"

namespace colibri {

const TypeKernels* iq_neon_kernels(DType) { return nullptr; }

}  // namespace colibri
