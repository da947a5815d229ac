// Scalar reference kernels of the K-quant family (see kquants.hpp).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant/kquants.hpp"
#include "quant/q8_k.hpp"

namespace colibri {
namespace {

const TypeKernels kScalar[] = {
    // Q8_K is an activation format only: no weight dot product.
    {DType::Q8_K, DType::Q8_K, q8k::dequantize_row_ref, q8k::quantize_row_ref, nullptr, q8k::quantize_row_ref,
     nullptr},
};

}  // namespace

const TypeKernels* kquant_scalar_kernels(DType type) {
  for (const TypeKernels& k : kScalar)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
