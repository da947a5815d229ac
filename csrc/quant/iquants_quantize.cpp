// Quantizers of the low-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M).
// Not written yet: these types load, dequantize and run, but `quantize_row` is absent.
#include "quant/iquants_ref.hpp"

namespace colibri::iq {

QuantizeRowFn low_bit_quantizer(DType) { return nullptr; }

}  // namespace colibri::iq
