// FP8 e4m3 weights with 2-D block scales, as DeepSeek-V3 / GLM safetensors store them
// (docs/format.md, "FP8 block-scaled weights"): a matrix W [rows, cols] of one e4m3 byte
// per element (DType::F8_E4M3, row-major, row_bytes = cols) plus a companion F32 matrix
// S [ceil(rows / block_rows), ceil(cols / block_cols)] (`weight_scale_inv`):
//     W[i, j] = e4m3(byte[i, j]) * S[i / block_rows, j / block_cols]
// The core keeps the two side by side (WeightView::scales); kernels read a row with its
// row-block's scales, so the checkpoint's bytes run as they are.
//
// Activations are float32 for both activation precisions: e4m3's 4-bit exponent has no
// exact int8 form, and at one byte per weight decode is memory-bound on the float path.
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri {

struct BlockScales {
  // [ceil(rows / block_rows), ceil(cols / block_cols)] F32, little-endian, any alignment
  // (streamed experts keep the file's offsets, which need not be 4-aligned).
  const void* data = nullptr;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
};

// Scale number i of the matrix (row-major).
inline float scale_at(const BlockScales& s, int64_t i) {
  float v;
  __builtin_memcpy(&v, static_cast<const unsigned char*>(s.data) + i * 4, 4);
  return v;
}

// Number of scale columns for `cols` weight columns.
inline int64_t scale_cols(int64_t cols, int64_t block_cols) { return (cols + block_cols - 1) / block_cols; }

// The exact float of every e4m3 code (OCP FP8 / torch.float8_e4m3fn; S.1111.111 is NaN).
float e4m3_to_float(uint8_t code);

// out[r] = sum_j W[row0 + r, j] * x[j] for r < nrows, rows at w + r * stride (bytes). The
// column blocks' partial sums are taken in float and scaled once per block:
//     sum over blocks b of S[row / block_rows, b] * (sum over j in b of e4m3(w_j) x_j).
using Fp8DotRowsFn = void (*)(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                              const BlockScales& s, const float* x, float* out);
// Row `row` of W as floats (e4m3 * scale, rounded once, as DeepSeek's weight_dequant).
void fp8_dequantize_row(const uint8_t* w, int64_t row, int64_t n, const BlockScales& s, float* dst);

namespace fp8 {
void dot_rows_scalar(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                     const BlockScales& s, const float* x, float* out);
#if defined(COLIBRI_X86)
void dot_rows_avx2(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                   const BlockScales& s, const float* x, float* out);
void dot_rows_avx512(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                     const BlockScales& s, const float* x, float* out);
#endif
#if defined(COLIBRI_ARM)
void dot_rows_neon(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                   const BlockScales& s, const float* x, float* out);
#endif
}  // namespace fp8

// The kernel-table entry of F8_E4M3 at an ISA (Scalar, AVX2, AVX512 or NEON where built;
// nullptr otherwise and for other types): the codes' values WITHOUT scales, F32 activations. The matmul uses the
// scaled row kernel that goes with the entry (fp8_dot_rows_for) and refuses an F8_E4M3
// weight without scales.
const TypeKernels* fp8_type_kernels(DType type, Isa isa);
Fp8DotRowsFn fp8_dot_rows_for(const TypeKernels& k);

}  // namespace colibri
