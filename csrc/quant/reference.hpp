// Private to csrc/quant: the scalar reference kernels and the per-ISA kernel tables that
// dispatch.cpp assembles. Each ISA file exports one lookup function; it returns nullptr for
// a type it has no kernels for (dispatch then reports that (type, isa) pair as absent).
#pragma once
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri {
namespace ref {

// Scalar reference, same arithmetic as ggml's *_ref functions (no FMA contraction).
void dequantize_row_f32(const void* src, float* dst, int64_t n);
void dequantize_row_f16(const void* src, float* dst, int64_t n);
void dequantize_row_bf16(const void* src, float* dst, int64_t n);
void dequantize_row_q4_0(const void* src, float* dst, int64_t n);
void dequantize_row_q4_1(const void* src, float* dst, int64_t n);
void dequantize_row_q8_0(const void* src, float* dst, int64_t n);
void dequantize_row_q8_1(const void* src, float* dst, int64_t n);

void quantize_row_f32(const float* src, void* dst, int64_t n);
void quantize_row_f16(const float* src, void* dst, int64_t n);
void quantize_row_bf16(const float* src, void* dst, int64_t n);
void quantize_row_q4_0(const float* src, void* dst, int64_t n);
void quantize_row_q4_1(const float* src, void* dst, int64_t n);
void quantize_row_q8_0(const float* src, void* dst, int64_t n);
void quantize_row_q8_1(const float* src, void* dst, int64_t n);

// Float weights against an F32 activation; accumulated in double, rounded once.
float vec_dot_f32(int64_t n, const void* w, const void* x);
float vec_dot_f16(int64_t n, const void* w, const void* x);
float vec_dot_bf16(int64_t n, const void* w, const void* x);
// Block weights: exact integer sum per block, then sum += d_w * d_a * isum (+ m_w * s_a).
float vec_dot_q4_0_q8_0(int64_t n, const void* w, const void* a);
float vec_dot_q4_1_q8_1(int64_t n, const void* w, const void* a);
float vec_dot_q8_0_q8_0(int64_t n, const void* w, const void* a);

const TypeKernels* scalar_kernels(DType type);

}  // namespace ref

// Per-ISA tables (defined in kernels_<isa>.cpp, compiled only where the ISA exists).
#if defined(COLIBRI_X86)
const TypeKernels* avx2_kernels(DType type);
const TypeKernels* avx512_kernels(DType type);
#endif
#if defined(COLIBRI_ARM)
const TypeKernels* neon_kernels(DType type);
#endif
// i-quants and MXFP4 (quant/iquants_<isa>.cpp).
#if defined(COLIBRI_X86)
const TypeKernels* iq_avx2_kernels(DType type);
const TypeKernels* iq_avx512_kernels(DType type);
#endif
#if defined(COLIBRI_ARM)
const TypeKernels* iq_neon_kernels(DType type);
#endif

}  // namespace colibri
