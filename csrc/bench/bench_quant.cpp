// colibri._bench: timing loops of the threaded matmul and a native read kernel, for
// benchmarks/bench_kernels.py and bench_tiles.py. The loops run in C++ (no Python between
// iterations) and return seconds per iteration. Every function releases the GIL while it
// times.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/quant_args.hpp"
#include "common/errors.hpp"
#include "model/matmul.hpp"
#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bench {
namespace {

using bindings::ByteArray;
using bindings::FloatArray;
using bindings::PoolArg;

std::atomic<uint64_t> g_read_sink{0};

// Times `iters` matmuls inside one ComputeScope (like consecutive layers of a forward
// pass, so the team does not park between them). Returns seconds per iteration.
std::vector<double> bench_matmul(const std::string& dtype, const ByteArray& w, int64_t rows, int64_t cols,
                                 const FloatArray& x, const py::object& threads, int iters,
                                 const std::optional<std::string>& isa, bool lanes, const std::string& act) {
  const WeightView wv = bindings::weight_view(dtype, w, rows, cols, lanes);
  const TypeKernels& k = bindings::pick(wv.type, isa, bindings::precision_from_name(act));
  const auto [n, xc] = bindings::rows_cols(x);
  if (xc != cols) fail(ErrorKind::InvalidArgument, "bench_matmul: x has the wrong number of columns");
  PoolArg pool(threads);
  std::vector<float> y(static_cast<std::size_t>(n * rows));
  std::vector<double> times;
  py::gil_scoped_release nogil;
  ScratchBuffer scratch;
  ThreadPool::ComputeScope scope(*pool.pool);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    matmul_with(*pool.pool, k, wv, x.data(), n, y.data(), scratch);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return times;
}

// Times passes over a sequence of matrices (like the layers of one decode step), each a
// one-token matmul, inside one ComputeScope. Returns seconds per pass.
std::vector<double> bench_sequence(const std::vector<std::tuple<std::string, ByteArray, int64_t, int64_t>>& ws,
                                   const py::object& threads, int iters) {
  std::vector<WeightView> views;
  int64_t max_cols = 0, max_rows = 0;
  for (const auto& [dtype, bytes, rows, cols] : ws) {
    views.push_back(bindings::weight_view(dtype, bytes, rows, cols));
    max_cols = std::max(max_cols, cols);
    max_rows = std::max(max_rows, rows);
  }
  PoolArg pool(threads);
  std::vector<float> x(static_cast<std::size_t>(max_cols), 0.5f), y(static_cast<std::size_t>(max_rows));
  std::vector<double> times;
  py::gil_scoped_release nogil;
  ScratchBuffer scratch;
  ThreadPool::ComputeScope scope(*pool.pool);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const WeightView& w : views) matmul(*pool.pool, w, x.data(), 1, y.data(), scratch);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return times;
}

// Memory-read kernel for the bandwidth reference: sums 64-bit words (the compiler
// vectorizes it), the team splitting the buffer like the matmul splits weight rows. One
// sequential stream is what hardware prefetchers handle best; `prefetch` adds the matvec
// kernels' software prefetch (16 KiB ahead into L2) for comparison (slower on Zen 4).
std::vector<double> read_bandwidth(const ByteArray& buf, const py::object& threads, int iters, bool prefetch) {
  PoolArg pool(threads);
  const uint64_t* p = reinterpret_cast<const uint64_t*>(buf.data());
  const int64_t words = buf.size() / 8;
  constexpr int64_t kChunk = 64 * 1024 / 8;
  constexpr int64_t kAhead = 16 * 1024 / 8;
  std::vector<double> times;
  py::gil_scoped_release nogil;
  ThreadPool::ComputeScope scope(*pool.pool);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.pool->parallel_for((words + kChunk - 1) / kChunk, 0, [&](int64_t b, int64_t e, int) {
      uint64_t s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const int64_t end = std::min(words, e * kChunk);
      for (int64_t j = b * kChunk; j + 8 <= end; j += 8) {
        if (prefetch) __builtin_prefetch(p + j + kAhead, 0, 2);
        for (int k = 0; k < 8; ++k) s[k] += p[j + k];
      }
      g_read_sink.fetch_add(s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7],
                            std::memory_order_relaxed);  // keeps the loads
    });
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return times;
}

}  // namespace

void bind_bench_quant(py::module_& m) {
  const auto none = py::none();
  m.def("bench_matmul", &bench_matmul, py::arg("dtype"), py::arg("w"), py::arg("rows"), py::arg("cols"),
        py::arg("x"), py::arg("threads") = 1, py::arg("iters") = 10, py::arg("isa") = none,
        py::arg("lanes") = false, py::arg("act") = "int8",
        "Seconds per matmul (as colibri._core.quant.matmul), iters of them inside one ComputeScope. "
        "threads: a team size or a colibri._bench.ThreadPool; act: the activation precision.");
  m.def("bench_sequence", &bench_sequence, py::arg("weights"), py::arg("threads") = 1, py::arg("iters") = 10,
        "weights: [(dtype, bytes, rows, cols)]; seconds per pass of one-token matmuls over all of "
        "them in order (a decode step's weight traffic), iters passes in one ComputeScope.");
  m.def("read_bandwidth", &read_bandwidth, py::arg("buf"), py::arg("threads") = 1, py::arg("iters") = 5,
        py::arg("prefetch") = false,
        "Seconds per full read of buf (a native read kernel), for bandwidth references.");
}

}  // namespace colibri::bench
