// Expert workers (model/remote_experts.hpp): Engine.set_remote_experts installs Python
// callables as the coordinator's RemoteExperts (colibri.engine.cluster sends the rows to
// Ray actors there), Engine.compute_experts is a worker's side. The forward runs with the
// GIL released; the callables take it for the call only. An exception they raise unwinds the
// forward as Error(Cluster) (colibri.errors.ClusterError) carrying its message, or as
// Error(Cancelled) (KeyboardInterrupt) for a Ctrl-C.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "model/engine.hpp"

namespace py = pybind11;

namespace colibri::bindings {

namespace {

using FloatRows = py::array_t<float, py::array::c_style | py::array::forcecast>;

// A Python exception as one line: a ClusterError's own message, else "Type: message".
std::string describe(py::error_already_set& e) {
  std::string type = py::str(e.type().attr("__name__"));
  std::string text = py::str(e.value());
  return type == "ClusterError" ? text : type + ": " + text;
}

// Ctrl-C while waiting for the workers stops the forward as the cancel check does
// (KeyboardInterrupt, the session unchanged); any other exception is a ClusterError.
[[noreturn]] void fail_with(bool interrupted, const std::string& error) {
  if (interrupted) fail(ErrorKind::Cancelled, "the forward was interrupted");
  fail(ErrorKind::Cluster, error);
}

class PyRemoteExperts final : public RemoteExperts {
 public:
  PyRemoteExperts(int64_t n_layers, int64_t n_experts, std::vector<uint8_t> mask, int64_t hidden, py::object start,
                  py::object finish, py::object cancel)
      : RemoteExperts(n_layers, n_experts, std::move(mask)),
        hidden_(hidden),
        start_(std::move(start)),
        finish_(std::move(finish)),
        cancel_(std::move(cancel)) {}
  ~PyRemoteExperts() override {
    py::gil_scoped_acquire gil;  // the engine may drop it with the GIL released
    start_ = py::object();
    finish_ = py::object();
    cancel_ = py::object();
  }

  void start(const RemoteBatch& b) override {
    std::string error;
    bool interrupted = false;
    {
      py::gil_scoped_acquire gil;
      try {
        py::array_t<int32_t> experts(static_cast<py::ssize_t>(b.experts.size()), b.experts.data());
        py::array_t<int64_t> counts(static_cast<py::ssize_t>(b.counts.size()), b.counts.data());
        py::array_t<float> rows({b.total_rows(), hidden_}, b.rows.data());
        start_(b.layer, experts, counts, rows);
      } catch (py::error_already_set& e) {
        interrupted = e.matches(PyExc_KeyboardInterrupt);
        error = describe(e);
      }
    }
    if (!error.empty()) fail_with(interrupted, error);
  }

  void finish(const RemoteBatch& b, float* out) override {
    std::string error;
    bool interrupted = false;
    {
      py::gil_scoped_acquire gil;
      try {
        FloatRows got = FloatRows::ensure(finish_());
        const int64_t m = b.total_rows();
        if (!got || got.ndim() != 2 || got.shape(0) != m || got.shape(1) != hidden_)
          error = "the expert workers returned an array of the wrong shape for layer " + std::to_string(b.layer) +
                  " (want " + std::to_string(m) + " x " + std::to_string(hidden_) + " float32)";
        else
          std::memcpy(out, got.data(), static_cast<std::size_t>(m * hidden_) * sizeof(float));
      } catch (py::error_already_set& e) {
        interrupted = e.matches(PyExc_KeyboardInterrupt);
        error = describe(e);
      }
    }
    if (!error.empty()) fail_with(interrupted, error);
  }

  void cancel() noexcept override {
    py::gil_scoped_acquire gil;
    try {
      cancel_();
    } catch (py::error_already_set&) {  // nothing to report to: the forward is unwinding anyway
    } catch (...) {
    }
  }

 private:
  int64_t hidden_;
  py::object start_, finish_, cancel_;
};

}  // namespace

void bind_remote(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<Engine, std::shared_ptr<Engine>>>(m.attr("Engine"));
  cls.def(
         "set_remote_experts",
         [](Engine& e, const py::object& mask, const py::object& start, const py::object& finish,
            const py::object& cancel) {
           std::shared_ptr<RemoteExperts> remote;
           if (!mask.is_none()) {
             auto a = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(mask);
             if (!a || a.ndim() != 2) fail(ErrorKind::InvalidArgument, "remote experts: the mask must be 2-D uint8");
             std::vector<uint8_t> bits(a.data(), a.data() + a.size());
             remote = std::make_shared<PyRemoteExperts>(a.shape(0), a.shape(1), std::move(bits),
                                                        e.spec().hidden_size, start, finish, cancel);
           }
           py::gil_scoped_release release;  // the engine's lock (bind_engine.cpp)
           e.set_remote_experts(std::move(remote));
         },
         py::arg("mask"), py::arg("start") = py::none(), py::arg("finish") = py::none(),
         py::arg("cancel") = py::none(),
         "Experts computed elsewhere from the next forward on: mask [layers][experts] (nonzero: "
         "remote), start(layer, experts, counts, rows), finish() -> rows' results, cancel(); "
         "mask None: every expert here")
      .def_property_readonly("has_remote_experts", &Engine::has_remote_experts)
      .def(
          "compute_experts",
          [](Engine& e, int64_t layer, std::vector<int32_t> experts, std::vector<int64_t> counts, FloatRows rows) {
            const int64_t d = e.spec().hidden_size;
            int64_t m = 0;
            for (int64_t c : counts) m += c;
            if (rows.ndim() != 2 || rows.shape(0) != m || rows.shape(1) != d)
              fail(ErrorKind::InvalidArgument, "compute_experts: rows must be [sum(counts)=" + std::to_string(m) +
                                                   ", hidden=" + std::to_string(d) + "] float32");
            py::array_t<float> out({m, d});
            const float* x = rows.data();
            float* y = out.mutable_data();
            {
              py::gil_scoped_release release;
              e.compute_experts(layer, experts, counts, x, y);
            }
            return out;
          },
          py::arg("layer"), py::arg("experts"), py::arg("counts"), py::arg("rows"),
          "An expert worker's side: experts[i] over counts[i] rows of `rows` (store layer `layer`)");
}

}  // namespace colibri::bindings
