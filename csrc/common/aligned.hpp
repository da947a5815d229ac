// Aligned heap buffers: SIMD loads want 64-byte alignment and O_DIRECT wants 4 KiB.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace colibri {

struct AlignedFree {
  void operator()(void* p) const noexcept { std::free(p); }
};

template <typename T>
using AlignedPtr = std::unique_ptr<T[], AlignedFree>;

// Allocates `count` elements of T aligned to `alignment` bytes (a power of two).
template <typename T>
AlignedPtr<T> aligned_alloc_array(std::size_t count, std::size_t alignment = 64) {
  std::size_t bytes = count * sizeof(T);
  bytes = (bytes + alignment - 1) / alignment * alignment;
  if (bytes == 0) bytes = alignment;
  void* p = std::aligned_alloc(alignment, bytes);
  if (!p) throw std::bad_alloc();
  return AlignedPtr<T>(static_cast<T*>(p));
}

}  // namespace colibri
