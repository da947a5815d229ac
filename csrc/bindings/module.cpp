// pybind11 module colibri._core. Each area binds itself in its own file; exception
// mapping lives in errors.cpp only.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace colibri::bindings {
void bind_errors(py::module_& m);
void bind_quant(py::module_& m);
void bind_iquants(py::module_& m);  // after bind_quant: adds to colibri._core.quant
void bind_threads(py::module_& m);
void bind_engine(py::module_& m);
void bind_remote(py::module_& m);  // after bind_engine: adds to colibri._core.Engine
void bind_session(py::module_& m);
void bind_io(py::module_& m);
void bind_attention(py::module_& m);
void bind_linear_attn(py::module_& m);
void bind_gpu(py::module_& m);
}  // namespace colibri::bindings

PYBIND11_MODULE(_core, m) {
  m.doc() = "colibri native core (C++). Use the colibri Python package; this module is internal.";
  using namespace colibri::bindings;
  bind_errors(m);
  bind_quant(m);
  bind_iquants(m);
  bind_threads(m);
  bind_engine(m);
  bind_remote(m);
  bind_session(m);
  bind_io(m);
  bind_attention(m);
  bind_linear_attn(m);
  bind_gpu(m);
}
