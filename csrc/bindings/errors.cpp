// The one place that maps core errors to Python exceptions. colibri::Error kinds become
// classes from colibri.errors (imported lazily on the error path only).
#include <pybind11/pybind11.h>

#include "common/errors.hpp"

namespace py = pybind11;

namespace colibri::bindings {

static const char* python_class_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidArgument: return "InvalidRequestError";
    case ErrorKind::Io: return "ModelIOError";
    case ErrorKind::Format: return "ModelFormatError";
    case ErrorKind::TokenOutOfRange: return "TokenOutOfRangeError";
    case ErrorKind::ContextOverflow: return "ContextOverflowError";
    case ErrorKind::Unsupported: return "UnsupportedError";
    case ErrorKind::Internal: return "InternalError";
    case ErrorKind::DeviceUnavailable: return "GPUUnavailableError";
    case ErrorKind::Cluster: return "ClusterError";
    case ErrorKind::Cancelled: return nullptr;  // a builtin: KeyboardInterrupt
  }
  return "ColibriError";
}

static void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    const char* name = python_class_for(e.kind());
    if (name == nullptr) {  // the binding re-raises the Python exception that cancelled
      PyErr_SetString(PyExc_KeyboardInterrupt, e.what());  // a forward; this is the fallback
      return;
    }
    py::object errors = py::module_::import("colibri.errors");
    py::object cls = errors.attr(name);
    PyErr_SetObject(cls.ptr(), py::str(e.what()).ptr());
  }
}

void bind_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator(&translate);
}

// colibri._bench: for its own functions only, so their errors map the same way whether or
// not colibri._core (whose translator is global) is loaded.
void bind_errors_local(py::module_& m) {
  (void)m;
  py::register_local_exception_translator(&translate);
}

}  // namespace colibri::bindings
