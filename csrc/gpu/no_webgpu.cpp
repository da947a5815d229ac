// The WebGPU entry points of a build compiled without webgpu.h / wgpu.h (CMake found no
// `wgpu` package): the CPU path is whole, the GPU says why it is absent.
#include "common/errors.hpp"
#include "gpu/device.hpp"

namespace colibri::gpu {

namespace {
[[noreturn]] void not_built() {
  fail(ErrorKind::DeviceUnavailable,
       "this colibri build has no GPU support: the wgpu package (its webgpu.h) was not "
       "installed when it was compiled; install wgpu and rebuild colibri");
}
}  // namespace

bool webgpu_compiled() { return false; }
std::string webgpu_header_version() { return ""; }
std::vector<AdapterInfo> list_webgpu_adapters(const std::string&) { not_built(); }
std::unique_ptr<Device> open_webgpu_device(const std::string&, int, const RequiredLimits&,
                                           uint64_t) {
  not_built();
}

}  // namespace colibri::gpu
