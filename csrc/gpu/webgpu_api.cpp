#include "gpu/webgpu_api.hpp"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

#include "common/errors.hpp"

namespace colibri::gpu {

std::string version_text(uint32_t v) {
  return std::to_string(v >> 24) + "." + std::to_string((v >> 16) & 0xff) + "." +
         std::to_string((v >> 8) & 0xff) + "." + std::to_string(v & 0xff);
}

namespace {

std::unique_ptr<Api> load(const std::string& path) {
  if (path.empty()) fail(ErrorKind::DeviceUnavailable, "no wgpu-native library path given");
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    fail(ErrorKind::DeviceUnavailable, "cannot load the wgpu-native library " + path + ": " +
                                           (why != nullptr ? why : "unknown error"));
  }
  auto api = std::make_unique<Api>();
#define COLIBRI_WGPU_LOAD(name)                                                          \
  api->name = reinterpret_cast<decltype(api->name)>(dlsym(lib, #name));                  \
  if (api->name == nullptr)                                                              \
    fail(ErrorKind::DeviceUnavailable, path + " is not a usable wgpu-native library: no " #name);
  COLIBRI_WGPU_FUNCTIONS(COLIBRI_WGPU_LOAD)
#undef COLIBRI_WGPU_LOAD
  // The headers' structs must match the library's: refuse another major version.
  const uint32_t have = api->wgpuGetVersion();
  const std::string built = COLIBRI_WGPU_NATIVE_VERSION;
  const std::string got = version_text(have);
  if (got.substr(0, got.find('.')) != built.substr(0, built.find('.'))) {
    fail(ErrorKind::DeviceUnavailable, "wgpu-native " + got + " at " + path +
                                           ", but colibri was built against " + built +
                                           ": install the wgpu package it was built with, or "
                                           "rebuild colibri");
  }
  return api;  // `lib` stays loaded on purpose (see the header)
}

}  // namespace

const Api& load_api(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Api>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(path);
  if (it == loaded.end()) it = loaded.emplace(path, load(path)).first;
  return *it->second;
}

}  // namespace colibri::gpu
