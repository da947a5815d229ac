// colibri._core.linear_attn: the delta rule of the linear-attention layers on NumPy
// arrays at a chosen ISA, and the process-wide choice of its kernels, for tests and
// benchmarks (not a user API).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/quant_args.hpp"
#include "common/errors.hpp"
#include "model/linear_attn_kernels.hpp"
#include "model/linear_attn_rules.hpp"

namespace py = pybind11;

namespace colibri::bindings {
namespace {

const linattn::Kernels& kernels(const std::optional<std::string>& isa) {
  if (!isa) return linattn::active();
  const linattn::Kernels* k = linattn::kernels_for(isa_from_name(*isa));
  if (!k) fail(ErrorKind::Unsupported, "no " + *isa + " linear-attention kernels");
  return *k;
}

// One head over n tokens: q, k (n, dk), v (n, dv), beta (n,), g (n,) or (n, dk) (a decay
// per key channel), the state S (dk, dv). Returns (outputs (n, dv), the state after).
std::pair<py::array_t<float>, py::array_t<float>> delta_rule(const FloatArray& q, const FloatArray& k,
                                                             const FloatArray& v, const FloatArray& beta,
                                                             const FloatArray& g, const FloatArray& S,
                                                             bool chunked, const std::optional<std::string>& isa) {
  if (q.ndim() != 2 || k.ndim() != 2 || v.ndim() != 2 || S.ndim() != 2)
    fail(ErrorKind::InvalidArgument, "delta_rule: q, k, v and S are 2-D");
  const int64_t n = q.shape(0), dk = q.shape(1), dv = v.shape(1);
  const bool channel = g.ndim() == 2;
  if (k.shape(0) != n || k.shape(1) != dk || v.shape(0) != n || beta.ndim() != 1 || beta.shape(0) != n ||
      g.shape(0) != n || (channel && g.shape(1) != dk) || g.ndim() > 2 || S.shape(0) != dk || S.shape(1) != dv)
    fail(ErrorKind::InvalidArgument, "delta_rule: shapes q, k (n, dk), v (n, dv), beta (n,), g (n,) or (n, dk), "
                                     "S (dk, dv)");
  const linattn::Kernels& kern = kernels(isa);
  py::array_t<float> out({n, dv});
  py::array_t<float> state({dk, dv});
  std::copy(S.data(), S.data() + dk * dv, state.mutable_data());
  // HeadRows reads q, k and v at one stride, as the layers' rows: lay them out as [n][2 dk + dv].
  const int64_t w = 2 * dk + dv;
  std::vector<float> qkv(static_cast<std::size_t>(n * w));
  for (int64_t t = 0; t < n; ++t) {
    std::copy(q.data() + t * dk, q.data() + (t + 1) * dk, qkv.data() + t * w);
    std::copy(k.data() + t * dk, k.data() + (t + 1) * dk, qkv.data() + t * w + dk);
    std::copy(v.data() + t * dv, v.data() + (t + 1) * dv, qkv.data() + t * w + 2 * dk);
  }
  const linattn::HeadRows rr{qkv.data(), qkv.data() + dk, qkv.data() + 2 * dk, w, beta.data(), 1, g.data(),
                             channel ? dk : 1, channel, out.mutable_data(), dv, dk, dv};
  {
    py::gil_scoped_release release;
    (chunked ? linattn::delta_rule_chunked : linattn::delta_rule_recurrent)(kern, rr, n, state.mutable_data());
  }
  return {out, state};
}

}  // namespace

void bind_linear_attn(py::module_& m) {
  py::module_ l = m.def_submodule("linear_attn", "The delta rule's kernels (tests and benchmarks).");
  l.def("delta_rule", &delta_rule, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("g"),
        py::arg("S"), py::arg("chunked") = false, py::arg("isa") = py::none(),
        "One head of the delta rule over n tokens (recurrent, or chunked in 64-token chunks) at isa's kernels "
        "(None: the model's): returns (outputs (n, dv), the state after). g: the log decays, (n,) one per "
        "token (Gated DeltaNet) or (n, dk) one per key channel (Kimi Delta Attention).");
  l.def("set_isa", [](const std::string& isa) { linattn::set_active(isa_from_name(isa)); }, py::arg("isa"),
        "Makes isa's kernels the ones every model in this process runs (benchmarks; the same bits on every ISA).");
  l.def("active_isa", [] { return std::string(isa_name(linattn::active().isa)); },
        "The ISA of the kernels models run now.");
}

}  // namespace colibri::bindings
