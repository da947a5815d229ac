// Threaded matrix products over the quantized kernel table (quant/kernels.hpp).
//
//   y[t * rows + r] = dot(W row r, x row t)      for t < n_tokens, r < rows
//
// Each activation row is quantized once to the kernel's act_type (F32 stays F32 for float
// weights), then the team splits the weight rows. Every output element is computed by
// exactly one thread with the same kernel and the same arithmetic, whatever the team size,
// the chunking or n_tokens: results are bit-identical for any number of threads, and row t
// of a prefill equals the decode of token t alone (batched verification = sequential).
// y must not overlap x. Called from inside a parallel region, the work runs inline.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/aligned.hpp"
#include "quant/dtype.hpp"
#include "quant/float_act.hpp"
#include "quant/fp8.hpp"
#include "quant/kernels.hpp"

namespace colibri {

class ThreadPool;
struct GpuLinear;  // a weight uploaded to a GPU (model/gpu_linear.hpp)

// A read-only matrix in its storage type. Row r starts at data + r * row_bytes(type, cols).
struct WeightView {
  DType type = DType::F32;
  int64_t rows = 0;            // output features
  int64_t cols = 0;            // input features; a whole number of the type's blocks
  const void* data = nullptr;  // rows * row_bytes(type, cols) bytes, no alignment needed
  BlockScales scales{};        // F8_E4M3 only: its companion block-scale matrix (quant/fp8.hpp)
  // Rows in the row-lane layout (quant/lane_pack.hpp; Q4_1 / Q8_0, rows a multiple of 8):
  // same bytes per row, same results, read directly by the AVX-512 row-lane kernels.
  bool lanes = false;
  // Set when the matrix is also on a GPU (EngineConfig(device="gpu")): matmul() and
  // matmul_multi() then compute it there (model/gpu_linear.hpp); matmul_with() ignores it.
  const GpuLinear* gpu = nullptr;
};

// Reusable working memory for the quantized activations. Grows on demand, never shrinks,
// 64-byte aligned. Not thread-safe: one per calling thread (e.g. one per session).
class ScratchBuffer {
 public:
  // A buffer of at least `bytes` bytes; previous contents are not kept.
  void* get(std::size_t bytes);
  std::size_t capacity() const { return capacity_; }

 private:
  AlignedPtr<unsigned char> data_;
  std::size_t capacity_ = 0;
};

// y = x W^T for one weight (on the GPU when w.gpu is set). x: [n_tokens, w.cols] floats; y: [n_tokens, w.rows] floats.
// Uses the best kernels for w.type (kernels(w.type)). Throws Error(InvalidArgument) for
// bad shapes, Error(Unsupported) for a type without kernels.
// `precision` chooses how activations meet quantized weights (quant/float_act.hpp).
void matmul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens, float* y,
            ScratchBuffer& scratch, ActPrecision precision = ActPrecision::Int8);

// Same with explicit kernels (tests and benchmarks compare ISAs with it).
void matmul_with(ThreadPool& pool, const TypeKernels& k, const WeightView& w, const float* x,
                 int64_t n_tokens, float* y, ScratchBuffer& scratch);

// Several weights that read the same input (q/k/v, gate/up, the experts of one token) in
// ONE parallel region: the activation is quantized once per distinct act_type and the
// rows of all weights are split over the team together. All weights need the same cols.
// outputs[i] receives [n_tokens, weights[i].rows]. Results equal separate matmul() calls.
void matmul_multi(ThreadPool& pool, const WeightView* weights, float* const* outputs, int n_weights,
                  const float* x, int64_t n_tokens, ScratchBuffer& scratch,
                  ActPrecision precision = ActPrecision::Int8);

// Embedding lookup: out[i, :] = dequantized row ids[i] of w (out: [n, w.cols] floats).
// Throws Error(TokenOutOfRange) for an id outside [0, w.rows).
void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out);

}  // namespace colibri
