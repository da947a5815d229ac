// The GPU seam: what the rest of the core may ask of a GPU, with no graphics API in
// sight. WebGPU (wgpu-native, webgpu_device.cpp) is the one implementation today; a native
// Metal or CUDA path would be another class behind the same interface.
//
// Every failure is a colibri::Error: DeviceUnavailable when there is no usable GPU (the
// library cannot be loaded, no adapter, limits too small, the device lost),
// InvalidArgument for a bad call, Unsupported for a weight type with no GPU kernel yet.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quant/dtype.hpp"

namespace colibri::gpu {

// One adapter as the API reports it, and the limits the kernels depend on.
struct AdapterInfo {
  std::string name;          // "llvmpipe (LLVM 15.0.6, 256 bits)", "Apple M2", ...
  std::string vendor;        // may be empty (drivers differ)
  std::string description;   // driver description
  std::string backend;       // "vulkan", "metal", "dx12", "gl", ...
  std::string adapter_type;  // "discrete", "integrated", "cpu", "unknown"
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  uint64_t max_storage_binding_size = 0;  // bytes one shader binding may see
  uint64_t max_buffer_size = 0;           // bytes of one buffer
  uint32_t max_workgroup_storage = 0;     // bytes of workgroup memory
  uint32_t max_workgroup_invocations = 0;
  uint32_t max_workgroups_per_dimension = 0;
  uint32_t min_storage_offset_alignment = 0;
  bool shader_f16 = false;
  bool subgroups = false;
};

// The smallest limits the kernels need; an adapter below them is refused by name.
struct RequiredLimits {
  uint64_t storage_binding = 16ull << 20;  // one binding of a weight chunk
  uint32_t workgroup_storage = 1024;       // the reduction's 64 floats, with room
  uint32_t workgroup_invocations = 64;     // the matvec workgroup size
};

// A weight matrix on the device: `rows` x `cols` in its GGUF block bytes, held as chunks
// of whole rows, each within the split size (no binding sees more than that).
class Matrix {
 public:
  virtual ~Matrix() = default;
  virtual DType type() const = 0;
  virtual int64_t rows() const = 0;
  virtual int64_t cols() const = 0;
  virtual std::size_t chunks() const = 0;  // how many bindings the rows are split into
};

// The F32 block scales of an F8_E4M3 matrix (quant/fp8.hpp): S [ceil(rows / block_rows),
// ceil(cols / block_cols)], row-major, `count` floats.
struct ScaleBlocks {
  const float* data = nullptr;
  std::size_t count = 0;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const AdapterInfo& adapter() const = 0;
  virtual uint64_t resident_bytes() const = 0;  // weights uploaded and not yet freed
  // Uploads `bytes` (rows x row_bytes(type, cols)) in chunks of at most `split_bytes`
  // (0: the adapter's max storage binding size; larger is refused).
  virtual std::unique_ptr<Matrix> upload_matrix(DType type, int64_t rows, int64_t cols,
                                                const uint8_t* bytes, std::size_t nbytes,
                                                uint64_t split_bytes) = 0;
  // An F8_E4M3 matrix (`bytes`: one e4m3 code per element) with its block scales; each
  // chunk holds its rows' codes and, in a second binding, the scale rows they use. The
  // default refuses (Unsupported): a device without FP8 kernels.
  virtual std::unique_ptr<Matrix> upload_scaled_matrix(DType type, int64_t rows, int64_t cols,
                                                       const uint8_t* bytes, std::size_t nbytes,
                                                       const ScaleBlocks& scales,
                                                       uint64_t split_bytes);
  // y[rows] = W x[cols], computed on the device and read back (blocks until done). Each
  // y element is summed in one fixed order, so two runs give the same bits.
  virtual void matvec(const Matrix& w, const float* x, float* y) = 0;
  // out[rows * cols] = W as float, decoded by the same shader code the matvec uses (the
  // tests compare it with the CPU's reference dequantizer, bit for bit).
  virtual void dequantize(const Matrix& w, float* out) = 0;
};

// Weight types with a GPU matvec kernel, and the test of one.
bool has_gpu_kernel(DType type);
std::string gpu_kernel_type_names();  // "F32, F16, ..." for messages

// Rows per chunk so that one chunk's bytes stay within `split_bytes`. Throws
// InvalidArgument when a single row is larger than that.
int64_t rows_per_chunk(std::size_t row_bytes, uint64_t split_bytes);

// WebGPU through wgpu-native, loaded with dlopen from `library_path` (the Python side
// finds it in the installed `wgpu` package; the core reads no environment variable).
// Whether this build was compiled with the WebGPU headers; without them every call below
// throws DeviceUnavailable saying so.
bool webgpu_compiled();
std::string webgpu_header_version();  // the wgpu-native version the headers came with
// The adapters the library reports (Vulkan, Metal, DX12; not OpenGL), in its order.
std::vector<AdapterInfo> list_webgpu_adapters(const std::string& library_path);
// Opens the adapter at `index` in list_webgpu_adapters' order, checked against `need`.
// `memory_budget`: bytes of weights the device may hold at once (0: no limit); an upload
// past it throws InvalidArgument.
std::unique_ptr<Device> open_webgpu_device(const std::string& library_path, int index,
                                           const RequiredLimits& need, uint64_t memory_budget);

}  // namespace colibri::gpu
