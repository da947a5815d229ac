// AVX2 kernel table of the K-quant family (see kquants.hpp).
#include "quant/kquants.hpp"
#include "quant/q8_k.hpp"

namespace colibri {
namespace {

const TypeKernels kTable[] = {
    {DType::Q8_K, DType::Q8_K, q8k::dequantize_row_ref, q8k::quantize_row_avx2, nullptr, q8k::quantize_row_avx2,
     nullptr},
};

}  // namespace

const TypeKernels* kquant_avx2_kernels(DType type) {
  for (const TypeKernels& k : kTable)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
