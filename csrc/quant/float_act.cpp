// Float-activation kernels for quantized weights (ActPrecision::Float32): each weight row is
// dequantized — to the same bits as gguf's NumPy reference, which is what transformers
// computes with when it loads a GGUF — and dotted with the float activation by the F32
// kernel. No 8-bit rounding of the activation, so the result matches an F32 evaluation of
// the dequantized model to float rounding; it costs a dequantized row per dot product.
#include <vector>

#include "quant/float_act.hpp"

namespace colibri {
namespace {

template <DType Type>
void dot_rows(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  const TypeKernels& q = kernels(Type);
  const TypeKernels& f = kernels(DType::F32);
  thread_local std::vector<float> row;  // one dequantized row per thread, reused
  if (static_cast<int64_t>(row.size()) < n) row.resize(static_cast<std::size_t>(n));
  const auto* base = static_cast<const unsigned char*>(w);
  for (int64_t r = 0; r < nrows; ++r) {
    q.dequantize_row(base + static_cast<std::size_t>(r) * stride, row.data(), n);
    out[r] = f.vec_dot(n, row.data(), act);
  }
}

template <DType Type>
float dot(int64_t n, const void* w, const void* act) {
  float out = 0.0f;
  dot_rows<Type>(n, w, 0, 1, act, &out);
  return out;
}

template <DType Type>
TypeKernels make() {
  TypeKernels k = kernels(Type);
  k.act_type = DType::F32;
  k.quantize_act = nullptr;  // float activations are used as they are
  k.vec_dot = &dot<Type>;
  k.vec_dot_rows = &dot_rows<Type>;
  return k;
}

}  // namespace

const TypeKernels& kernels(DType type, ActPrecision precision) {
  const TypeKernels& fast = kernels(type);
  if (precision == ActPrecision::Int8 || fast.act_type == DType::F32) return fast;
  switch (type) {
    case DType::Q4_0: {
      static const TypeKernels k = make<DType::Q4_0>();
      return k;
    }
    case DType::Q4_1: {
      static const TypeKernels k = make<DType::Q4_1>();
      return k;
    }
    case DType::Q8_0: {
      static const TypeKernels k = make<DType::Q8_0>();
      return k;
    }
    case DType::Q5_0: {
      static const TypeKernels k = make<DType::Q5_0>();
      return k;
    }
    case DType::Q5_1: {
      static const TypeKernels k = make<DType::Q5_1>();
      return k;
    }
    case DType::Q2_K: {
      static const TypeKernels k = make<DType::Q2_K>();
      return k;
    }
    case DType::Q3_K: {
      static const TypeKernels k = make<DType::Q3_K>();
      return k;
    }
    case DType::Q4_K: {
      static const TypeKernels k = make<DType::Q4_K>();
      return k;
    }
    case DType::Q5_K: {
      static const TypeKernels k = make<DType::Q5_K>();
      return k;
    }
    case DType::Q6_K: {
      static const TypeKernels k = make<DType::Q6_K>();
      return k;
    }
#define COLIBRI_FLOAT_ACT(T)                     \
  case DType::T: {                               \
    static const TypeKernels k = make<DType::T>(); \
    return k;                                    \
  }
      // i-quants and MXFP4
      COLIBRI_FLOAT_ACT(IQ4_NL)
      COLIBRI_FLOAT_ACT(IQ4_XS)
      COLIBRI_FLOAT_ACT(IQ2_XXS)
      COLIBRI_FLOAT_ACT(IQ2_XS)
      COLIBRI_FLOAT_ACT(IQ2_S)
      COLIBRI_FLOAT_ACT(IQ3_XXS)
      COLIBRI_FLOAT_ACT(IQ3_S)
      COLIBRI_FLOAT_ACT(IQ1_S)
      COLIBRI_FLOAT_ACT(IQ1_M)
      COLIBRI_FLOAT_ACT(MXFP4)
#undef COLIBRI_FLOAT_ACT
    default:
      fail(ErrorKind::Unsupported,
           "tensor type " + dtype_name(type) + " has no float-activation kernels yet");
  }
}

}  // namespace colibri
