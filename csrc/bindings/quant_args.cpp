// Argument handling shared by colibri._core.quant and colibri._bench (quant_args.hpp).
#include "bindings/quant_args.hpp"

#include "common/errors.hpp"

namespace py = pybind11;

namespace colibri::bindings {

Isa isa_from_name(const std::string& name) {
  for (Isa isa : kAllIsas)
    if (name == isa_name(isa)) {
      if (!isa_available(isa))
        fail(ErrorKind::Unsupported, "ISA '" + name + "' is not available on this CPU or in this build");
      return isa;
    }
  fail(ErrorKind::InvalidArgument, "unknown ISA '" + name + "' (known: scalar, avx2, avx512, neon)");
}

const TypeKernels& pick(DType type, const std::optional<std::string>& isa) {
  if (!isa) return kernels(type);
  const TypeKernels* k = kernels_for(type, isa_from_name(*isa));
  if (!k)
    fail(ErrorKind::Unsupported, "no " + *isa + " kernels for " + dtype_name(type));
  return *k;
}

ActPrecision precision_from_name(const std::string& act) {
  if (act == "int8") return ActPrecision::Int8;
  if (act == "float32") return ActPrecision::Float32;
  fail(ErrorKind::InvalidArgument, "unknown activation precision '" + act + "' (known: int8, float32)");
}

const TypeKernels& pick(DType type, const std::optional<std::string>& isa, ActPrecision precision) {
  if (isa && precision != ActPrecision::Int8)
    fail(ErrorKind::InvalidArgument, "an explicit isa needs act='int8'");
  return isa ? pick(type, isa) : kernels(type, precision);
}

PoolArg::PoolArg(const py::object& threads) {
  // isinstance finds the ThreadPool type the calling extension registered: in colibri._bench
  // a colibri._core.ThreadPool is not one (its code is the other extension's copy).
  if (py::isinstance<ThreadPool>(threads)) {
    pool = &threads.cast<ThreadPool&>();
    return;
  }
  ThreadSettings s;
  try {
    s.n_threads = threads.cast<int>();
  } catch (const py::cast_error&) {
    const py::handle type = py::type::of(threads);
    throw py::cast_error("threads: expected an int or a ThreadPool of the same extension module, got " +
                         std::string(py::str(type.attr("__module__"))) + "." +
                         std::string(py::str(type.attr("__qualname__"))));
  }
  py::gil_scoped_release nogil;
  owned = std::make_unique<ThreadPool>(s);
  pool = owned.get();
}

void check_bytes(const ByteArray& data, DType type, int64_t rows, int64_t cols) {
  if (rows < 0) fail(ErrorKind::InvalidArgument, "rows must be >= 0, got " + std::to_string(rows));
  const std::size_t need = static_cast<std::size_t>(rows) * row_bytes(type, cols);
  if (static_cast<std::size_t>(data.size()) != need)
    fail(ErrorKind::InvalidArgument, dtype_name(type) + " matrix [" + std::to_string(rows) + ", " +
                                         std::to_string(cols) + "] needs " + std::to_string(need) +
                                         " bytes, got " + std::to_string(data.size()));
}

std::pair<int64_t, int64_t> rows_cols(const FloatArray& x) {
  if (x.ndim() == 1) return {1, x.shape(0)};
  if (x.ndim() == 2) return {x.shape(0), x.shape(1)};
  fail(ErrorKind::InvalidArgument, "expected a 1-D or 2-D float32 array, got " + std::to_string(x.ndim()) + " dims");
}

WeightView weight_view(const std::string& dtype, const ByteArray& w, int64_t rows, int64_t cols, bool lanes) {
  const DType type = dtype_from_name(dtype);
  check_bytes(w, type, rows, cols);
  WeightView v{type, rows, cols, w.data()};
  v.lanes = lanes;
  return v;
}

}  // namespace colibri::bindings
