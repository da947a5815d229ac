// colibri._core.quant: the block kernels and the threaded matmul, exposed for tests and
// benchmarks (not a user API). Every function that computes releases the GIL; bad input
// raises a colibri.errors class through colibri::Error (mapped in errors.cpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/errors.hpp"
#include "model/matmul.hpp"
#include "quant/dtype.hpp"
#include "quant/kernels.hpp"
#include "quant/lane_pack.hpp"
#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bindings {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using ByteArray = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
std::atomic<uint64_t> g_read_sink{0};
constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::AVX2, Isa::AVX512, Isa::NEON};

Isa isa_from_name(const std::string& name) {
  for (Isa isa : kAllIsas)
    if (name == isa_name(isa)) {
      if (!isa_available(isa))
        fail(ErrorKind::Unsupported, "ISA '" + name + "' is not available on this CPU or in this build");
      return isa;
    }
  fail(ErrorKind::InvalidArgument, "unknown ISA '" + name + "' (known: scalar, avx2, avx512, neon)");
}

// Kernels for a type at an ISA (None: the best available).
const TypeKernels& pick(DType type, const std::optional<std::string>& isa) {
  if (!isa) return kernels(type);
  const TypeKernels* k = kernels_for(type, isa_from_name(*isa));
  if (!k)
    fail(ErrorKind::Unsupported, "no " + *isa + " kernels for " + dtype_name(type));
  return *k;
}

// The pool argument: a _core.ThreadPool, or an int (a team of that size made for the call).
struct PoolArg {
  std::unique_ptr<ThreadPool> owned;
  ThreadPool* pool = nullptr;
  explicit PoolArg(const py::object& threads) {
    if (py::isinstance<ThreadPool>(threads)) {
      pool = &threads.cast<ThreadPool&>();
      return;
    }
    ThreadSettings s;
    s.n_threads = threads.cast<int>();
    py::gil_scoped_release nogil;
    owned = std::make_unique<ThreadPool>(s);
    pool = owned.get();
  }
};

void check_bytes(const ByteArray& data, DType type, int64_t rows, int64_t cols) {
  if (rows < 0) fail(ErrorKind::InvalidArgument, "rows must be >= 0, got " + std::to_string(rows));
  const std::size_t need = static_cast<std::size_t>(rows) * row_bytes(type, cols);
  if (static_cast<std::size_t>(data.size()) != need)
    fail(ErrorKind::InvalidArgument, dtype_name(type) + " matrix [" + std::to_string(rows) + ", " +
                                         std::to_string(cols) + "] needs " + std::to_string(need) +
                                         " bytes, got " + std::to_string(data.size()));
}

// x as [n, cols] (a 1-D array is one row).
std::pair<int64_t, int64_t> rows_cols(const FloatArray& x) {
  if (x.ndim() == 1) return {1, x.shape(0)};
  if (x.ndim() == 2) return {x.shape(0), x.shape(1)};
  fail(ErrorKind::InvalidArgument, "expected a 1-D or 2-D float32 array, got " + std::to_string(x.ndim()) + " dims");
}

py::array_t<uint8_t> quantize(const std::string& dtype, const FloatArray& x, const std::optional<std::string>& isa) {
  const DType type = dtype_from_name(dtype);
  const auto [rows, cols] = rows_cols(x);
  const QuantizeRowFn fn = isa ? pick(type, isa).quantize_row : pick(type, std::string("scalar")).quantize_row;
  if (!fn) fail(ErrorKind::Unsupported, "colibri has no quantizer for " + dtype + " yet");
  const std::size_t rb = row_bytes(type, cols);
  py::array_t<uint8_t> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(rb)});
  const float* src = x.data();
  uint8_t* dst = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    for (int64_t r = 0; r < rows; ++r) fn(src + r * cols, dst + r * rb, cols);
  }
  return out;
}

py::array_t<float> dequantize(const std::string& dtype, const ByteArray& data, int64_t rows, int64_t cols,
                              const std::optional<std::string>& isa) {
  const DType type = dtype_from_name(dtype);
  check_bytes(data, type, rows, cols);
  const TypeKernels& k = pick(type, isa);
  const std::size_t rb = row_bytes(type, cols);
  py::array_t<float> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
  const uint8_t* src = data.data();
  float* dst = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    for (int64_t r = 0; r < rows; ++r) k.dequantize_row(src + r * rb, dst + r * cols, cols);
  }
  return out;
}

float vec_dot(const std::string& dtype, const ByteArray& w, const FloatArray& x, const std::optional<std::string>& isa) {
  const DType type = dtype_from_name(dtype);
  const TypeKernels& k = pick(type, isa);
  if (!k.vec_dot) fail(ErrorKind::Unsupported, dtype + " is an activation format, not a weight type");
  if (x.ndim() != 1) fail(ErrorKind::InvalidArgument, "vec_dot: x must be 1-D");
  const int64_t n = x.shape(0);
  check_bytes(w, type, 1, n);
  std::vector<unsigned char> act(row_bytes(k.act_type, n) + 64);
  py::gil_scoped_release nogil;
  k.quantize_act(x.data(), act.data(), n);
  return k.vec_dot(n, w.data(), act.data());
}

WeightView weight_view(const std::string& dtype, const ByteArray& w, int64_t rows, int64_t cols,
                       bool lanes = false) {
  const DType type = dtype_from_name(dtype);
  check_bytes(w, type, rows, cols);
  WeightView v{type, rows, cols, w.data()};
  v.lanes = lanes;
  return v;
}

// The row-lane layout of rows x cols `dtype` bytes (quant/lane_pack.hpp), or back (unpack).
py::array_t<uint8_t> pack_lanes_py(const std::string& dtype, const ByteArray& data, int64_t rows, int64_t cols,
                                   bool unpack) {
  const DType type = dtype_from_name(dtype);
  check_bytes(data, type, rows, cols);
  if (!lane_packable(type) || rows % kLaneRows != 0)
    fail(ErrorKind::InvalidArgument, "pack_lanes: " + dtype + " x " + std::to_string(rows) +
                                         " rows has no row-lane layout (Q4_1 / Q8_0, rows a multiple of 8)");
  const std::size_t rb = row_bytes(type, cols);
  py::array_t<uint8_t> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(rb)});
  uint8_t* dst = out.mutable_data();
  py::gil_scoped_release nogil;
  if (unpack)
    unpack_lane_rows(type, data.data(), cols, 0, rows, dst);
  else
    pack_lanes(type, data.data(), dst, rows, cols);
  return out;
}

ActPrecision precision_from_name(const std::string& act) {
  if (act == "int8") return ActPrecision::Int8;
  if (act == "float32") return ActPrecision::Float32;
  fail(ErrorKind::InvalidArgument, "unknown activation precision '" + act + "' (known: int8, float32)");
}

py::array_t<float> matmul(const std::string& dtype, const ByteArray& w, int64_t rows, int64_t cols,
                          const FloatArray& x, const py::object& threads, const std::optional<std::string>& isa,
                          const std::string& act, bool lanes) {
  const WeightView wv = weight_view(dtype, w, rows, cols, lanes);
  const ActPrecision precision = precision_from_name(act);
  if (isa && precision != ActPrecision::Int8)
    fail(ErrorKind::InvalidArgument, "matmul: an explicit isa needs act='int8'");
  const TypeKernels& k = isa ? pick(wv.type, isa) : kernels(wv.type, precision);
  const auto [n, xc] = rows_cols(x);
  if (xc != cols)
    fail(ErrorKind::InvalidArgument, "matmul: x has " + std::to_string(xc) + " columns, W has " + std::to_string(cols));
  PoolArg pool(threads);
  py::array_t<float> y({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(rows)});
  float* yp = y.mutable_data();
  py::gil_scoped_release nogil;
  ScratchBuffer scratch;
  matmul_with(*pool.pool, k, wv, x.data(), n, yp, scratch);
  return y;
}

py::list matmul_multi(const std::vector<std::tuple<std::string, ByteArray, int64_t>>& ws, int64_t cols,
                      const FloatArray& x, const py::object& threads, const std::vector<bool>& lanes) {
  if (!lanes.empty() && lanes.size() != ws.size())
    fail(ErrorKind::InvalidArgument, "matmul_multi: lanes needs one flag per weight");
  const auto [n, xc] = rows_cols(x);
  if (xc != cols)
    fail(ErrorKind::InvalidArgument, "matmul_multi: x has " + std::to_string(xc) + " columns, not " + std::to_string(cols));
  std::vector<WeightView> views;
  std::vector<py::array_t<float>> ys;
  std::vector<float*> outs;
  for (const auto& [dtype, bytes, rows] : ws) {
    views.push_back(weight_view(dtype, bytes, rows, cols, !lanes.empty() && lanes[views.size()]));
    ys.emplace_back(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(rows)});
    outs.push_back(ys.back().mutable_data());
  }
  PoolArg pool(threads);
  {
    py::gil_scoped_release nogil;
    ScratchBuffer scratch;
    matmul_multi(*pool.pool, views.data(), outs.data(), static_cast<int>(views.size()), x.data(), n, scratch);
  }
  py::list out;
  for (auto& y : ys) out.append(y);
  return out;
}

py::array_t<float> get_rows_py(const std::string& dtype, const ByteArray& w, int64_t rows, int64_t cols,
                               const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& ids,
                               bool lanes) {
  const WeightView wv = weight_view(dtype, w, rows, cols, lanes);
  const int64_t n = ids.size();
  py::array_t<float> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(cols)});
  float* op = out.mutable_data();
  py::gil_scoped_release nogil;
  get_rows(wv, ids.data(), n, op);
  return out;
}

// Times `iters` matmuls inside one ComputeScope (like consecutive layers of a forward
// pass, so the team does not park between them). Returns seconds per iteration.
std::vector<double> bench_matmul(const std::string& dtype, const ByteArray& w, int64_t rows, int64_t cols,
                                 const FloatArray& x, const py::object& threads, int iters,
                                 const std::optional<std::string>& isa, bool lanes) {
  const WeightView wv = weight_view(dtype, w, rows, cols, lanes);
  const TypeKernels& k = pick(wv.type, isa);
  const auto [n, xc] = rows_cols(x);
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
    views.push_back(weight_view(dtype, bytes, rows, cols));
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

void bind_quant(py::module_& m) {
  py::module_ q = m.def_submodule("quant", "Block kernels and matmul (tests and benchmarks).");
  const auto none = py::none();
  q.def("isa_names", [] {
    std::vector<std::string> v;
    for (Isa isa : kAllIsas) v.push_back(isa_name(isa));
    return v;
  }, "Every ISA name the dispatcher knows.");
  q.def("available_isas", [] {
    std::vector<std::string> v;
    for (Isa isa : kAllIsas)
      if (isa_available(isa)) v.push_back(isa_name(isa));
    return v;
  }, "ISAs compiled in and supported by this CPU (scalar first).");
  q.def("best_isa", [] { return std::string(isa_name(best_isa())); });
  q.def("has_kernels", [](const std::string& dtype, const std::string& isa) {
    return kernels_for(dtype_from_name(dtype), isa_from_name(isa)) != nullptr;
  }, py::arg("dtype"), py::arg("isa"));
  q.def("act_type", [](const std::string& dtype) { return dtype_name(kernels(dtype_from_name(dtype)).act_type); },
        py::arg("dtype"), "The activation format the dtype's dot product consumes.");
  q.def("type_info", [](const std::string& dtype) {
    const DType t = dtype_from_name(dtype);
    const TypeTraits& tr = type_traits(t);
    py::dict d;
    d["name"] = tr.name;
    d["id"] = static_cast<int>(t);
    d["block_size"] = tr.block_size;
    d["type_size"] = tr.type_size;
    d["implemented"] = tr.implemented;
    return d;
  }, py::arg("dtype"));
  q.def("type_names", [](const std::optional<std::string>& role) {
    if (role && *role != type_role_name(TypeRole::Weight) && *role != type_role_name(TypeRole::Activation) &&
        *role != type_role_name(TypeRole::ScaledWeight))
      fail(ErrorKind::InvalidArgument, "unknown type role '" + *role + "' (known: weight, activation, scaled_weight)");
    std::vector<std::string> v;
    for (DType t : all_types()) {
      const TypeTraits& tr = type_traits(t);
      if (!role || *role == type_role_name(tr.role)) v.push_back(tr.name);
    }
    return v;
  }, py::arg("role") = none,
     "Every tensor type the core knows, in its table's order (the weight types first); role: "
     "only those of that role ('weight': stored in model files, 'activation', 'scaled_weight').");
  q.def("row_bytes", [](const std::string& dtype, int64_t n) { return row_bytes(dtype_from_name(dtype), n); },
        py::arg("dtype"), py::arg("n"));
  q.def("quantize", &quantize, py::arg("dtype"), py::arg("x"), py::arg("isa") = none,
        "float32 [rows, cols] -> uint8 [rows, row_bytes]. isa=None: the scalar reference "
        "(byte-identical to ggml); an ISA name: that ISA's quantizer.");
  q.def("dequantize", &dequantize, py::arg("dtype"), py::arg("data"), py::arg("rows"), py::arg("cols"),
        py::arg("isa") = none, "uint8 bytes -> float32 [rows, cols]; isa=None: the best ISA.");
  q.def("vec_dot", &vec_dot, py::arg("dtype"), py::arg("w"), py::arg("x"), py::arg("isa") = none,
        "dot(one weight row, x): x is quantized to the act type with that ISA's quantizer.");
  q.def("matmul", &matmul, py::arg("dtype"), py::arg("w"), py::arg("rows"), py::arg("cols"), py::arg("x"),
        py::arg("threads") = 1, py::arg("isa") = none, py::arg("act") = "int8", py::arg("lanes") = false,
        "y[n, rows] = x[n, cols] W^T. threads: a team size or a _core.ThreadPool. act: 'int8' "
        "(quantized activations, integer dots) or 'float32' (dequantized rows, float dots). "
        "lanes: w is in the row-lane layout (pack_lanes).");
  q.def("matmul_multi", &matmul_multi, py::arg("weights"), py::arg("cols"), py::arg("x"), py::arg("threads") = 1,
        py::arg("lanes") = std::vector<bool>{},
        "weights: [(dtype, bytes, rows)] sharing x; one region; returns a list of y. lanes: per "
        "weight, whether it is in the row-lane layout (default none).");
  q.def("get_rows", &get_rows_py, py::arg("dtype"), py::arg("w"), py::arg("rows"), py::arg("cols"),
        py::arg("ids"), py::arg("lanes") = false,
        "Embedding lookup: dequantized rows ids -> float32 [len(ids), cols].");
  q.def("pack_lanes", &pack_lanes_py, py::arg("dtype"), py::arg("data"), py::arg("rows"), py::arg("cols"),
        py::arg("unpack") = false,
        "uint8 [rows, row_bytes] in the row-lane layout the AVX-512 Q4_1 / Q8_0 kernels read "
        "(rows a multiple of 8); unpack=True: back to the ordinary layout.");
  q.def("bench_matmul", &bench_matmul, py::arg("dtype"), py::arg("w"), py::arg("rows"), py::arg("cols"),
        py::arg("x"), py::arg("threads") = 1, py::arg("iters") = 10, py::arg("isa") = none,
        py::arg("lanes") = false, "Seconds per matmul, iters of them inside one ComputeScope.");
  q.def("bench_sequence", &bench_sequence, py::arg("weights"), py::arg("threads") = 1, py::arg("iters") = 10,
        "weights: [(dtype, bytes, rows, cols)]; seconds per pass of one-token matmuls over all of "
        "them in order (a decode step's weight traffic), iters passes in one ComputeScope.");
  q.def("read_bandwidth", &read_bandwidth, py::arg("buf"), py::arg("threads") = 1, py::arg("iters") = 5,
        py::arg("prefetch") = false,
        "Seconds per full read of buf (a native read kernel), for bandwidth references.");
}

}  // namespace colibri::bindings
