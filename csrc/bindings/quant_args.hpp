// Argument handling shared by the quant bindings (bind_quant.cpp, in colibri._core) and
// the timing harnesses (csrc/bench/, in colibri._bench): NumPy arrays as weight views,
// ISA names as kernel tables, the `threads` argument as a compute team. Compiled into
// both extensions; bad input raises colibri::Error (InvalidArgument / Unsupported).
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "model/matmul.hpp"
#include "quant/dtype.hpp"
#include "quant/float_act.hpp"
#include "quant/kernels.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri::bindings {

using FloatArray = pybind11::array_t<float, pybind11::array::c_style | pybind11::array::forcecast>;
using ByteArray = pybind11::array_t<uint8_t, pybind11::array::c_style | pybind11::array::forcecast>;

inline constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::AVX2, Isa::AVX512, Isa::NEON};

// The ISA of this name; Unsupported when this CPU or build lacks it.
Isa isa_from_name(const std::string& name);

// Kernels for a type at an ISA (None: the best available).
const TypeKernels& pick(DType type, const std::optional<std::string>& isa);

// "int8" or "float32" (EngineConfig.activation_precision's names); InvalidArgument otherwise.
ActPrecision precision_from_name(const std::string& act);

// Kernels for a type: at an ISA (int8 activations only) or, without one, the best
// available for the activation precision.
const TypeKernels& pick(DType type, const std::optional<std::string>& isa, ActPrecision precision);

// The pool argument: a ThreadPool of the calling extension (each extension registers its
// own ThreadPool type), or an int (a team of that size made for the call).
struct PoolArg {
  std::unique_ptr<ThreadPool> owned;
  ThreadPool* pool = nullptr;
  explicit PoolArg(const pybind11::object& threads);
};

// Fails unless data holds exactly rows x cols of `type`.
void check_bytes(const ByteArray& data, DType type, int64_t rows, int64_t cols);

// x as [n, cols] (a 1-D array is one row).
std::pair<int64_t, int64_t> rows_cols(const FloatArray& x);

// rows x cols `dtype` bytes as a matmul operand (lanes: in the row-lane layout).
WeightView weight_view(const std::string& dtype, const ByteArray& w, int64_t rows, int64_t cols,
                       bool lanes = false);

}  // namespace colibri::bindings
