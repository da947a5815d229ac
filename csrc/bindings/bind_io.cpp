// Python bindings of the expert read path: colibri._core.io.ReadPool, for tests and
// benchmarks (the engine uses the C++ ReadPool directly). The Python ReadPool owns one
// aligned slab per submitted read; wait() hands that slab to numpy without a copy (the
// array's base frees it). bench() runs a read loop entirely in C++ with preallocated,
// pre-faulted slabs so a benchmark measures the disk and the pool, not Python or page
// faults. Every call that may block on I/O releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/aligned.hpp"
#include "common/errors.hpp"
#include "io/crc32.hpp"
#include "io/read_pool.hpp"
#include "model/prefetch_governor.hpp"

namespace py = pybind11;

namespace colibri::bindings {

IoFault parse_io_fault(const std::string& s) {
  if (s == "none") return IoFault::None;
  if (s == "refuse_direct_open") return IoFault::RefuseDirectOpen;
  if (s == "einval_direct_read") return IoFault::EinvalDirectRead;
  if (s == "eio") return IoFault::EioOnRead;
  if (s == "slow_read") return IoFault::SlowRead;
  fail(ErrorKind::InvalidArgument,
       "unknown I/O fault '" + s + "' (none, refuse_direct_open, einval_direct_read, eio, slow_read)");
}

namespace {

Extent make_extent(int32_t file, int64_t offset, int64_t length) {
  if (offset < 0 || length < 0)
    fail(ErrorKind::InvalidArgument, "offset and length must be >= 0, got " + std::to_string(offset) + ", " +
                                         std::to_string(length));
  Extent e;
  e.file = file;
  e.offset = static_cast<uint64_t>(offset);
  e.length = static_cast<uint64_t>(length);
  return e;
}

class PyReadPool {
 public:
  PyReadPool(const std::vector<std::string>& paths, int workers, bool direct, const std::string& fault)
      : pool_(std::make_unique<ReadPool>(paths, workers, direct, parse_io_fault(fault))) {}

  // Destroy the pool (joining workers that may still write into slabs) before the slabs.
  ~PyReadPool() { pool_.reset(); }

  ReadPool& pool() { return *pool_; }

  Ticket submit(int32_t file, int64_t offset, int64_t length, bool urgent) {
    const Extent e = make_extent(file, offset, length);
    AlignedPtr<uint8_t> slab = aligned_alloc_array<uint8_t>(slab_bytes(e), kDirectAlign);
    ReadRequest req{e, slab.get(), slab_bytes(e)};
    req.urgent = urgent;
    const Ticket t = pool_->submit(req);
    pending_.emplace(t, Pending{e, std::move(slab), false});
    return t;
  }

  py::array_t<uint8_t> wait(Ticket t) {
    auto it = pending_.find(t);
    if (it == pending_.end())
      fail(ErrorKind::InvalidArgument, "read ticket " + std::to_string(t) +
                                           " is not pending (never submitted, already waited for, or cancelled)");
    if (it->second.waiting)
      fail(ErrorKind::InvalidArgument, "read ticket " + std::to_string(t) + " is already being waited for");
    it->second.waiting = true;  // a second Python thread must not free the slab under us
    std::exception_ptr error;
    {
      py::gil_scoped_release nogil;
      try {
        pool_->wait(t);
      } catch (...) {
        error = std::current_exception();
      }
    }
    // wait() retires the ticket whether the read worked or not: the slab is ours again.
    it = pending_.find(t);
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (error) std::rethrow_exception(error);
    uint8_t* base = p.slab.release();
    py::capsule owner(base, [](void* q) { std::free(q); });
    return py::array_t<uint8_t>({static_cast<py::ssize_t>(p.extent.length)}, {py::ssize_t{1}},
                                base + data_offset(p.extent), owner);
  }

  bool cancel(Ticket t) {
    if (!pool_->cancel(t)) return false;
    pending_.erase(t);
    return true;
  }

 private:
  struct Pending {
    Extent extent;
    AlignedPtr<uint8_t> slab;
    bool waiting = false;
  };
  std::unordered_map<Ticket, Pending> pending_;  // touched with the GIL held only
  std::unique_ptr<ReadPool> pool_;
};

}  // namespace

// A read trace as columns (numpy arrays, one entry per finished read): what
// benchmarks/_iotrace.py summarizes. Shared with bind_engine.cpp (Engine.io_trace).
py::dict trace_dict(const std::vector<ReadTraceRecord>& t) {
  const auto n = static_cast<py::ssize_t>(t.size());
  py::array_t<double> submitted(n), started(n), finished(n);
  py::array_t<uint64_t> offset(n), bytes(n);
  py::array_t<int32_t> file(n);
  py::array_t<bool> urgent(n), inline_read(n), failed(n);
  for (py::ssize_t i = 0; i < n; ++i) {
    const ReadTraceRecord& r = t[static_cast<std::size_t>(i)];
    submitted.mutable_at(i) = r.submitted;
    started.mutable_at(i) = r.started;
    finished.mutable_at(i) = r.finished;
    offset.mutable_at(i) = r.offset;
    bytes.mutable_at(i) = r.bytes;
    file.mutable_at(i) = r.file;
    urgent.mutable_at(i) = r.urgent;
    inline_read.mutable_at(i) = r.inline_read;
    failed.mutable_at(i) = r.failed;
  }
  py::dict d;
  d["submitted"] = submitted;
  d["started"] = started;
  d["finished"] = finished;
  d["offset"] = offset;
  d["bytes"] = bytes;
  d["file"] = file;
  d["urgent"] = urgent;
  d["inline"] = inline_read;
  d["failed"] = failed;
  return d;
}

namespace {

py::dict stats_dict(const ReadPoolStats& s) {
  py::dict d;
  d["submitted"] = s.submitted;
  d["reads"] = s.reads;
  d["bytes"] = s.bytes;
  d["errors"] = s.errors;
  d["read_seconds"] = s.read_seconds;
  d["waits"] = s.waits;
  d["wait_seconds"] = s.wait_seconds;
  d["inline_reads"] = s.inline_reads;
  d["cancelled"] = s.cancelled;
  d["direct_reads"] = s.direct_reads;
  d["buffered_reads"] = s.buffered_reads;
  d["fallbacks"] = s.fallbacks;
  d["cap_waits"] = s.cap_waits;
  d["busy_seconds"] = s.busy_seconds;
  return d;
}

// Memory for bench_reads' slabs, allocated the way the reads land in the engine: either
// one aligned allocation per slab (4 KiB pages, like a plain buffer), or one anonymous
// mapping with MADV_HUGEPAGE, as the expert store's arena (expert_store.cpp). The two can
// differ several-fold on a virtio disk: a huge-page buffer needs far fewer segments per
// request (issue 14; docs/benchmarks.md). Pages are faulted in before the timing.
class BenchSlabs {
 public:
  BenchSlabs(std::size_t cap, int n, bool huge_pages) : cap_(cap) {
    if (huge_pages) {
      constexpr std::size_t kHuge = std::size_t{2} << 20;
      bytes_ = (cap * static_cast<std::size_t>(n) + kHuge - 1) / kHuge * kHuge;
      void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) fail(ErrorKind::InvalidArgument, "cannot map " + std::to_string(bytes_) + " bytes of slabs");
      arena_ = static_cast<uint8_t*>(p);
#if defined(MADV_HUGEPAGE)
      (void)::madvise(arena_, bytes_, MADV_HUGEPAGE);
#endif
      std::memset(arena_, 0, bytes_);
      for (int i = 0; i < n; ++i) ptrs_.push_back(arena_ + static_cast<std::size_t>(i) * cap);
    } else {
      for (int i = 0; i < n; ++i) {
        owned_.push_back(aligned_alloc_array<uint8_t>(cap, kDirectAlign));
        std::memset(owned_.back().get(), 0, cap);
        ptrs_.push_back(owned_.back().get());
      }
    }
  }
  ~BenchSlabs() {
    if (arena_) ::munmap(arena_, bytes_);
  }
  BenchSlabs(const BenchSlabs&) = delete;
  BenchSlabs& operator=(const BenchSlabs&) = delete;
  uint8_t* operator[](std::size_t i) const { return ptrs_[i]; }
  std::size_t cap() const { return cap_; }

 private:
  std::size_t cap_;
  uint8_t* arena_ = nullptr;
  std::size_t bytes_ = 0;
  std::vector<AlignedPtr<uint8_t>> owned_;
  std::vector<uint8_t*> ptrs_;
};

// Reads `length` bytes at each offset of `offsets`, keeping `in_flight` reads outstanding
// (waited for oldest first), into `n_slabs` preallocated slabs used in turn (0: one per read
// in flight; at least `in_flight`), so many distinct destinations can be read into at a low
// depth, as a decode reads into the expert cache's slots. Returns wall seconds.
double bench_reads(ReadPool& pool, int32_t file, const std::vector<int64_t>& offsets, int64_t length,
                   int in_flight, bool huge_pages, int n_slabs) {
  if (in_flight < 1) fail(ErrorKind::InvalidArgument, "in_flight must be >= 1");
  if (n_slabs < 0) fail(ErrorKind::InvalidArgument, "slabs must be >= 0");
  n_slabs = std::max(n_slabs, in_flight);
  std::size_t cap = 0;
  for (int64_t off : offsets) cap = std::max(cap, slab_bytes(make_extent(file, off, length)));
  cap = (cap + kDirectAlign - 1) / kDirectAlign * kDirectAlign;  // every slab aligned in the arena
  const BenchSlabs slabs(cap, n_slabs, huge_pages);
  std::vector<Ticket> ring(static_cast<std::size_t>(in_flight), 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t next = 0;
  try {
    for (std::size_t i = 0; i < offsets.size() + static_cast<std::size_t>(in_flight); ++i) {
      const std::size_t k = i % ring.size();
      if (ring[k] != 0) {
        const Ticket t = ring[k];
        ring[k] = 0;
        pool.wait(t);
      }
      if (next < offsets.size()) {
        // the slot ring[k] waited for is free again: the next slab in turn is never one a
        // read still outstanding writes into (n_slabs >= in_flight)
        uint8_t* dst = slabs[next % static_cast<std::size_t>(n_slabs)];
        ring[k] = pool.submit({make_extent(file, offsets[next], length), dst, cap});
        ++next;
      }
    }
  } catch (...) {
    // Reads still in flight write into our slabs: retire them before the slabs go.
    for (Ticket t : ring) {
      if (t == 0 || pool.cancel(t)) continue;
      try {
        pool.wait(t);
      } catch (...) {
      }
    }
    throw;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void bind_io(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "io", "Expert read path: O_DIRECT reads into aligned slabs and the I/O worker pool (internal).");
  m.attr("DIRECT_ALIGNMENT") = kDirectAlign;
  m.attr("MAX_WORKERS") = kMaxIoWorkers;
  m.def(
      "slab_bytes", [](int64_t offset, int64_t length) { return slab_bytes(make_extent(0, offset, length)); },
      py::arg("offset"), py::arg("length"), "Bytes of the aligned slab a read of this extent needs.");
  m.def(
      "crc32",
      [](py::buffer data, uint32_t crc, bool reference) {
        const py::buffer_info info = data.request();
        const auto* p = static_cast<const uint8_t*>(info.ptr);
        const auto n = static_cast<std::size_t>(info.size * info.itemsize);
        py::gil_scoped_release nogil;
        return reference ? crc32_reference(crc, p, n) : crc32(crc, p, n);
      },
      py::arg("data"), py::arg("crc") = 0, py::arg("reference") = false,
      "CRC-32 (zlib's polynomial) of a contiguous buffer, continuing `crc`; reference=True uses zlib "
      "only (the oracle of the folded path).");
  m.def("crc32_accelerated", &crc32_accelerated,
        "Whether crc32 folds with carry-less multiplies on this CPU.");

  py::class_<ReadQueue>(m, "ReadQueue", "The read pool's queue order (demand reads first), for tests.")
      .def(py::init<>())
      .def("push", &ReadQueue::push, py::arg("ticket"), py::arg("urgent"))
      .def("pop", [](ReadQueue& q) {
        if (q.empty()) fail(ErrorKind::InvalidArgument, "pop from an empty read queue");
        return q.pop();
      })
      .def("__len__", &ReadQueue::size);

  py::class_<PrefetchGovernor>(m, "PrefetchGovernor",
                               "The expert store's prefetch on/off rule (rolling accuracy with hysteresis), for tests.")
      .def(py::init<int, int, double, double>(), py::arg("window") = PrefetchGovernor::kWindow,
           py::arg("min_samples") = PrefetchGovernor::kMinSamples, py::arg("off_below") = PrefetchGovernor::kOffBelow,
           py::arg("on_at") = PrefetchGovernor::kOnAt)
      .def("record", &PrefetchGovernor::record, py::arg("used"))
      .def_property_readonly("active", &PrefetchGovernor::active)
      .def_property_readonly("accuracy", &PrefetchGovernor::accuracy)
      .def_property_readonly("samples", &PrefetchGovernor::samples)
      .def_property_readonly("switched_off", &PrefetchGovernor::switched_off)
      .def_property_readonly("switched_on", &PrefetchGovernor::switched_on)
      .def("reset", &PrefetchGovernor::reset);

  py::class_<PyReadPool>(m, "ReadPool",
                         "I/O worker pool over a list of files. workers=0 reads synchronously in wait(); "
                         "direct asks for O_DIRECT (falls back to buffered per file where refused). "
                         "fault is a test hook: none, refuse_direct_open, einval_direct_read, eio, slow_read.")
      .def(py::init<const std::vector<std::string>&, int, bool, const std::string&>(), py::arg("paths"),
           py::arg("workers") = 1, py::arg("direct") = true, py::arg("fault") = "none")
      .def_property_readonly("workers", [](PyReadPool& p) { return p.pool().workers(); })
      .def_property(
          "max_in_flight", [](PyReadPool& p) { return p.pool().max_in_flight(); },
          [](PyReadPool& p, int cap) { p.pool().set_max_in_flight(cap); },
          "Reads on the device at once, apart from the workers (0: no cap).")
      .def_property_readonly("direct", [](PyReadPool& p) { return p.pool().reader().direct_requested(); })
      .def("direct_active", [](PyReadPool& p, int32_t file) { return p.pool().reader().direct_active(file); },
           py::arg("file"), "Whether reads of this file currently use O_DIRECT.")
      .def("file_size", [](PyReadPool& p, int32_t file) { return p.pool().reader().file_size(file); },
           py::arg("file"))
      .def("submit", &PyReadPool::submit, py::arg("file"), py::arg("offset"), py::arg("length"),
           py::arg("urgent") = false,
           "Queue a read; returns a ticket. urgent=True: a demand read, queued ahead of every non-urgent one.")
      .def("in_flight", [](PyReadPool& p) { return p.pool().in_flight(); },
           "Reads queued or running (not finished).")
      .def(
          "wait",
          &PyReadPool::wait,
          py::arg("ticket"), "Block until this read is done; returns its bytes (numpy uint8, zero-copy).")
      .def("cancel", &PyReadPool::cancel, py::arg("ticket"),
           "Drop a read not yet started; False if running or done (then wait for it).")
      .def("done", [](PyReadPool& p, Ticket t) { return p.pool().done(t); }, py::arg("ticket"))
      .def("pending", [](PyReadPool& p) { return p.pool().pending(); })
      .def(
          "read",
          [](PyReadPool& p, int32_t file, int64_t offset, int64_t length) {
            return p.wait(p.submit(file, offset, length, true));
          },
          py::arg("file"), py::arg("offset"), py::arg("length"), "submit + wait.")
      .def("stats", [](PyReadPool& p) { return stats_dict(p.pool().stats()); })
      .def("reset_stats", [](PyReadPool& p) { p.pool().reset_stats(); })
      .def("start_trace", [](PyReadPool& p, std::size_t n) { p.pool().start_trace(n); }, py::arg("max_records"),
           "Record every read that finishes from now on (at most max_records; 0 stops); drops the old trace.")
      .def("trace", [](PyReadPool& p) { return trace_dict(p.pool().trace()); },
           "The trace so far: dict of numpy columns (submitted, started, finished: CLOCK_MONOTONIC seconds, as time.monotonic(); "
           "offset, bytes, file, urgent, inline, failed), one entry per finished read.")
      .def("set_fault", [](PyReadPool& p, const std::string& f) { p.pool().set_fault(parse_io_fault(f)); },
           py::arg("fault"))
      .def(
          "bench",
          [](PyReadPool& p, int32_t file, const std::vector<int64_t>& offsets, int64_t length, int in_flight,
             bool huge_pages, int slabs) {
            py::gil_scoped_release nogil;
            return bench_reads(p.pool(), file, offsets, length, in_flight, huge_pages, slabs);
          },
          py::arg("file"), py::arg("offsets"), py::arg("length"), py::arg("in_flight"), py::arg("hugepages") = false,
          py::arg("slabs") = 0,
          "Timed read loop in C++ (preallocated, pre-faulted slabs, `in_flight` outstanding); returns seconds. "
          "hugepages=True puts the slabs in one MADV_HUGEPAGE mapping, as the expert cache's arena; `slabs` "
          "(0: one per read in flight) destination slabs are used in turn, so many distinct pages can be read "
          "into at a low depth.")
      .def("close", [](PyReadPool& p) {
        py::gil_scoped_release nogil;
        p.pool().shutdown();
      })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyReadPool& p, py::args) {
        py::gil_scoped_release nogil;
        p.pool().shutdown();
      });
}

}  // namespace colibri::bindings
