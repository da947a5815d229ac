// One opened WebGPU device: the library's table, instance, adapter, device and queue,
// shared (shared_ptr) by the Device and every Matrix uploaded to it so that none outlives
// the handles it uses. Also the synchronous helpers over wgpu-native's callbacks.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/webgpu_api.hpp"

namespace colibri::gpu {

// Runs its functions in reverse order when it goes out of scope: releases the handles a
// call created, on success and on a throw alike.
class Cleanup {
 public:
  Cleanup() = default;
  Cleanup(const Cleanup&) = delete;
  Cleanup& operator=(const Cleanup&) = delete;
  ~Cleanup() {
    for (auto it = fns_.rbegin(); it != fns_.rend(); ++it) (*it)();
  }
  void add(std::function<void()> fn) { fns_.push_back(std::move(fn)); }

 private:
  std::vector<std::function<void()>> fns_;
};

struct Context {
  const Api* api = nullptr;
  WGPUInstance instance = nullptr;
  WGPUAdapter adapter = nullptr;
  WGPUDevice device = nullptr;
  WGPUQueue queue = nullptr;
  AdapterInfo info;
  // Set by the device's callbacks (uncaptured error, device lost); checked after each call.
  WGPUErrorType error_type = WGPUErrorType_NoError;
  std::string error;
  bool lost = false;
  uint64_t memory_budget = 0;  // 0: no limit
  std::atomic<uint64_t> resident{0};  // bytes of weight chunks alive

  Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context();

  // Throws the error a callback recorded since the last check: DeviceUnavailable for a
  // lost device or out of memory, Internal for a validation error (a bug here).
  void check(const char* what);
  WGPUBuffer create_buffer(uint64_t size, WGPUBufferUsage usage, const char* label);
  // Writes `n` bytes at offset 0, the tail padded with zeros to a multiple of 4.
  void write_buffer(WGPUBuffer buffer, const void* data, std::size_t n);
  // Maps `buffer` (MapRead) and copies its first `n` bytes to `out`, waiting on the device.
  void read_buffer(WGPUBuffer buffer, void* out, std::size_t n);
};

std::shared_ptr<Context> open_context(const std::string& library_path, int index,
                                      const RequiredLimits& need);
std::vector<AdapterInfo> enumerate(const std::string& library_path);

}  // namespace colibri::gpu
