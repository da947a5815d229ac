// Argument handling shared by colibri._core.attention (bind_attention.cpp) and its timing
// harness in colibri._bench (csrc/bench/bench_attention.cpp): NumPy queries, keys and
// values as an attn::Problem whose keys and values are stored at the KV type the way the
// KV cache stores them. Compiled into both extensions.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "quant/kernels.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri::bindings::attention_args {

using FloatArray = pybind11::array_t<float, pybind11::array::c_style | pybind11::array::forcecast>;
using IntArray = pybind11::array_t<int32_t, pybind11::array::c_style | pybind11::array::forcecast>;
using OffsetArray = pybind11::array_t<int64_t, pybind11::array::c_style | pybind11::array::forcecast>;

// K or V rows [n_positions, heads, dim] stored at `type`, one cache row per position.
struct Stored {
  std::vector<uint8_t> bytes;
  attn::KvSide side;
};

// One call's problem and the storage it points into.
struct Call {
  Stored k, v;
  std::vector<int32_t> index;
  std::vector<int64_t> offsets;
  attn::Problem p;
  pybind11::array_t<float> out;
};

std::unique_ptr<Call> prepare(const FloatArray& q, const FloatArray& k, const std::optional<FloatArray>& v,
                              int64_t dv, int64_t pos0, float scale, const std::string& kv_type,
                              const std::optional<IntArray>& key_index, const std::optional<OffsetArray>& key_offsets);

// None or "reference": no ISA (the naive kernel); otherwise the named one.
std::optional<Isa> parse_isa(const std::optional<std::string>& name);

// A spinning team of `threads`, as the attention calls use.
ThreadSettings team(int threads);

}  // namespace colibri::bindings::attention_args
