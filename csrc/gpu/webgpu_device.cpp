// gpu::Device over WebGPU: weights uploaded in row chunks within the binding limit, one
// compute pass per call with a dispatch per chunk, the result read back.
#include <algorithm>
#include <map>
#include <mutex>

#include "common/errors.hpp"
#include "gpu/device.hpp"
#include "gpu/matvec_wgsl.hpp"
#include "gpu/webgpu_context.hpp"

namespace colibri::gpu {

namespace {

// Largest split: chunk offsets in the shaders are u32 bytes.
constexpr uint64_t kMaxSplit = uint64_t{1} << 31;

struct Params {  // the shader's struct Params, field for field
  uint32_t rows, cols, row_base, row_bytes, nx_rows, nx_elems, aux0, aux1;
};
static_assert(sizeof(Params) == kParamsBytes, "Params must match the WGSL struct");

struct Chunk {
  WGPUBuffer weights = nullptr;
  WGPUBuffer params = nullptr;
  WGPUBuffer scales = nullptr;  // F8_E4M3: the scale rows of this chunk's rows
  int64_t row0 = 0;
  int64_t rows = 0;
  uint64_t bytes = 0;        // of weights
  uint64_t scale_bytes = 0;  // of scales
};

// x, y workgroup counts covering `n` workgroups within the per-dimension limit.
std::pair<uint32_t, uint32_t> grid(uint64_t n, uint32_t max_per_dim) {
  const uint64_t nx = std::min<uint64_t>(std::max<uint64_t>(n, 1), max_per_dim);
  return {static_cast<uint32_t>(nx), static_cast<uint32_t>((n + nx - 1) / nx)};
}

class WebGpuMatrix final : public Matrix {
 public:
  WebGpuMatrix(std::shared_ptr<Context> ctx, DType type, int64_t rows, int64_t cols)
      : ctx_(std::move(ctx)), type_(type), rows_(rows), cols_(cols) {}
  ~WebGpuMatrix() override {
    for (Chunk& c : chunks_) {
      ctx_->resident -= c.bytes + c.scale_bytes;
      if (c.weights != nullptr) ctx_->api->wgpuBufferRelease(c.weights);
      if (c.params != nullptr) ctx_->api->wgpuBufferRelease(c.params);
      if (c.scales != nullptr) ctx_->api->wgpuBufferRelease(c.scales);
    }
  }
  DType type() const override { return type_; }
  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }
  std::size_t chunks() const override { return chunks_.size(); }

  std::shared_ptr<Context> ctx_;
  DType type_;
  int64_t rows_, cols_;
  std::vector<Chunk> chunks_;
};

class WebGpuDevice final : public Device {
 public:
  explicit WebGpuDevice(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {}
  ~WebGpuDevice() override {
    for (auto& entry : pipelines_) {
      ctx_->api->wgpuComputePipelineRelease(entry.second.first);
      ctx_->api->wgpuComputePipelineRelease(entry.second.second);
    }
    for (auto& entry : tables_) ctx_->api->wgpuBufferRelease(entry.second);
  }
  const AdapterInfo& adapter() const override { return ctx_->info; }
  uint64_t resident_bytes() const override { return ctx_->resident; }

  std::unique_ptr<Matrix> upload_matrix(DType type, int64_t rows, int64_t cols,
                                        const uint8_t* bytes, std::size_t nbytes,
                                        uint64_t split_bytes) override {
    if (type == DType::F8_E4M3) {
      fail(ErrorKind::InvalidArgument,
           "F8_E4M3 weights need their block scales (upload them with upload_scaled_matrix)");
    }
    return upload(type, rows, cols, bytes, nbytes, nullptr, split_bytes);
  }

  std::unique_ptr<Matrix> upload_scaled_matrix(DType type, int64_t rows, int64_t cols,
                                               const uint8_t* bytes, std::size_t nbytes,
                                               const ScaleBlocks& scales,
                                               uint64_t split_bytes) override {
    if (type != DType::F8_E4M3) {
      fail(ErrorKind::InvalidArgument, "only F8_E4M3 weights come with block scales, not " +
                                           dtype_name(type));
    }
    if (rows <= 0 || cols <= 0 || scales.block_rows <= 0 || scales.block_cols <= 0 ||
        scales.block_rows > UINT32_MAX || scales.block_cols > UINT32_MAX) {
      fail(ErrorKind::InvalidArgument, "F8_E4M3: shapes and block sizes must be positive");
    }
    const int64_t srows = (rows + scales.block_rows - 1) / scales.block_rows;
    const int64_t scols = (cols + scales.block_cols - 1) / scales.block_cols;
    if (scales.data == nullptr || scales.count != static_cast<std::size_t>(srows * scols)) {
      fail(ErrorKind::InvalidArgument, "F8_E4M3 block scales of " + std::to_string(rows) + " x " +
                                           std::to_string(cols) + " weights are " +
                                           std::to_string(srows) + " x " + std::to_string(scols) +
                                           " floats, got " + std::to_string(scales.count));
    }
    return upload(type, rows, cols, bytes, nbytes, &scales, split_bytes);
  }

 private:
  // Uploads in chunks of whole rows; `scales` (F8_E4M3 only, else nullptr): each chunk also
  // gets the scale rows its rows use, within the same split size.
  std::unique_ptr<Matrix> upload(DType type, int64_t rows, int64_t cols, const uint8_t* bytes,
                                 std::size_t nbytes, const ScaleBlocks* scales,
                                 uint64_t split_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!has_gpu_kernel(type)) {
      fail(ErrorKind::Unsupported, "no GPU kernel for " + dtype_name(type) +
                                       " weights yet (GPU kernels: " + gpu_kernel_type_names() + ")");
    }
    if (rows <= 0 || cols <= 0) fail(ErrorKind::InvalidArgument, "a GPU matrix needs rows > 0 and cols > 0");
    const std::size_t rb = row_bytes(type, cols);  // throws unless cols is whole blocks
    if (nbytes != rb * static_cast<std::size_t>(rows)) {
      fail(ErrorKind::InvalidArgument,
           dtype_name(type) + " weights of " + std::to_string(rows) + " x " + std::to_string(cols) +
               " are " + std::to_string(rb * static_cast<std::size_t>(rows)) + " bytes, got " +
               std::to_string(nbytes));
    }
    const uint64_t limit = std::min({ctx_->info.max_storage_binding_size,
                                      ctx_->info.max_buffer_size, kMaxSplit});
    if (split_bytes == 0) split_bytes = limit;
    if (split_bytes > limit) {
      fail(ErrorKind::InvalidArgument, "GPU split size " + std::to_string(split_bytes) +
                                           " bytes is above the adapter's binding limit (" +
                                           std::to_string(limit) + ")");
    }
    int64_t per_chunk = rows_per_chunk(rb, split_bytes);
    uint64_t total = nbytes;
    // F8_E4M3: bytes of one row of scales (a chunk of n rows uses at most
    // (n - 1) / block_rows + 2 of them, which must fit the split size too)
    const uint64_t scale_row_bytes =
        scales == nullptr ? 0 : 4 * static_cast<uint64_t>((cols + scales->block_cols - 1) / scales->block_cols);
    if (scales != nullptr) {
      while (per_chunk > 1 && static_cast<uint64_t>((per_chunk - 1) / scales->block_rows + 2) *
                                      scale_row_bytes > split_bytes) {
        per_chunk /= 2;
      }
      if (scale_row_bytes > split_bytes) {
        fail(ErrorKind::InvalidArgument, "one row of F8_E4M3 block scales is " +
                                             std::to_string(scale_row_bytes) +
                                             " bytes, more than the GPU split size");
      }
      for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {  // as the chunks below will hold them
        const int64_t last = std::min(r0 + per_chunk, rows) - 1;
        total += static_cast<uint64_t>(last / scales->block_rows - r0 / scales->block_rows + 1) *
                 scale_row_bytes;
      }
    }
    if (ctx_->memory_budget != 0 && ctx_->resident + total > ctx_->memory_budget) {
      fail(ErrorKind::InvalidArgument,
           "uploading " + std::to_string(total) + " bytes of weights would pass the GPU memory "
           "budget (" + std::to_string(ctx_->resident.load()) + " of " +
           std::to_string(ctx_->memory_budget) + " bytes in use)");
    }
    auto m = std::make_unique<WebGpuMatrix>(ctx_, type, rows, cols);
    for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
      Chunk c;
      c.row0 = r0;
      c.rows = std::min(per_chunk, rows - r0);
      c.bytes = rb * static_cast<uint64_t>(c.rows);
      c.weights = ctx_->create_buffer(c.bytes, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst,
                                      "colibri weights");
      m->chunks_.push_back(c);  // owned by m from here: released if a later step throws
      ctx_->resident += c.bytes;
      ctx_->write_buffer(c.weights, bytes + rb * static_cast<std::size_t>(r0), c.bytes);
      if (scales != nullptr) {  // scale rows row0 / block_rows .. (last row) / block_rows
        const int64_t first = r0 / scales->block_rows;
        const int64_t count = (r0 + c.rows - 1) / scales->block_rows - first + 1;
        const uint64_t sbytes = static_cast<uint64_t>(count) * scale_row_bytes;
        Chunk& owned = m->chunks_.back();
        owned.scales = ctx_->create_buffer(sbytes, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst,
                                           "colibri scales");
        owned.scale_bytes = sbytes;  // counted once it exists, as the weights above
        ctx_->resident += sbytes;
        ctx_->write_buffer(owned.scales,
                           reinterpret_cast<const uint8_t*>(scales->data) +
                               static_cast<uint64_t>(first) * scale_row_bytes,
                           owned.scale_bytes);
      }
      const auto [nx_rows, ny_rows] = grid(static_cast<uint64_t>(c.rows),
                                           ctx_->info.max_workgroups_per_dimension);
      const auto [nx_el, ny_el] = grid((static_cast<uint64_t>(c.rows) * cols + kMatvecWorkgroup - 1) /
                                           kMatvecWorkgroup,
                                       ctx_->info.max_workgroups_per_dimension);
      (void)ny_rows;
      (void)ny_el;
      const Params p{static_cast<uint32_t>(c.rows), static_cast<uint32_t>(cols),
                     static_cast<uint32_t>(r0), static_cast<uint32_t>(rb), nx_rows, nx_el,
                     scales != nullptr ? static_cast<uint32_t>(scales->block_rows) : 0,
                     scales != nullptr ? static_cast<uint32_t>(scales->block_cols) : 0};
      m->chunks_.back().params = ctx_->create_buffer(
          sizeof p, WGPUBufferUsage_Uniform | WGPUBufferUsage_CopyDst, "colibri params");
      ctx_->write_buffer(m->chunks_.back().params, &p, sizeof p);
    }
    ctx_->check("uploading weights");
    return m;
  }

 public:
  void matvec(const Matrix& w, const float* x, float* y) override {
    run(as_webgpu(w), x, y, /*dequant=*/false);
  }

  void dequantize(const Matrix& w, float* out) override {
    run(as_webgpu(w), nullptr, out, /*dequant=*/true);
  }

 private:
  const WebGpuMatrix& as_webgpu(const Matrix& w) const {
    const auto* m = dynamic_cast<const WebGpuMatrix*>(&w);
    if (m == nullptr || m->ctx_ != ctx_) {
      fail(ErrorKind::InvalidArgument, "the matrix was uploaded to another GPU device");
    }
    return *m;
  }

  // The lattice table `type`'s shader reads at kAuxBinding, uploaded on first use and kept
  // for the device's life; nullptr for a type without one.
  WGPUBuffer table(DType type) {
    const std::vector<uint32_t>& words = shader_table(type);
    if (words.empty()) return nullptr;
    auto it = tables_.find(type);
    if (it != tables_.end()) return it->second;
    const uint64_t size = 4 * static_cast<uint64_t>(words.size());
    WGPUBuffer b = ctx_->create_buffer(size, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst,
                                       "colibri lattice");
    tables_.emplace(type, b);
    ctx_->write_buffer(b, words.data(), size);
    return b;
  }

  // The (matvec, dequant) pipelines of `type`, compiled on first use.
  std::pair<WGPUComputePipeline, WGPUComputePipeline> pipelines(DType type) {
    auto it = pipelines_.find(type);
    if (it != pipelines_.end()) return it->second;
    const Api& api = *ctx_->api;
    const std::string source = matvec_shader(type);
    WGPUShaderSourceWGSL wgsl = WGPU_SHADER_SOURCE_WGSL_INIT;
    wgsl.code = WGPUStringView{source.data(), source.size()};
    WGPUShaderModuleDescriptor sd = WGPU_SHADER_MODULE_DESCRIPTOR_INIT;
    sd.nextInChain = &wgsl.chain;
    WGPUShaderModule module = api.wgpuDeviceCreateShaderModule(ctx_->device, &sd);
    Cleanup cleanup;
    if (module != nullptr) cleanup.add([&] { api.wgpuShaderModuleRelease(module); });
    ctx_->check("compiling a shader");
    auto make = [&](const char* entry) {
      WGPUComputePipelineDescriptor pd = WGPU_COMPUTE_PIPELINE_DESCRIPTOR_INIT;
      pd.compute.module = module;
      pd.compute.entryPoint = WGPUStringView{entry, WGPU_STRLEN};
      return api.wgpuDeviceCreateComputePipeline(ctx_->device, &pd);
    };
    std::pair<WGPUComputePipeline, WGPUComputePipeline> both{make("matvec"), make("dequant")};
    try {
      ctx_->check("creating a pipeline");
    } catch (...) {
      if (both.first != nullptr) api.wgpuComputePipelineRelease(both.first);
      if (both.second != nullptr) api.wgpuComputePipelineRelease(both.second);
      throw;
    }
    pipelines_.emplace(type, both);
    return both;
  }

  void run(const WebGpuMatrix& m, const float* x, float* out, bool dequant) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Api& api = *ctx_->api;
    const uint64_t out_elems = static_cast<uint64_t>(m.rows_) * (dequant ? m.cols_ : 1);
    const uint64_t out_bytes = out_elems * 4;
    const uint64_t in_bytes = static_cast<uint64_t>(m.cols_) * 4;
    if (out_bytes > ctx_->info.max_storage_binding_size || in_bytes > ctx_->info.max_storage_binding_size) {
      fail(ErrorKind::InvalidArgument, "a GPU input or output vector is larger than one binding");
    }
    const auto [mv, dq] = pipelines(m.type_);
    WGPUComputePipeline pipeline = dequant ? dq : mv;

    Cleanup cleanup;
    auto buffer = [&](uint64_t size, WGPUBufferUsage usage, const char* label) {
      WGPUBuffer b = ctx_->create_buffer(size, usage, label);
      cleanup.add([&api, b] { api.wgpuBufferRelease(b); });
      return b;
    };
    // x is bound even by dequant (every entry point shares one layout); a dummy there.
    WGPUBuffer xb = buffer(dequant ? 4 : in_bytes, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst, "colibri x");
    if (!dequant) ctx_->write_buffer(xb, x, in_bytes);
    WGPUBuffer yb = buffer(out_bytes, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "colibri y");
    WGPUBuffer rb = buffer(out_bytes, WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst, "colibri readback");

    WGPUBindGroupLayout layout = api.wgpuComputePipelineGetBindGroupLayout(pipeline, 0);
    cleanup.add([&api, layout] { api.wgpuBindGroupLayoutRelease(layout); });
    WGPUCommandEncoder encoder = api.wgpuDeviceCreateCommandEncoder(ctx_->device, nullptr);
    cleanup.add([&api, encoder] { api.wgpuCommandEncoderRelease(encoder); });
    WGPUComputePassEncoder pass = api.wgpuCommandEncoderBeginComputePass(encoder, nullptr);
    cleanup.add([&api, pass] { api.wgpuComputePassEncoderRelease(pass); });
    api.wgpuComputePassEncoderSetPipeline(pass, pipeline);
    WGPUBuffer lattice = table(m.type_);
    for (const Chunk& c : m.chunks_) {
      WGPUBindGroupEntry entries[5] = {};
      entries[0] = {nullptr, 0, c.weights, 0, (c.bytes + 3) & ~uint64_t{3}, nullptr, nullptr};
      entries[1] = {nullptr, 1, xb, 0, WGPU_WHOLE_SIZE, nullptr, nullptr};
      entries[2] = {nullptr, 2, yb, 0, WGPU_WHOLE_SIZE, nullptr, nullptr};
      entries[3] = {nullptr, 3, c.params, 0, kParamsBytes, nullptr, nullptr};
      WGPUBindGroupDescriptor bd = WGPU_BIND_GROUP_DESCRIPTOR_INIT;
      bd.layout = layout;
      bd.entryCount = 4;
      WGPUBuffer aux = c.scales != nullptr ? c.scales : lattice;
      if (aux != nullptr) {
        entries[4] = {nullptr, kAuxBinding, aux, 0, WGPU_WHOLE_SIZE, nullptr, nullptr};
        bd.entryCount = 5;
      }
      bd.entries = entries;
      WGPUBindGroup group = api.wgpuDeviceCreateBindGroup(ctx_->device, &bd);
      cleanup.add([&api, group] { api.wgpuBindGroupRelease(group); });
      api.wgpuComputePassEncoderSetBindGroup(pass, 0, group, 0, nullptr);
      const uint64_t groups = dequant ? (static_cast<uint64_t>(c.rows) * m.cols_ + kMatvecWorkgroup - 1) /
                                            kMatvecWorkgroup
                                      : static_cast<uint64_t>(c.rows);
      const auto [gx, gy] = grid(groups, ctx_->info.max_workgroups_per_dimension);
      api.wgpuComputePassEncoderDispatchWorkgroups(pass, gx, gy, 1);
    }
    api.wgpuComputePassEncoderEnd(pass);
    api.wgpuCommandEncoderCopyBufferToBuffer(encoder, yb, 0, rb, 0, (out_bytes + 3) & ~uint64_t{3});
    WGPUCommandBuffer commands = api.wgpuCommandEncoderFinish(encoder, nullptr);
    cleanup.add([&api, commands] { api.wgpuCommandBufferRelease(commands); });
    ctx_->check(dequant ? "recording a dequantization" : "recording a matvec");
    api.wgpuQueueSubmit(ctx_->queue, 1, &commands);
    ctx_->read_buffer(rb, out, out_bytes);
  }

  std::shared_ptr<Context> ctx_;
  std::mutex mutex_;
  std::map<DType, std::pair<WGPUComputePipeline, WGPUComputePipeline>> pipelines_;
  std::map<DType, WGPUBuffer> tables_;  // lattices at kAuxBinding, one per type
};

}  // namespace

bool webgpu_compiled() { return true; }
std::string webgpu_header_version() { return COLIBRI_WGPU_NATIVE_VERSION; }

std::vector<AdapterInfo> list_webgpu_adapters(const std::string& library_path) {
  return enumerate(library_path);
}

std::unique_ptr<Device> open_webgpu_device(const std::string& library_path, int index,
                                           const RequiredLimits& need, uint64_t memory_budget) {
  auto ctx = open_context(library_path, index, need);
  ctx->memory_budget = memory_budget;
  return std::make_unique<WebGpuDevice>(std::move(ctx));
}

}  // namespace colibri::gpu
