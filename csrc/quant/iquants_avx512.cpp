// AVX-512 kernels of the i-quants and MXFP4: none of their own yet. The dispatcher then
// uses the AVX2 kernels on AVX-512 machines (quant/iquants_avx2.cpp), which run there too.
#include "quant/reference.hpp"

namespace colibri {

const TypeKernels* iq_avx512_kernels(DType) { return nullptr; }

}  // namespace colibri
