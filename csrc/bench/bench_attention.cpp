// colibri._bench.bench_attention: the timing loop of the attention kernels (the arguments
// of colibri._core.attention.run, kept the way the KV cache keeps them).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "bindings/attention_args.hpp"
#include "common/errors.hpp"
#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bench {
namespace {

using namespace bindings::attention_args;

double bench_attention(const FloatArray& q, const FloatArray& k, const std::optional<FloatArray>& v, int64_t dv,
                       int64_t pos0, float scale, const std::string& kv_type, int threads, int iters,
                       const std::optional<std::string>& isa) {
  std::unique_ptr<Call> c = prepare(q, k, v, dv, pos0, scale, kv_type, std::nullopt, std::nullopt);
  const std::optional<Isa> which = parse_isa(isa);
  if (isa && !which) fail(ErrorKind::InvalidArgument, "bench runs the tiled kernels: isa 'reference' is not one");
  py::gil_scoped_release release;
  ThreadPool pool(team(threads));
  std::vector<float> ws;
  ThreadPool::ComputeScope scope(pool);
  auto once = [&] { which ? attn::run_with(pool, c->p, ws, *which) : attn::run(pool, c->p, ws); };
  once();  // warm-up: grows the workspace
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) once();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(iters, 1);
}

}  // namespace

void bind_bench_attention(py::module_& m) {
  const auto none = py::none();
  m.def("bench_attention", &bench_attention, py::arg("q"), py::arg("k"), py::arg("v") = none, py::arg("dv") = 0,
        py::arg("pos0") = 0, py::arg("scale") = 1.0f, py::arg("kv_type") = "F32", py::arg("threads") = 1,
        py::arg("iters") = 10, py::arg("isa") = none,
        "Seconds per colibri._core.attention.run() with the best kernels (or those of isa), iters "
        "runs inside one ComputeScope after one warm-up run.");
}

}  // namespace colibri::bench
