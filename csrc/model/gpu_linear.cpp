// The linear layers' GPU backend: which matrices go up, and their products. See
// gpu_linear.hpp.
#include "model/gpu_linear.hpp"

#include <chrono>
#include <cstring>

#include "common/errors.hpp"
#include "quant/lane_pack.hpp"

namespace colibri {

namespace {

// The per-layer linear layers this slice offloads (the name after "blk.{i}."): attention
// projections (GQA, MLA, DeepSeek-V4's), the dense FFN and the shared experts.
const char* const kOffloaded[] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "attn_gate", "attn_q_a", "attn_q_b",
    "attn_kv_a_mqa", "attn_kv", "attn_output_b", "ffn_gate", "ffn_up", "ffn_down",
    "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
};

// "blk.12.attn_q" -> "attn_q"; "" for a name outside the layers.
std::string layer_part(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return "";
  const std::size_t dot = name.find('.', 4);
  return dot == std::string::npos ? "" : name.substr(dot + 1);
}

}  // namespace

std::string gpu_offload_exclusion(const std::string& name, bool lm_head) {
  if (lm_head) return "";
  const std::string part = layer_part(name);
  for (const char* o : kOffloaded)
    if (part == o) return "";
  if (name == "token_embd") return "the embedding: its rows are looked up on the CPU";
  if (part.rfind("ffn_gate_inp", 0) == 0) return "a router: routing stays on the CPU";
  if (part == "attn_k_b" || part == "attn_v_b" || part == "attn_output_a")
    return "per-head products stay on the CPU";
  return "not a linear layer this slice offloads";
}

void gpu_matmul(const GpuLinear& g, const WeightView& w, const float* x, int64_t n, float* y) {
  const gpu::Matrix& m = *g.matrix;
  if (w.type != m.type() || w.rows != m.rows() || w.cols != m.cols())
    fail(ErrorKind::Internal, "gpu_matmul: the view is not the matrix that was uploaded");
  if (n <= 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < n; ++t) g.device->matvec(m, x + t * w.cols, y + t * w.rows);
  GpuCounters& c = *g.counters;
  c.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c.products += 1;
  c.columns += static_cast<uint64_t>(n);
  c.dispatches += static_cast<uint64_t>(n) * m.chunks();
  c.bytes_uploaded += static_cast<uint64_t>(n * w.cols) * sizeof(float);
  c.bytes_read_back += static_cast<uint64_t>(n * w.rows) * sizeof(float);
}

// One matrix onto the device in its stored bytes; FP8 with its block scales, copied out of
// the arena first because they need not be 4-aligned there (quant/fp8.hpp).
std::unique_ptr<gpu::Matrix> GpuOffload::upload(const Tensor& t, const uint8_t* bytes) {
  if (t.type != DType::F8_E4M3) return device_->upload_matrix(t.type, t.rows, t.cols, bytes, t.nbytes, 0);
  const BlockScales& b = t.scales;
  if (b.data == nullptr || b.block_rows <= 0 || b.block_cols <= 0)
    fail(ErrorKind::Internal, "tensor '" + t.name + "': F8_E4M3 without its block scales");
  const int64_t count = ((t.rows + b.block_rows - 1) / b.block_rows) * ((t.cols + b.block_cols - 1) / b.block_cols);
  std::vector<float> scales(static_cast<std::size_t>(count));
  std::memcpy(scales.data(), b.data, scales.size() * sizeof(float));
  const gpu::ScaleBlocks s{scales.data(), scales.size(), b.block_rows, b.block_cols};
  return device_->upload_scaled_matrix(t.type, t.rows, t.cols, bytes, t.nbytes, s, 0);
}

GpuOffload::GpuOffload(std::unique_ptr<gpu::Device> device, WeightStore& weights, const Tensor* lm_head,
                       uint64_t memory_budget)
    : device_(std::move(device)) {
  try {
    std::vector<uint8_t> unpacked;
    for (Tensor* t : weights.all()) {
      if (t->rows <= 1) continue;  // vectors: norms, biases
      GpuPlacement p{t->name, t->type, t->rows, t->cols, t->nbytes, false, ""};
      p.reason = gpu_offload_exclusion(t->name, t == lm_head);
      if (p.reason.empty() && !gpu::has_gpu_kernel(t->type))
        p.reason = "no GPU kernel for " + dtype_name(t->type) + " weights yet";
      if (p.reason.empty() && memory_budget != 0 && device_->resident_bytes() + t->nbytes > memory_budget)
        p.reason = "past GPUConfig.memory_budget";
      if (p.reason.empty()) {
        const uint8_t* bytes = t->data;
        if (t->lanes) {  // the kernels read the file's row order: undo the row-lane layout
          unpacked.resize(t->nbytes);
          unpack_lane_rows(t->type, t->data, t->cols, 0, t->rows, unpacked.data());
          bytes = unpacked.data();
        }
        GpuLinear g{device_.get(), upload(*t, bytes), &counters_};
        linears_.push_back(std::move(g));
        t->gpu = &linears_.back();
        attached_.push_back(t);
        p.on_gpu = true;
      }
      placements_.push_back(std::move(p));
    }
  } catch (...) {
    detach();
    throw;
  }
}

GpuOffload::~GpuOffload() { detach(); }

void GpuOffload::detach() {
  for (Tensor* t : attached_) t->gpu = nullptr;
  attached_.clear();
}

}  // namespace colibri
