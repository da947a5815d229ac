// colibri._core.quant: the block kernels and the threaded matmul, exposed for tests and
// benchmarks (not a user API; the timing loops are colibri._bench's, csrc/bench/). Every
// function that computes releases the GIL; bad input raises a colibri.errors class through
// colibri::Error (mapped in errors.cpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/quant_args.hpp"
#include "common/errors.hpp"
#include "model/matmul.hpp"
#include "quant/dtype.hpp"
#include "quant/kernels.hpp"
#include "quant/lane_pack.hpp"
#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bindings {
namespace {

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

float vec_dot(const std::string& dtype, const ByteArray& w, const FloatArray& x, const std::optional<std::string>& isa,
              const std::string& precision) {
  const DType type = dtype_from_name(dtype);
  const TypeKernels& k = pick(type, isa);
  if (!k.vec_dot) fail(ErrorKind::Unsupported, dtype + " is an activation format, not a weight type");
  if (x.ndim() != 1) fail(ErrorKind::InvalidArgument, "vec_dot: x must be 1-D");
  const int64_t n = x.shape(0);
  check_bytes(w, type, 1, n);
  if (precision_from_name(precision) == ActPrecision::Float32 && k.act_type != DType::F32) {
    // The float-activation path at this ISA: its in-register dot, or dequantize + F32 dot.
    const VecDotFn f32 = pick(DType::F32, isa).vec_dot;
    const VecDotFn fused = float_act_fused_dot(type, f32);
    std::vector<float> row(static_cast<std::size_t>(n));
    py::gil_scoped_release nogil;
    if (fused) return fused(n, w.data(), x.data());
    k.dequantize_row(w.data(), row.data(), n);
    return f32(n, row.data(), x.data());
  }
  std::vector<unsigned char> act(row_bytes(k.act_type, n) + 64);
  py::gil_scoped_release nogil;
  k.quantize_act(x.data(), act.data(), n);
  return k.vec_dot(n, w.data(), act.data());
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

py::array_t<float> matmul(const std::string& dtype, const ByteArray& w, int64_t rows, int64_t cols,
                          const FloatArray& x, const py::object& threads, const std::optional<std::string>& isa,
                          const std::string& act, bool lanes) {
  const WeightView wv = weight_view(dtype, w, rows, cols, lanes);
  const TypeKernels& k = pick(wv.type, isa, precision_from_name(act));
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
        py::arg("act") = "int8",
        "dot(one weight row, x): act 'int8' quantizes x to the act type with that ISA's quantizer; "
        "'float32' is the float-activation path at that ISA.");
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
}

}  // namespace colibri::bindings
