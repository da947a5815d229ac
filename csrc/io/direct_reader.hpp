// Reads of expert extents into 4 KiB-aligned slabs, with O_DIRECT where the file system
// allows it. Why O_DIRECT: streamed experts are read once and then live in the expert
// cache; going through the page cache would keep a second copy of every byte read (RAM the
// budget does not see, and which evicts the cache's own pages under a memory cgroup) and
// costs an extra memory copy. Where O_DIRECT is refused (EINVAL at open or at read: some
// file systems, unusual block sizes) the reader falls back to buffered pread for that file,
// records it (stats / direct_active()), and never reports it as an error.
//
// Slab layout (the same whether a read went direct or buffered, so a caller can compute the
// data pointer before the read completes): the read covers the enclosing 4 KiB-aligned
// range [align_down(offset), align_up(offset + length)); the wanted bytes start at
// slab + data_offset(extent) = slab + (offset % 4096). The slab must hold at least
// slab_bytes(extent). Bytes of the slab outside the wanted range are unspecified.
//
// Thread safety: read() is const and may be called from many threads at once (pread on
// shared descriptors; the fallback flags are atomics).
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/file_reader.hpp"

namespace colibri {

constexpr std::size_t kDirectAlign = 4096;  // offset, length and buffer alignment for O_DIRECT

// Where the wanted bytes start inside the slab (offset % kDirectAlign).
inline std::size_t data_offset(const Extent& e) { return static_cast<std::size_t>(e.offset % kDirectAlign); }

// Bytes a slab must hold for `e`: the enclosing aligned range.
inline std::size_t slab_bytes(const Extent& e) {
  const uint64_t end = e.offset % kDirectAlign + e.length;
  return static_cast<std::size_t>((end + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
}

// Test hooks. Checked with one relaxed load per read; None in production.
enum class IoFault : int {
  None = 0,
  RefuseDirectOpen = 1,  // behave as if open(O_DIRECT) failed with EINVAL (tmpfs on old kernels)
  EinvalDirectRead = 2,  // every O_DIRECT pread fails with EINVAL (falls back at first read)
  EioOnRead = 3,         // every read fails with EIO (an Error(Io), the reader stays usable)
  SlowRead = 4,          // every read first sleeps kSlowReadDelay: a disk slower than the
                         // compute, so reads are still in flight when the compute wants them
};

// The delay of IoFault::SlowRead: long against a tiny model's compute (microseconds per
// expert), short enough that a test of a few hundred reads stays within seconds.
inline constexpr auto kSlowReadDelay = std::chrono::milliseconds(3);

// How one read went.
struct ReadOutcome {
  bool direct = false;    // the bytes came through O_DIRECT (false: buffered pread)
  bool fell_back = false; // this read disabled O_DIRECT for its file (EINVAL at read)
};

class DirectReader {
 public:
  // Opens every path buffered (through FileSet) and, when `direct`, once more with
  // O_DIRECT. EINVAL from the O_DIRECT open means "not supported here": that file is read
  // buffered. Any other open failure throws Error(Io).
  DirectReader(const std::vector<std::string>& paths, bool direct, IoFault fault = IoFault::None);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  std::size_t size() const { return files_.size(); }
  const std::string& path(int32_t file) const { return files_.path(file); }
  uint64_t file_size(int32_t file) const { return files_.file_size(file); }
  const FileSet& files() const { return files_; }

  bool direct_requested() const { return direct_requested_; }
  // Whether reads of `file` currently go through O_DIRECT (false after a fallback).
  bool direct_active(int32_t file) const;
  // Files that were asked for O_DIRECT but fell back to buffered reads (at open or read).
  uint64_t fallbacks() const { return fallbacks_.load(std::memory_order_relaxed); }

  // Reads `e` into `slab` (kDirectAlign-aligned, >= slab_bytes(e) bytes); the wanted bytes
  // land at slab + data_offset(e). Throws Error(InvalidArgument) for a misaligned or small
  // slab, Error(Io) naming file, offset and length for EIO or a short read (file truncated).
  ReadOutcome read(const Extent& e, uint8_t* slab, std::size_t capacity) const;

  void set_fault(IoFault f) { fault_.store(static_cast<int>(f), std::memory_order_relaxed); }

 private:
  void read_buffered(const Extent& e, uint8_t* slab) const;
  [[noreturn]] void fail_read(const Extent& e, int err) const;
  [[noreturn]] void fail_short(const Extent& e, uint64_t file_end) const;

  FileSet files_;
  bool direct_requested_;
  std::vector<int> direct_fds_;  // -1 where O_DIRECT is not used for that file
  // One flag per file, cleared on the first EINVAL at read; atomics because workers read
  // concurrently. unique_ptr<[]> since std::atomic is not movable (no vector of them).
  std::unique_ptr<std::atomic<bool>[]> direct_on_;
  mutable std::atomic<uint64_t> fallbacks_{0};
  std::atomic<int> fault_{0};
};

}  // namespace colibri
