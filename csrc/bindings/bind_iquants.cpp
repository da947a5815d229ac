// colibri._core.quant.iq_table: the i-quant lattice and value tables as compiled into the
// core, for tests that compare them with the gguf package (tests/test_iquants.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "quant/iquant_grids.hpp"

namespace py = pybind11;

namespace colibri::bindings {
namespace {

py::array_t<uint8_t> bytes_of(const void* p, std::size_t n) {
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(n));
  std::memcpy(out.mutable_data(), p, n);
  return out;
}

py::array_t<uint8_t> iq_table(const std::string& name) {
  using namespace iq;
  if (name == "iq2xxs_grid") return bytes_of(kIq2xxsGrid, sizeof kIq2xxsGrid);
  if (name == "iq2xs_grid") return bytes_of(kIq2xsGrid, sizeof kIq2xsGrid);
  if (name == "iq2s_grid") return bytes_of(kIq2sGrid, sizeof kIq2sGrid);
  if (name == "iq3xxs_grid") return bytes_of(kIq3xxsGrid, sizeof kIq3xxsGrid);
  if (name == "iq3s_grid") return bytes_of(kIq3sGrid, sizeof kIq3sGrid);
  if (name == "iq1s_grid") return bytes_of(kIq1sGrid, sizeof kIq1sGrid);
  if (name == "ksigns_iq2xs") return bytes_of(kKsignsIq2xs, sizeof kKsignsIq2xs);
  if (name == "kvalues_iq4nl") return bytes_of(kKvaluesIq4nlBits, sizeof kKvaluesIq4nlBits);
  if (name == "kvalues_mxfp4") return bytes_of(kKvaluesMxfp4Bits, sizeof kKvaluesMxfp4Bits);
  fail(ErrorKind::InvalidArgument, "unknown i-quant table '" + name + "'");
}

}  // namespace

void bind_iquants(py::module_& m) {
  py::module_ q = m.attr("quant").cast<py::module_>();
  q.def("iq_table", &iq_table, py::arg("name"),
        "Raw bytes of a compiled i-quant table (little-endian entries, element 0 lowest).");
}

}  // namespace colibri::bindings
