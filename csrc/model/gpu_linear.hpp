// The backend seam of the linear layers (issue 30's first forward-pass slice on the GPU):
// with EngineConfig(device="gpu") the engine uploads the matrices of the attention
// projections, the dense FFN, the shared experts and the LM head once, at load, in their
// stored block bytes (gpu::Device::upload_matrix), and points each Tensor (and so each
// WeightView) at its GpuLinear. matmul() / matmul_multi() (model/matmul.cpp) are the one
// place a layer's weight-matrix product is computed; they send a weight with a GpuLinear
// here and keep every other weight on the CPU kernels, unchanged. Everything else in the
// forward pass (norms, RoPE, attention, routing, routed experts, sampling) stays on the CPU.
//
// A product on the GPU: each token's activation row is uploaded, y = W x computed by the
// type's matvec kernel (float32 activations against exactly dequantized weights, a fixed
// summation order: two runs give the same bits) and read back; one matvec per token, so a
// prefill row equals the decode of that token alone. Not thread-safe beyond the device's
// own lock: the engine runs one forward at a time and calls it outside parallel regions.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "model/matmul.hpp"
#include "model/weights.hpp"

namespace colibri {

// Cumulative counters of the GPU products, since the offload was made.
struct GpuCounters {
  uint64_t products = 0;       // matrix products run on the GPU (one per weight and call)
  uint64_t columns = 0;        // token rows multiplied (one matvec each)
  uint64_t dispatches = 0;     // compute dispatches (one per matvec and row chunk)
  uint64_t bytes_uploaded = 0;  // activation bytes written to the device
  uint64_t bytes_read_back = 0;  // result bytes read from it
  double seconds = 0.0;        // wall time inside the GPU calls (upload, compute, read back)
};

// One weight matrix uploaded to the device.
struct GpuLinear {
  gpu::Device* device = nullptr;
  std::unique_ptr<gpu::Matrix> matrix;
  GpuCounters* counters = nullptr;
};

// y[t * w.rows + r] = dot(W row r, x row t) for t < n, on the GPU. `w` must be the view the
// GpuLinear was made for (same type and shape; Error(Internal) otherwise).
void gpu_matmul(const GpuLinear& g, const WeightView& w, const float* x, int64_t n, float* y);

// Where one resident matrix (rows > 1) runs, and why when it stays on the CPU.
struct GpuPlacement {
  std::string name;
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  uint64_t bytes = 0;
  bool on_gpu = false;
  std::string reason;  // empty when on_gpu
};

// Why the slice keeps `name` on the CPU, or "" when it is one of the linear layers it
// offloads (`lm_head`: the tensor is the model's LM head, the tied embedding included).
std::string gpu_offload_exclusion(const std::string& name, bool lm_head);

// What Model.stats().gpu reports, copied under the engine's lock.
struct GpuReport {
  gpu::AdapterInfo adapter;
  uint64_t weight_bytes = 0;  // weights resident on the device
  GpuCounters counters;
  std::vector<GpuPlacement> placements;
};

// The engine's GPU offload: the device, the uploaded matrices and their counters. Made at
// load (Engine::use_gpu); its destructor detaches the tensors it attached (Tensor::gpu).
class GpuOffload {
 public:
  // Uploads every resident matrix gpu_offload_exclusion() accepts whose type has a GPU
  // kernel and that fits `memory_budget` (bytes, 0: no limit), and attaches it to its
  // tensor; records where every matrix runs. On an error nothing stays attached.
  GpuOffload(std::unique_ptr<gpu::Device> device, WeightStore& weights, const Tensor* lm_head,
             uint64_t memory_budget);
  ~GpuOffload();
  GpuOffload(const GpuOffload&) = delete;
  GpuOffload& operator=(const GpuOffload&) = delete;

  const gpu::AdapterInfo& adapter() const { return device_->adapter(); }
  uint64_t weight_bytes() const { return device_->resident_bytes(); }
  const std::vector<GpuPlacement>& placements() const { return placements_; }
  const GpuCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = GpuCounters{}; }
  GpuReport report() const { return GpuReport{adapter(), weight_bytes(), counters_, placements_}; }

 private:
  std::unique_ptr<gpu::Matrix> upload(const Tensor& t, const uint8_t* bytes);
  void detach();

  std::unique_ptr<gpu::Device> device_;
  GpuCounters counters_;
  std::deque<GpuLinear> linears_;  // a deque: the tensors hold their addresses
  std::vector<Tensor*> attached_;
  std::vector<GpuPlacement> placements_;
};

}  // namespace colibri
