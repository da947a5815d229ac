// Resident tensors: bytes read through extents into one arena, checked against the
// declared type and shape, and (for GGUF Llama-family Q/K) restored to rotate-half order.
// One arena on 2 MiB pages rather than a buffer per tensor: a decode step touches every
// weight once, and with 4 KiB pages the TLB misses cost 25-35% of a SmolLM2 decode step
// (measured in benchmarks/bench_kernels.py, "huge-page arena").
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/aligned.hpp"
#include "io/file_reader.hpp"
#include "model/matmul.hpp"
#include "model/model_spec.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

struct Tensor {
  std::string name;
  DType type = DType::F32;
  int64_t rows = 1;   // 1 for vectors
  int64_t cols = 0;
  uint8_t* data = nullptr;  // inside the store's arena
  std::size_t nbytes = 0;
  BlockScales scales{};     // F8_E4M3: its block scales (in the arena after `data`)
  bool lanes = false;       // rows in the row-lane layout (WeightStore::pack_lanes)
  const GpuLinear* gpu = nullptr;  // its GPU copy, when the engine offloaded it (gpu_linear.hpp)

  WeightView view() const { return WeightView{type, rows, cols, data, scales, lanes, gpu}; }
  const float* f32() const;  // vector tensors must be F32 (norms, biases); throws otherwise
};

// Throws Error(Format) naming the tensor unless it is rows x cols (1 x n for a vector).
void check_shape(const Tensor* t, int64_t rows, int64_t cols);

class WeightStore {
 public:
  WeightStore(const std::vector<TensorSpec>& specs, const FileSet& files);

  // Checks the crc32 of the tensors the constructor read but did not check (a native
  // container's untransformed dense tensors) on the team; throws Error(Format) naming the
  // first damaged one. The engine calls it once, right after the team exists.
  void verify_checksums(ThreadPool& pool);

  // Rewrites, in place and on the team, every matrix `want` accepts (Q4_1 / Q8_0 with rows a
  // multiple of 8; others are skipped) into the row-lane layout (quant/lane_pack.hpp) and
  // marks it. Same bytes, same results; after verify_checksums, which reads the file's order.
  // Returns the bytes rewritten.
  std::size_t pack_lanes(ThreadPool& pool, const std::function<bool(const Tensor&)>& want);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const Tensor& get(const std::string& name) const;       // throws Format naming the tensor
  const Tensor* find(const std::string& name) const;      // nullptr if absent
  // Every tensor, in name order, for the engine to attach GPU copies to (Tensor::gpu).
  std::vector<Tensor*> all();
  std::size_t total_bytes() const { return total_bytes_; }

 private:
  std::map<std::string, Tensor> tensors_;
  std::size_t total_bytes_ = 0;
  AlignedPtr<uint8_t> arena_;
  struct Pending {
    std::string name, path;
    uint64_t offset = 0;
    const uint8_t* data = nullptr;
    std::size_t n = 0;
    uint32_t crc32 = 0;
  };
  std::vector<Pending> pending_;
};

}  // namespace colibri
