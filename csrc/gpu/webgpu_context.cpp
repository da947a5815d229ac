// Instance -> adapter -> device -> queue, synchronously: wgpu-native runs a request's
// callback from wgpuInstanceProcessEvents (or at once), so each request is followed by a
// loop over it until the callback has run.
#include "gpu/webgpu_context.hpp"

#include <cstring>

#include "common/errors.hpp"

namespace colibri::gpu {

namespace {

std::string text(WGPUStringView v) {
  if (v.data == nullptr) return {};
  return v.length == WGPU_STRLEN ? std::string(v.data) : std::string(v.data, v.length);
}

const char* backend_name(WGPUBackendType b) {
  switch (b) {
    case WGPUBackendType_Vulkan: return "vulkan";
    case WGPUBackendType_Metal: return "metal";
    case WGPUBackendType_D3D12: return "dx12";
    case WGPUBackendType_D3D11: return "dx11";
    case WGPUBackendType_OpenGL: return "gl";
    case WGPUBackendType_OpenGLES: return "gles";
    default: return "other";
  }
}

const char* adapter_type_name(WGPUAdapterType t) {
  switch (t) {
    case WGPUAdapterType_DiscreteGPU: return "discrete";
    case WGPUAdapterType_IntegratedGPU: return "integrated";
    case WGPUAdapterType_CPU: return "cpu";
    default: return "unknown";
  }
}

AdapterInfo describe(const Api& api, WGPUAdapter adapter) {
  AdapterInfo out;
  WGPUAdapterInfo info = WGPU_ADAPTER_INFO_INIT;
  if (api.wgpuAdapterGetInfo(adapter, &info) == WGPUStatus_Success) {
    out.name = text(info.device);
    out.vendor = text(info.vendor);
    out.description = text(info.description);
    out.backend = backend_name(info.backendType);
    out.adapter_type = adapter_type_name(info.adapterType);
    out.vendor_id = info.vendorID;
    out.device_id = info.deviceID;
    api.wgpuAdapterInfoFreeMembers(info);
  }
  WGPULimits limits = WGPU_LIMITS_INIT;
  if (api.wgpuAdapterGetLimits(adapter, &limits) == WGPUStatus_Success) {
    out.max_storage_binding_size = limits.maxStorageBufferBindingSize;
    out.max_buffer_size = limits.maxBufferSize;
    out.max_workgroup_storage = limits.maxComputeWorkgroupStorageSize;
    out.max_workgroup_invocations = limits.maxComputeInvocationsPerWorkgroup;
    out.max_workgroups_per_dimension = limits.maxComputeWorkgroupsPerDimension;
    out.min_storage_offset_alignment = limits.minStorageBufferOffsetAlignment;
  }
  out.shader_f16 = api.wgpuAdapterHasFeature(adapter, WGPUFeatureName_ShaderF16) != 0;
  // wgpu-native reports subgroups as its own feature; the standard name may follow.
  out.subgroups =
      api.wgpuAdapterHasFeature(adapter, WGPUFeatureName_Subgroups) != 0 ||
      api.wgpuAdapterHasFeature(adapter, static_cast<WGPUFeatureName>(WGPUNativeFeature_Subgroup)) != 0;
  return out;
}

WGPUInstance create_instance(const Api& api) {
  WGPUInstanceDescriptor desc = WGPU_INSTANCE_DESCRIPTOR_INIT;
  WGPUInstance instance = api.wgpuCreateInstance(&desc);
  if (instance == nullptr) fail(ErrorKind::DeviceUnavailable, "wgpu-native created no instance");
  return instance;
}

// Vulkan, Metal, DX12 (wgpu's "primary" backends); OpenGL is left out: it lacks what
// compute needs on many drivers, and lavapipe is reached through Vulkan.
std::vector<WGPUAdapter> adapters_of(const Api& api, WGPUInstance instance) {
  WGPUInstanceEnumerateAdapterOptions options = {};
  options.backends = WGPUInstanceBackend_Primary;
  const std::size_t n = api.wgpuInstanceEnumerateAdapters(instance, &options, nullptr);
  std::vector<WGPUAdapter> adapters(n);
  if (n > 0) adapters.resize(api.wgpuInstanceEnumerateAdapters(instance, &options, adapters.data()));
  return adapters;
}

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

void check_limits(const AdapterInfo& a, const RequiredLimits& need) {
  std::string why;
  if (a.max_storage_binding_size < need.storage_binding) {
    why = "max storage binding " + mib(a.max_storage_binding_size) + " < " +
          mib(need.storage_binding) + " needed";
  } else if (a.max_workgroup_storage < need.workgroup_storage) {
    why = "workgroup storage " + std::to_string(a.max_workgroup_storage) + " bytes < " +
          std::to_string(need.workgroup_storage) + " needed";
  } else if (a.max_workgroup_invocations < need.workgroup_invocations) {
    why = std::to_string(a.max_workgroup_invocations) + " invocations per workgroup < " +
          std::to_string(need.workgroup_invocations) + " needed";
  }
  if (!why.empty()) {
    fail(ErrorKind::DeviceUnavailable,
         "GPU adapter '" + a.name + "' (" + a.backend + ") has limits too small: " + why);
  }
}

struct DeviceRequest {
  bool done = false;
  WGPUDevice device = nullptr;
  std::string message;
};

}  // namespace

Context::~Context() {
  if (api == nullptr) return;
  if (queue != nullptr) api->wgpuQueueRelease(queue);
  if (device != nullptr) api->wgpuDeviceRelease(device);
  if (adapter != nullptr) api->wgpuAdapterRelease(adapter);
  if (instance != nullptr) api->wgpuInstanceRelease(instance);
}

void Context::check(const char* what) {
  if (lost) {
    fail(ErrorKind::DeviceUnavailable, std::string("the GPU device was lost (") + what + "): " + error);
  }
  if (error_type == WGPUErrorType_NoError) return;
  const WGPUErrorType type = error_type;
  const std::string message = error;
  error_type = WGPUErrorType_NoError;
  error.clear();
  if (type == WGPUErrorType_OutOfMemory) {
    fail(ErrorKind::DeviceUnavailable, std::string("out of GPU memory (") + what + "): " + message);
  }
  if (type == WGPUErrorType_Validation) {
    fail(ErrorKind::Internal, std::string("GPU validation error (") + what + "): " + message);
  }
  fail(ErrorKind::DeviceUnavailable, std::string("GPU error (") + what + "): " + message);
}

WGPUBuffer Context::create_buffer(uint64_t size, WGPUBufferUsage usage, const char* label) {
  WGPUBufferDescriptor desc = WGPU_BUFFER_DESCRIPTOR_INIT;
  desc.label = WGPUStringView{label, WGPU_STRLEN};
  desc.usage = usage;
  desc.size = (size + 3) & ~uint64_t{3};
  WGPUBuffer buffer = api->wgpuDeviceCreateBuffer(device, &desc);
  if (buffer == nullptr) {
    fail(ErrorKind::DeviceUnavailable, std::string("could not create a GPU buffer of ") +
                                           std::to_string(size) + " bytes (" + label + ")");
  }
  return buffer;
}

void Context::write_buffer(WGPUBuffer buffer, const void* data, std::size_t n) {
  const std::size_t whole = n & ~std::size_t{3};
  if (whole > 0) api->wgpuQueueWriteBuffer(queue, buffer, 0, data, whole);
  if (whole < n) {
    uint8_t tail[4] = {0, 0, 0, 0};
    std::memcpy(tail, static_cast<const uint8_t*>(data) + whole, n - whole);
    api->wgpuQueueWriteBuffer(queue, buffer, whole, tail, 4);
  }
}

void Context::read_buffer(WGPUBuffer buffer, void* out, std::size_t n) {
  struct Map {
    bool done = false;
    WGPUMapAsyncStatus status = WGPUMapAsyncStatus_Error;
    std::string message;
  } map;
  WGPUBufferMapCallbackInfo cb = WGPU_BUFFER_MAP_CALLBACK_INFO_INIT;
  cb.mode = WGPUCallbackMode_AllowProcessEvents;
  cb.callback = [](WGPUMapAsyncStatus status, WGPUStringView message, void* u1, void*) {
    auto* m = static_cast<Map*>(u1);
    m->status = status;
    m->message = text(message);
    m->done = true;
  };
  cb.userdata1 = &map;
  const std::size_t size = (n + 3) & ~std::size_t{3};
  api->wgpuBufferMapAsync(buffer, WGPUMapMode_Read, 0, size, cb);
  while (!map.done && !lost) {
    api->wgpuDevicePoll(device, 1, nullptr);  // waits for the submitted work
    api->wgpuInstanceProcessEvents(instance);
  }
  check("reading a result back");
  if (map.status != WGPUMapAsyncStatus_Success) {
    fail(ErrorKind::DeviceUnavailable, "could not map a GPU buffer for reading: " + map.message);
  }
  const void* src = api->wgpuBufferGetConstMappedRange(buffer, 0, size);
  if (src == nullptr) fail(ErrorKind::Internal, "a mapped GPU buffer has no range");
  std::memcpy(out, src, n);
  api->wgpuBufferUnmap(buffer);
}

std::vector<AdapterInfo> enumerate(const std::string& library_path) {
  const Api& api = load_api(library_path);
  WGPUInstance instance = create_instance(api);
  std::vector<AdapterInfo> out;
  for (WGPUAdapter a : adapters_of(api, instance)) {
    out.push_back(describe(api, a));
    api.wgpuAdapterRelease(a);
  }
  api.wgpuInstanceRelease(instance);
  return out;
}

std::shared_ptr<Context> open_context(const std::string& library_path, int index,
                                      const RequiredLimits& need) {
  auto ctx = std::make_shared<Context>();
  ctx->api = &load_api(library_path);
  const Api& api = *ctx->api;
  ctx->instance = create_instance(api);
  std::vector<WGPUAdapter> adapters = adapters_of(api, ctx->instance);
  if (adapters.empty()) {
    fail(ErrorKind::DeviceUnavailable,
         "no GPU adapter found (no Vulkan, Metal or DX12 driver: on Linux install your GPU's "
         "Vulkan driver, or Mesa's lavapipe for a software one)");
  }
  if (index < 0 || index >= static_cast<int>(adapters.size())) {
    for (WGPUAdapter a : adapters) api.wgpuAdapterRelease(a);
    fail(ErrorKind::InvalidArgument, "GPU adapter index " + std::to_string(index) + " out of range: " +
                                         std::to_string(adapters.size()) + " adapter(s) found");
  }
  for (std::size_t i = 0; i < adapters.size(); ++i) {
    if (static_cast<int>(i) != index) api.wgpuAdapterRelease(adapters[i]);
  }
  ctx->adapter = adapters[static_cast<std::size_t>(index)];
  ctx->info = describe(api, ctx->adapter);
  check_limits(ctx->info, need);

  // Ask for the adapter's own limits: WebGPU's defaults cap bindings and buffers lower.
  WGPULimits limits = WGPU_LIMITS_INIT;
  api.wgpuAdapterGetLimits(ctx->adapter, &limits);
  WGPUDeviceDescriptor desc = WGPU_DEVICE_DESCRIPTOR_INIT;
  desc.label = WGPUStringView{"colibri", WGPU_STRLEN};
  desc.requiredLimits = &limits;
  desc.uncapturedErrorCallbackInfo.callback = [](WGPUDevice const*, WGPUErrorType type,
                                                 WGPUStringView message, void* u1, void*) {
    auto* c = static_cast<Context*>(u1);
    if (c->error_type == WGPUErrorType_NoError) {  // keep the first error
      c->error_type = type;
      c->error = text(message);
    }
  };
  desc.uncapturedErrorCallbackInfo.userdata1 = ctx.get();
  desc.deviceLostCallbackInfo.mode = WGPUCallbackMode_AllowProcessEvents;
  desc.deviceLostCallbackInfo.callback = [](WGPUDevice const*, WGPUDeviceLostReason reason,
                                            WGPUStringView message, void* u1, void*) {
    if (reason == WGPUDeviceLostReason_Destroyed) return;  // our own release
    auto* c = static_cast<Context*>(u1);
    c->lost = true;
    c->error = text(message);
  };
  desc.deviceLostCallbackInfo.userdata1 = ctx.get();

  DeviceRequest request;
  WGPURequestDeviceCallbackInfo cb = WGPU_REQUEST_DEVICE_CALLBACK_INFO_INIT;
  cb.mode = WGPUCallbackMode_AllowProcessEvents;
  cb.callback = [](WGPURequestDeviceStatus status, WGPUDevice device, WGPUStringView message,
                   void* u1, void*) {
    auto* r = static_cast<DeviceRequest*>(u1);
    if (status == WGPURequestDeviceStatus_Success) r->device = device;
    r->message = text(message);
    r->done = true;
  };
  cb.userdata1 = &request;
  api.wgpuAdapterRequestDevice(ctx->adapter, &desc, cb);
  while (!request.done) api.wgpuInstanceProcessEvents(ctx->instance);
  if (request.device == nullptr) {
    fail(ErrorKind::DeviceUnavailable,
         "GPU adapter '" + ctx->info.name + "' refused a device: " + request.message);
  }
  ctx->device = request.device;
  ctx->queue = api.wgpuDeviceGetQueue(ctx->device);
  return ctx;
}

}  // namespace colibri::gpu
