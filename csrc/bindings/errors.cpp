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
  }
  return "ColibriError";
}

void bind_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object errors = py::module_::import("colibri.errors");
      py::object cls = errors.attr(python_class_for(e.kind()));
      PyErr_SetObject(cls.ptr(), py::str(e.what()).ptr());
    }
  });
}

}  // namespace colibri::bindings
