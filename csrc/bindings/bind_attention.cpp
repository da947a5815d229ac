// colibri._core.attention: the attention kernels on NumPy arrays, for tests and benchmarks
// (not a user API; the timing loop is colibri._bench's, csrc/bench/). Keys and values are stored at the requested KV type the way the KV
// cache stores them, then attended over; isa picks the kernels ("reference": the naive one).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "bindings/attention_args.hpp"
#include "common/errors.hpp"
#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bindings {
namespace {

using namespace attention_args;

py::array_t<float> run(const FloatArray& q, const FloatArray& k, const std::optional<FloatArray>& v, int64_t dv,
                       int64_t pos0, float scale, const std::string& kv_type, const std::optional<std::string>& isa,
                       int threads, const std::optional<IntArray>& key_index,
                       const std::optional<OffsetArray>& key_offsets, int64_t window,
                       const std::optional<FloatArray>& sinks) {
  std::unique_ptr<Call> c = prepare(q, k, v, dv, pos0, scale, kv_type, key_index, key_offsets);
  c->p.window = window;
  if (sinks) {  // the argument holds the (converted) array for the whole call
    if (sinks->ndim() != 1 || sinks->shape(0) != q.shape(1))
      fail(ErrorKind::InvalidArgument, "sinks must be one value per query head: shape (" +
                                           std::to_string(q.shape(1)) + ",)");
    c->p.sinks = sinks->data();
  }
  const std::optional<Isa> which = parse_isa(isa);
  {
    py::gil_scoped_release release;
    if (!isa) {
      ThreadPool pool(team(threads));
      std::vector<float> ws;
      attn::run(pool, c->p, ws);
    } else if (!which) {
      attn::reference(c->p);
    } else {
      ThreadPool pool(team(threads));
      std::vector<float> ws;
      attn::run_with(pool, c->p, ws, *which);
    }
  }
  return c->out;
}

}  // namespace

void bind_attention(py::module_& m) {
  py::module_ a = m.def_submodule("attention", "Attention kernels (tests and benchmarks).");
  const auto none = py::none();
  a.def("run", &run, py::arg("q"), py::arg("k"), py::arg("v") = none, py::arg("dv") = 0, py::arg("pos0") = 0,
        py::arg("scale") = 1.0f, py::arg("kv_type") = "F32", py::arg("isa") = none, py::arg("threads") = 1,
        py::arg("key_index") = none, py::arg("key_offsets") = none, py::arg("window") = 0,
        py::arg("sinks") = none,
        "out[n_queries, n_heads, dv] = softmax(scale q k^T) v, causal from pos0 (query t sees keys "
        "0..pos0+t) or over key_index[key_offsets[t]:key_offsets[t+1]]. q: [n_queries, n_heads, dk]; "
        "k: [positions, n_kv_heads, dk]; v: [positions, n_kv_heads, dv], or None for the first dv "
        "values of each key row. Keys and values are stored at kv_type first. isa: None (best), "
        "'reference' (naive, double) or an ISA name. window > 0: query t sees only the last window "
        "positions up to its own (causal only). sinks: [n_heads] logits joining each softmax's "
        "denominator.");
  a.def("workspace_floats", &attn::workspace_floats, py::arg("n_heads"), py::arg("dk"), py::arg("dv"),
        py::arg("threads"), "Most floats of working memory a run needs (the budget mirrors it).");
  a.def("block_keys", [] { return attn::kBlockKeys; });
  a.def("chunk_keys", [] { return attn::kChunkKeys; });
}

}  // namespace colibri::bindings
