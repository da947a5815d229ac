// wgpu-native's C API as a table of function pointers, filled with dlopen/dlsym from a
// library path the caller gives (the core links no GPU library and reads no environment
// variable). Compiled only when CMake found webgpu.h / wgpu.h (COLIBRI_WEBGPU).
#pragma once
#include <webgpu.h>
#include <wgpu.h>

#include <string>

namespace colibri::gpu {

#define COLIBRI_WGPU_FUNCTIONS(X)                                                            \
  X(wgpuGetVersion) X(wgpuCreateInstance) X(wgpuInstanceRelease)                            \
  X(wgpuInstanceEnumerateAdapters) X(wgpuInstanceProcessEvents) X(wgpuAdapterGetInfo)        \
  X(wgpuAdapterInfoFreeMembers) X(wgpuAdapterGetLimits) X(wgpuAdapterHasFeature)             \
  X(wgpuAdapterRequestDevice) X(wgpuAdapterRelease) X(wgpuDeviceGetQueue)                    \
  X(wgpuDeviceRelease) X(wgpuDevicePoll) X(wgpuDeviceCreateBuffer)                           \
  X(wgpuDeviceCreateShaderModule) X(wgpuDeviceCreateComputePipeline)                         \
  X(wgpuDeviceCreateBindGroup) X(wgpuDeviceCreateCommandEncoder) X(wgpuQueueRelease)         \
  X(wgpuQueueWriteBuffer) X(wgpuQueueSubmit) X(wgpuBufferRelease) X(wgpuBufferDestroy)       \
  X(wgpuBufferMapAsync) X(wgpuBufferGetConstMappedRange) X(wgpuBufferUnmap)                  \
  X(wgpuShaderModuleRelease) X(wgpuComputePipelineRelease)                                   \
  X(wgpuComputePipelineGetBindGroupLayout) X(wgpuBindGroupLayoutRelease)                     \
  X(wgpuBindGroupRelease) X(wgpuCommandEncoderBeginComputePass)                              \
  X(wgpuCommandEncoderCopyBufferToBuffer) X(wgpuCommandEncoderFinish)                        \
  X(wgpuCommandEncoderRelease) X(wgpuCommandBufferRelease)                                   \
  X(wgpuComputePassEncoderSetPipeline) X(wgpuComputePassEncoderSetBindGroup)                 \
  X(wgpuComputePassEncoderDispatchWorkgroups) X(wgpuComputePassEncoderEnd)                   \
  X(wgpuComputePassEncoderRelease)

struct Api {
#define COLIBRI_WGPU_MEMBER(name) decltype(&::name) name = nullptr;
  COLIBRI_WGPU_FUNCTIONS(COLIBRI_WGPU_MEMBER)
#undef COLIBRI_WGPU_MEMBER
};

// The table for the library at `path`, loaded once per path and kept loaded for the
// process's life (wgpu-native's threads may outlive a device). Throws
// Error(DeviceUnavailable) when it cannot be loaded, lacks a function, or is a different
// major version than the headers this build was compiled with.
const Api& load_api(const std::string& path);

// "29.0.1.1" from wgpuGetVersion's packed value.
std::string version_text(uint32_t packed);

}  // namespace colibri::gpu
