#include "io/direct_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include "common/errors.hpp"

namespace colibri {

namespace {

std::string range_text(const Extent& e) {
  return std::to_string(e.length) + " bytes at offset " + std::to_string(e.offset);
}

}  // namespace

DirectReader::DirectReader(const std::vector<std::string>& paths, bool direct, IoFault fault)
    : files_(paths), direct_requested_(direct), direct_on_(new std::atomic<bool>[paths.size()]) {
  fault_.store(static_cast<int>(fault), std::memory_order_relaxed);
  direct_fds_.assign(paths.size(), -1);
  for (std::size_t i = 0; i < paths.size(); ++i) {
    direct_on_[i].store(false, std::memory_order_relaxed);
    if (!direct) continue;
    int fd = -1;
    int err = EINVAL;
    if (fault != IoFault::RefuseDirectOpen) {
      fd = ::open(paths[i].c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      err = errno;
    }
    if (fd >= 0) {
      direct_fds_[i] = fd;
      direct_on_[i].store(true, std::memory_order_relaxed);
    } else if (err == EINVAL) {
      // The file system does not do O_DIRECT (tmpfs before Linux 6.6, some FUSE and
      // network mounts): a supported configuration, read this file buffered.
      fallbacks_.fetch_add(1, std::memory_order_relaxed);
    } else {
      for (int f : direct_fds_)
        if (f >= 0) ::close(f);
      fail(ErrorKind::Io, "cannot open model file '" + paths[i] + "' for direct I/O: " + std::strerror(err));
    }
  }
}

DirectReader::~DirectReader() {
  for (int fd : direct_fds_)
    if (fd >= 0) ::close(fd);
}

bool DirectReader::direct_active(int32_t file) const {
  files_.path(file);  // range check
  return direct_fds_[file] >= 0 && direct_on_[file].load(std::memory_order_relaxed);
}

void DirectReader::fail_read(const Extent& e, int err) const {
  fail(ErrorKind::Io, "read of " + range_text(e) + " in '" + files_.path(e.file) + "' failed: " + std::strerror(err));
}

void DirectReader::fail_short(const Extent& e, uint64_t read_end) const {
  // The file's size now (fstat), not where this read stopped: it may end well before.
  struct stat st {};
  const std::string end = ::fstat(files_.fd(e.file), &st) == 0 ? "ends after " + std::to_string(st.st_size) + " bytes"
                                                                : "ends before byte " + std::to_string(read_end);
  fail(ErrorKind::Io, "short read in '" + files_.path(e.file) + "': wanted " + range_text(e) + ", the file " + end +
                          " (was it truncated or replaced after loading?)");
}

void DirectReader::read_buffered(const Extent& e, uint8_t* slab) const {
  // FileSet::read loops over partial reads and turns EOF / errors into Error(Io) naming the
  // file and the range; the bytes go where a direct read would put them.
  files_.read(e, slab + data_offset(e));
}

ReadOutcome DirectReader::read(const Extent& e, uint8_t* slab, std::size_t capacity) const {
  files_.path(e.file);  // range check (Error(Internal) on a bad index)
  if (reinterpret_cast<uintptr_t>(slab) % kDirectAlign != 0)
    fail(ErrorKind::InvalidArgument, "read slab is not " + std::to_string(kDirectAlign) + "-byte aligned");
  if (e.offset > (UINT64_MAX >> 2) || e.length > (UINT64_MAX >> 2))
    fail(ErrorKind::InvalidArgument, "extent of " + range_text(e) + " overflows");
  if (capacity < slab_bytes(e))
    fail(ErrorKind::InvalidArgument, "read slab of " + std::to_string(capacity) + " bytes cannot hold " +
                                         range_text(e) + " (needs " + std::to_string(slab_bytes(e)) + ")");
  const auto fault = static_cast<IoFault>(fault_.load(std::memory_order_relaxed));
  if (fault == IoFault::EioOnRead) fail_read(e, EIO);
  if (fault == IoFault::SlowRead) std::this_thread::sleep_for(kSlowReadDelay);
  const int fd = direct_fds_[e.file];
  const bool direct = fd >= 0 && direct_on_[e.file].load(std::memory_order_relaxed);
  if (e.length == 0) return {direct, false};  // nothing to read; counted as the file's mode
  if (!direct) {
    read_buffered(e, slab);
    return {};
  }

  const uint64_t base = e.offset - e.offset % kDirectAlign;
  const std::size_t want_end = data_offset(e) + e.length;  // slab bytes that must be filled
  const std::size_t span = slab_bytes(e);
  std::size_t done = 0;
  while (done < want_end) {
    ssize_t got;
    if (fault == IoFault::EinvalDirectRead) {
      got = -1;
      errno = EINVAL;
    } else {
      got = ::pread(fd, slab + done, span - done, static_cast<off_t>(base + done));
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL) {
        // The open was accepted but reads are refused (a logical block size above 4 KiB,
        // a file system that checks only at read). Switch this file to buffered for good;
        // only the thread that flips the flag counts the fallback.
        bool expected = true;
        const bool flipped = direct_on_[e.file].compare_exchange_strong(expected, false);
        if (flipped) fallbacks_.fetch_add(1, std::memory_order_relaxed);
        read_buffered(e, slab);
        return {false, flipped};
      }
      fail_read(e, errno);
    }
    if (got == 0) fail_short(e, base + done);
    done += static_cast<std::size_t>(got);
    if (done < want_end && done % kDirectAlign != 0) {
      // A direct read that stops mid-block has met the end of the file; a further
      // O_DIRECT read at an unaligned offset would be refused, so let the buffered path
      // finish it: it reports the short read with the exact file end.
      read_buffered(e, slab);
      return {};
    }
  }
  return {true, false};
}

}  // namespace colibri
