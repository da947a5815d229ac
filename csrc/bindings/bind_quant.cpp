#include <pybind11/pybind11.h>
namespace py = pybind11;
namespace colibri::bindings {
void bind_quant(py::module_& m) { (void)m; }
}  // namespace colibri::bindings
