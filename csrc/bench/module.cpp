// pybind11 module colibri._bench: the timing harnesses benchmarks/ runs (loops timed in
// C++), kept out of the production extension colibri._core. It links its own copy of the
// core's code it times, so it shares no C++ objects with _core: its ThreadPool is its own
// type (module-local), and a colibri._core.ThreadPool is not accepted where a pool is.
#include <pybind11/pybind11.h>

#include <memory>

#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bindings {
void bind_errors_local(py::module_& m);
}  // namespace colibri::bindings

namespace colibri::bench {
void bind_bench_quant(py::module_& m);
void bind_bench_attention(py::module_& m);
}  // namespace colibri::bench

PYBIND11_MODULE(_bench, m) {
  m.doc() = "colibri timing harnesses for benchmarks/ (C++ loops). Not a user API.";
  colibri::bindings::bind_errors_local(m);
  // module_local: colibri._core registers ThreadPool too, for its own copy of the code.
  py::class_<colibri::ThreadPool>(m, "ThreadPool", py::module_local(),
                                  "A compute team for the harnesses (hybrid wait policy, as "
                                  "colibri._core.ThreadPool's default); kept between calls so "
                                  "they time a warm team.")
      .def(py::init([](int n_threads) {
             colibri::ThreadSettings s;
             s.n_threads = n_threads;
             py::gil_scoped_release nogil;
             return std::make_unique<colibri::ThreadPool>(s);
           }),
           py::arg("n_threads") = 1)
      .def_property_readonly("size", &colibri::ThreadPool::size, "team size, the caller included");
  colibri::bench::bind_bench_quant(m);
  colibri::bench::bind_bench_attention(m);
}
