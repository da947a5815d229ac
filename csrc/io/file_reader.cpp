#include "io/file_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.hpp"

namespace colibri {

FileSet::FileSet(const std::vector<std::string>& paths) : paths_(paths) {
  for (const auto& p : paths_) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      std::string msg = "cannot open model file '" + p + "': " + std::strerror(errno);
      for (int f : fds_) ::close(f);
      fds_.clear();
      fail(ErrorKind::Io, msg);
    }
    fds_.push_back(fd);
  }
}

FileSet::~FileSet() {
  for (int fd : fds_) ::close(fd);
}

const std::string& FileSet::path(int32_t file) const {
  if (file < 0 || static_cast<std::size_t>(file) >= paths_.size())
    fail(ErrorKind::Internal, "extent names file index " + std::to_string(file) + " of " +
                                  std::to_string(paths_.size()));
  return paths_[file];
}

uint64_t FileSet::file_size(int32_t file) const {
  path(file);  // range check
  struct stat st {};
  if (::fstat(fds_[file], &st) != 0)
    fail(ErrorKind::Io, "cannot stat '" + paths_[file] + "': " + std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

FileStamp FileSet::stamp(int32_t file) const {
  path(file);  // range check
  struct stat st {};
  if (::fstat(fds_[file], &st) != 0)
    fail(ErrorKind::Io, "cannot stat '" + paths_[file] + "': " + std::strerror(errno));
  FileStamp s;
  s.size = static_cast<uint64_t>(st.st_size);
  s.inode = static_cast<uint64_t>(st.st_ino);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return s;
}

void FileSet::read(const Extent& extent, void* dst) const {
  const std::string& p = path(extent.file);
  auto* out = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < extent.length) {
    ssize_t got = ::pread(fds_[extent.file], out + done, extent.length - done,
                          static_cast<off_t>(extent.offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(ErrorKind::Io, "read of " + std::to_string(extent.length) + " bytes at offset " +
                              std::to_string(extent.offset) + " in '" + p +
                              "' failed: " + std::strerror(errno));
    }
    if (got == 0) {
      fail(ErrorKind::Io, "short read in '" + p + "': wanted " + std::to_string(extent.length) +
                              " bytes at offset " + std::to_string(extent.offset) + ", file ends after " +
                              std::to_string(done) + " (was it truncated or replaced after loading?)");
    }
    done += static_cast<uint64_t>(got);
  }
}

}  // namespace colibri
