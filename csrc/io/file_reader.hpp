// Positional reads of model bytes. The core reads every tensor through (file, offset,
// length) extents from the manifest; this is the one place that touches file descriptors.
// Short reads and I/O errors become colibri::Error(Io) naming the file and the range.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace colibri {

struct Extent {
  int32_t file = 0;     // index into the reader's file list
  uint64_t offset = 0;  // bytes from the start of the file
  uint64_t length = 0;  // bytes
};

// What changes when a file is written, truncated or replaced: a file whose stamp differs
// from an earlier one may hold other bytes than it did then.
struct FileStamp {
  uint64_t size = 0, inode = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileStamp& o) const {
    return size == o.size && inode == o.inode && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns;
  }
  bool operator!=(const FileStamp& o) const { return !(*this == o); }
};

class FileSet {
 public:
  explicit FileSet(const std::vector<std::string>& paths);  // opens read-only; throws Io
  ~FileSet();
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;

  std::size_t size() const { return fds_.size(); }
  const std::string& path(int32_t file) const;
  uint64_t file_size(int32_t file) const;  // at open
  FileStamp stamp(int32_t file) const;     // now (fstat of the open descriptor)
  int fd(int32_t file) const { return fds_[static_cast<std::size_t>(file)]; }

  // Reads exactly extent.length bytes into dst. Throws Error(Io) on failure or EOF.
  void read(const Extent& extent, void* dst) const;

 private:
  std::vector<std::string> paths_;
  std::vector<int> fds_;
};

}  // namespace colibri
