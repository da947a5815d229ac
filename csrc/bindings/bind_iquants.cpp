// colibri._core.quant.iq_table: the i-quant lattice and value tables as compiled into the
// core, for tests that compare them with the gguf package (tests/kernels/test_iquants.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <string>

#include "common/errors.hpp"
#include "model/matmul.hpp"
#include "quant/iquant_grids.hpp"
#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bindings {
namespace {

py::array_t<uint8_t> bytes_of(const void* p, std::size_t n) {
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(n));
  std::memcpy(out.mutable_data(), p, n);
  return out;
}

py::array_t<uint8_t> iq_table(const std::string& name) {
  using namespace iq;
  if (name == "iq2xxs_grid") return bytes_of(kIq2xxsGrid, sizeof kIq2xxsGrid);
  if (name == "iq2xs_grid") return bytes_of(kIq2xsGrid, sizeof kIq2xsGrid);
  if (name == "iq2s_grid") return bytes_of(kIq2sGrid, sizeof kIq2sGrid);
  if (name == "iq3xxs_grid") return bytes_of(kIq3xxsGrid, sizeof kIq3xxsGrid);
  if (name == "iq3s_grid") return bytes_of(kIq3sGrid, sizeof kIq3sGrid);
  if (name == "iq1s_grid") return bytes_of(kIq1sGrid, sizeof kIq1sGrid);
  if (name == "ksigns_iq2xs") return bytes_of(kKsignsIq2xs, sizeof kKsignsIq2xs);
  if (name == "kvalues_iq4nl") return bytes_of(kKvaluesIq4nlBits, sizeof kKvaluesIq4nlBits);
  if (name == "kvalues_mxfp4") return bytes_of(kKvaluesMxfp4Bits, sizeof kKvaluesMxfp4Bits);
  fail(ErrorKind::InvalidArgument, "unknown i-quant table '" + name + "'");
}

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using ByteArray = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

WeightView fp8_view(const ByteArray& codes, const FloatArray& scales, int64_t rows, int64_t cols,
                    int64_t block_rows, int64_t block_cols) {
  if (rows <= 0 || cols <= 0 || block_rows <= 0 || block_cols <= 0)
    fail(ErrorKind::InvalidArgument, "fp8: shapes and block sizes must be positive");
  if (codes.size() != rows * cols) fail(ErrorKind::InvalidArgument, "fp8: codes must hold rows * cols bytes");
  const int64_t sr = (rows + block_rows - 1) / block_rows, sc = (cols + block_cols - 1) / block_cols;
  if (scales.size() != sr * sc)
    fail(ErrorKind::InvalidArgument, "fp8: scales must be [" + std::to_string(sr) + ", " + std::to_string(sc) + "]");
  WeightView w{DType::F8_E4M3, rows, cols, codes.data()};
  w.scales = BlockScales{scales.data(), block_rows, block_cols};
  return w;
}

// y[n, rows] = x W^T with the FP8 kernels of one ISA (None: the best).
py::array_t<float> fp8_matmul(const ByteArray& codes, const FloatArray& scales, int64_t rows, int64_t cols,
                              int64_t block_rows, int64_t block_cols, const FloatArray& x, int threads,
                              const std::optional<std::string>& isa) {
  const WeightView w = fp8_view(codes, scales, rows, cols, block_rows, block_cols);
  if (x.ndim() != 2 || x.shape(1) != cols) fail(ErrorKind::InvalidArgument, "fp8_matmul: x must be [n, cols]");
  const TypeKernels* k = &kernels(DType::F8_E4M3);
  if (isa) {
    Isa want = Isa::Scalar;
    if (*isa == "avx2") want = Isa::AVX2;
    else if (*isa == "avx512") want = Isa::AVX512;
    else if (*isa == "neon") want = Isa::NEON;
    else if (*isa != "scalar") fail(ErrorKind::InvalidArgument, "fp8 kernels: isa is scalar, avx2, avx512 or neon");
    k = kernels_for(DType::F8_E4M3, want);
    if (!k) fail(ErrorKind::Unsupported, "no " + *isa + " FP8 kernels on this CPU");
  }
  const int64_t n = x.shape(0);
  py::array_t<float> y({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(rows)});
  float* yp = y.mutable_data();
  py::gil_scoped_release nogil;
  ThreadSettings ts;
  ts.n_threads = threads;
  ThreadPool pool(ts);
  ScratchBuffer scratch;
  matmul_with(pool, *k, w, x.data(), n, yp, scratch);
  return y;
}

py::array_t<float> fp8_dequantize(const ByteArray& codes, const FloatArray& scales, int64_t rows, int64_t cols,
                                  int64_t block_rows, int64_t block_cols) {
  const WeightView w = fp8_view(codes, scales, rows, cols, block_rows, block_cols);
  std::vector<int32_t> ids(static_cast<std::size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) ids[static_cast<std::size_t>(r)] = static_cast<int32_t>(r);
  py::array_t<float> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
  get_rows(w, ids.data(), rows, out.mutable_data());
  return out;
}

}  // namespace

void bind_iquants(py::module_& m) {
  py::module_ q = m.attr("quant").cast<py::module_>();
  q.def("iq_table", &iq_table, py::arg("name"),
        "Raw bytes of a compiled i-quant table (little-endian entries, element 0 lowest).");
  q.def("fp8_matmul", &fp8_matmul, py::arg("codes"), py::arg("scales"), py::arg("rows"), py::arg("cols"),
        py::arg("block_rows"), py::arg("block_cols"), py::arg("x"), py::arg("threads") = 1, py::arg("isa") = py::none(),
        "y = x W^T for an F8_E4M3 weight with its F32 block scales; isa None: the best.");
  q.def("fp8_dequantize", &fp8_dequantize, py::arg("codes"), py::arg("scales"), py::arg("rows"), py::arg("cols"),
        py::arg("block_rows"), py::arg("block_cols"), "W as float32 (e4m3 * scale, as DeepSeek's weight_dequant).");
}

}  // namespace colibri::bindings
