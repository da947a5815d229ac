// The parts of the GPU seam that need no graphics API (compiled in every build).
#include "gpu/device.hpp"

#include "common/errors.hpp"

namespace colibri::gpu {

bool has_gpu_kernel(DType type) {
  switch (type) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0:
    case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_NL: case DType::IQ4_XS: case DType::IQ2_XXS: case DType::IQ3_XXS:
    case DType::IQ3_S: case DType::MXFP4:
    case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ1_S: case DType::IQ1_M:
    case DType::F8_E4M3:
      return true;
    default:
      return false;
  }
}

std::string gpu_kernel_type_names() {
  std::string names;
  for (DType t : all_types()) {
    if (!has_gpu_kernel(t)) continue;
    if (!names.empty()) names += ", ";
    names += dtype_name(t);
  }
  return names;
}

std::unique_ptr<Matrix> Device::upload_scaled_matrix(DType type, int64_t, int64_t, const uint8_t*,
                                                     std::size_t, const ScaleBlocks&, uint64_t) {
  fail(ErrorKind::Unsupported, "this GPU device has no kernels for " + dtype_name(type) +
                                   " weights with block scales");
}

int64_t rows_per_chunk(std::size_t row_bytes, uint64_t split_bytes) {
  if (row_bytes == 0) fail(ErrorKind::InvalidArgument, "a GPU matrix needs at least one column");
  if (row_bytes > split_bytes) {
    fail(ErrorKind::InvalidArgument,
         "one row is " + std::to_string(row_bytes) + " bytes, more than the GPU split size (" +
             std::to_string(split_bytes) + " bytes): a row cannot be split across bindings");
  }
  return static_cast<int64_t>(split_bytes / row_bytes);
}

}  // namespace colibri::gpu
