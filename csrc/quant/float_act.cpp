// Float-activation kernels for quantized weights (ActPrecision::Float32): each weight row is
// dequantized — to the same bits as gguf's NumPy reference, which is what transformers
// computes with when it loads a GGUF — and dotted with the float activation by the F32
// kernel. No 8-bit rounding of the activation, so the result matches an F32 evaluation of
// the dequantized model to float rounding.
//
// A one-token product pays a dequantized row per dot. A prefill tile (several tokens)
// dequantizes its rows once and dots each with every token: the same dequantize and F32
// vec_dot per (row, token) pair, so a prefill equals token-by-token decode bit for bit
// (matmul.hpp's contract), without dequantizing a row once per token. Q4_0, Q4_1 and Q8_0
// one-token dots dequantize in registers (kernels_<isa>.cpp's float_act_dot_*).
#include <vector>

#include "quant/dot_tiles.hpp"
#include "quant/float_act.hpp"

namespace colibri {
namespace {

template <DType Type>
void dot_rows(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  const TypeKernels& q = kernels(Type);
  const TypeKernels& f = kernels(DType::F32);
  static const VecDotFn fused = float_act_fused_dot(Type, f.vec_dot);
  if (fused) {  // the same bits without writing the row out (decode's path)
    const auto* rows = static_cast<const unsigned char*>(w);
    for (int64_t r = 0; r < nrows; ++r) out[r] = fused(n, rows + static_cast<std::size_t>(r) * stride, act);
    return;
  }
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

// out[t * out_stride + r] = dot(row r, token t), each row dequantized once per call.
template <DType Type>
void tile(int64_t n, const void* w, std::size_t w_stride, int64_t nrows, const void* act, std::size_t act_stride,
          int64_t ntok, float* out, std::size_t out_stride) {
  const TypeKernels& q = kernels(Type);
  const TypeKernels& f = kernels(DType::F32);
  thread_local std::vector<float> rows;  // the call's rows, dequantized; reused per thread
  const auto un = static_cast<std::size_t>(n);
  if (rows.size() < static_cast<std::size_t>(nrows) * un) rows.resize(static_cast<std::size_t>(nrows) * un);
  const auto* wb = static_cast<const unsigned char*>(w);
  for (int64_t r = 0; r < nrows; ++r)
    q.dequantize_row(wb + static_cast<std::size_t>(r) * w_stride, rows.data() + static_cast<std::size_t>(r) * un, n);
  // The F32 kernel's own tile computes the same bits as its vec_dot (dot_tiles.hpp).
  static const DotTile* f32 = dot_tile_for(f);
  if (f32) {
    f32->tile(n, rows.data(), un * sizeof(float), nrows, act, act_stride, ntok, out, out_stride);
    return;
  }
  const auto* ab = static_cast<const unsigned char*>(act);
  for (int64_t t = 0; t < ntok; ++t) {
    const void* a = ab + static_cast<std::size_t>(t) * act_stride;
    float* o = out + static_cast<std::size_t>(t) * out_stride;
    for (int64_t r = 0; r < nrows; ++r) o[r] = f.vec_dot(n, rows.data() + static_cast<std::size_t>(r) * un, a);
  }
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

// Every quantized type with float-activation kernels, once (the switch and the tile list).
#define COLIBRI_FLOAT_ACT_TYPES(X)                                                                          \
  X(Q4_0) X(Q4_1) X(Q8_0) X(Q5_0) X(Q5_1) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ4_NL) X(IQ4_XS)      \
      X(IQ2_XXS) X(IQ2_XS) X(IQ2_S) X(IQ3_XXS) X(IQ3_S) X(IQ1_S) X(IQ1_M) X(MXFP4)

// Weight bytes per tile call: the dequantized rows (4-8x the bytes) then stay in L2.
constexpr std::size_t kTileWeightBytes = 32 * 1024;

}  // namespace

VecDotFn float_act_fused_dot(DType type, VecDotFn f32_dot) {
#if defined(COLIBRI_X86)
  for (const FloatActDot* list : {float_act_dots_avx2(), float_act_dots_avx512()})
    for (const FloatActDot* p = list; p->dot; ++p)
      if (p->type == type && p->f32_dot == f32_dot) return p->dot;
#endif
  (void)type;
  (void)f32_dot;
  return nullptr;
}

const TypeKernels& kernels(DType type, ActPrecision precision) {
  const TypeKernels& fast = kernels(type);
  if (precision == ActPrecision::Int8 || fast.act_type == DType::F32) return fast;
  switch (type) {
#define COLIBRI_FLOAT_ACT(T)                       \
  case DType::T: {                                 \
    static const TypeKernels k = make<DType::T>(); \
    return k;                                      \
  }
    COLIBRI_FLOAT_ACT_TYPES(COLIBRI_FLOAT_ACT)
#undef COLIBRI_FLOAT_ACT
    default:
      fail(ErrorKind::Unsupported,
           "tensor type " + dtype_name(type) + " has no float-activation kernels yet");
  }
}

const DotTile* float_act_tiles() {
#define COLIBRI_FLOAT_ACT_TILE(T) {&dot<DType::T>, &tile<DType::T>, kTileWeightBytes},
  static const DotTile list[] = {COLIBRI_FLOAT_ACT_TYPES(COLIBRI_FLOAT_ACT_TILE){nullptr, nullptr}};
#undef COLIBRI_FLOAT_ACT_TILE
  return list;
}

}  // namespace colibri
