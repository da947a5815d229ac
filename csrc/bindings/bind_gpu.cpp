// colibri._core.gpu: the GPU runtime (csrc/gpu/) for colibri.gpu and the tests. The
// library path comes from Python (colibri.gpu finds it in the installed wgpu package);
// calls that touch the device release the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "bindings/quant_args.hpp"
#include "common/errors.hpp"
#include "gpu/device.hpp"

namespace py = pybind11;

namespace colibri::bindings {

namespace {

py::dict adapter_dict(const gpu::AdapterInfo& a) {
  py::dict d;
  d["name"] = a.name;
  d["vendor"] = a.vendor;
  d["description"] = a.description;
  d["backend"] = a.backend;
  d["adapter_type"] = a.adapter_type;
  d["vendor_id"] = a.vendor_id;
  d["device_id"] = a.device_id;
  d["max_storage_binding_size"] = a.max_storage_binding_size;
  d["max_buffer_size"] = a.max_buffer_size;
  d["max_workgroup_storage"] = a.max_workgroup_storage;
  d["max_workgroup_invocations"] = a.max_workgroup_invocations;
  d["max_workgroups_per_dimension"] = a.max_workgroups_per_dimension;
  d["shader_f16"] = a.shader_f16;
  d["subgroups"] = a.subgroups;
  return d;
}

// A Matrix keeps its Device's Python object alive (py::keep_alive below), so the device's
// handles outlive it on the Python side too.
struct PyMatrix {
  std::unique_ptr<gpu::Matrix> m;
};

}  // namespace

void bind_gpu(py::module_& m) {
  py::module_ g = m.def_submodule("gpu", "GPU runtime: adapters, weight upload, matvec kernels.");
  g.def("compiled", &gpu::webgpu_compiled,
        "Whether this build has the WebGPU runtime (it was compiled with wgpu's headers).");
  g.def("header_version", &gpu::webgpu_header_version,
        "The wgpu-native version whose headers this build was compiled with ('' if none).");
  g.def("kernel_types", [] {
    py::list out;
    for (DType t : all_types())
      if (gpu::has_gpu_kernel(t)) out.append(dtype_name(t));
    return out;
  }, "Weight types with a GPU matvec kernel.");
  g.def("list_adapters", [](const std::string& library_path) {
    std::vector<gpu::AdapterInfo> adapters;
    {
      py::gil_scoped_release nogil;
      adapters = gpu::list_webgpu_adapters(library_path);
    }
    py::list out;
    for (const auto& a : adapters) out.append(adapter_dict(a));
    return out;
  }, py::arg("library_path"), "The Vulkan/Metal/DX12 adapters wgpu-native at this path reports.");

  py::class_<PyMatrix>(g, "Matrix", "A weight matrix uploaded to a GPU device, in row chunks.")
      .def_property_readonly("dtype", [](const PyMatrix& p) { return dtype_name(p.m->type()); })
      .def_property_readonly("rows", [](const PyMatrix& p) { return p.m->rows(); })
      .def_property_readonly("cols", [](const PyMatrix& p) { return p.m->cols(); })
      .def_property_readonly("chunks", [](const PyMatrix& p) { return p.m->chunks(); });

  py::class_<gpu::Device>(g, "Device", "One opened GPU adapter (WebGPU).")
      .def(py::init([](const std::string& library_path, int index, uint64_t memory_budget,
                       uint64_t min_storage_binding) {
             gpu::RequiredLimits need;
             need.storage_binding = min_storage_binding;
             py::gil_scoped_release nogil;
             return gpu::open_webgpu_device(library_path, index, need, memory_budget);
           }),
           py::arg("library_path"), py::arg("index") = 0, py::arg("memory_budget") = 0,
           py::arg("min_storage_binding") = gpu::RequiredLimits{}.storage_binding,
           "Open adapter `index` of list_adapters(library_path); memory_budget: bytes of "
           "weights it may hold (0: no limit); min_storage_binding: refuse an adapter whose "
           "binding limit is smaller.")
      .def_property_readonly("adapter", [](const gpu::Device& d) { return adapter_dict(d.adapter()); })
      .def_property_readonly("resident_bytes", &gpu::Device::resident_bytes)
      .def("upload", [](gpu::Device& d, const std::string& dtype, const ByteArray& data,
                        int64_t rows, int64_t cols, uint64_t split_bytes) {
             const DType type = dtype_from_name(dtype);
             PyMatrix out;
             {
               py::gil_scoped_release nogil;
               out.m = d.upload_matrix(type, rows, cols, data.data(),
                                       static_cast<std::size_t>(data.size()), split_bytes);
             }
             return out;
           }, py::arg("dtype"), py::arg("data"), py::arg("rows"), py::arg("cols"),
           py::arg("split_bytes") = 0, py::keep_alive<0, 1>(),
           "Upload rows x cols weights in their GGUF block bytes, in chunks of at most "
           "split_bytes (0: the adapter's binding limit).")
      .def("upload_fp8", [](gpu::Device& d, const ByteArray& codes, const FloatArray& scales,
                            int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                            uint64_t split_bytes) {
             const gpu::ScaleBlocks s{scales.data(), static_cast<std::size_t>(scales.size()),
                                      block_rows, block_cols};
             PyMatrix out;
             {
               py::gil_scoped_release nogil;
               out.m = d.upload_scaled_matrix(DType::F8_E4M3, rows, cols, codes.data(),
                                              static_cast<std::size_t>(codes.size()), s, split_bytes);
             }
             return out;
           }, py::arg("codes"), py::arg("scales"), py::arg("rows"), py::arg("cols"),
           py::arg("block_rows"), py::arg("block_cols"), py::arg("split_bytes") = 0,
           py::keep_alive<0, 1>(),
           "Upload rows x cols F8_E4M3 codes with their F32 block scales [ceil(rows / "
           "block_rows), ceil(cols / block_cols)] (as quant.fp8_dequantize takes them).")
      .def("matvec", [](gpu::Device& d, const PyMatrix& w, const FloatArray& x) {
             if (x.ndim() != 1 || x.shape(0) != w.m->cols()) {
               fail(ErrorKind::InvalidArgument, "x must be a 1-D array of " +
                                                    std::to_string(w.m->cols()) + " floats");
             }
             FloatArray y(w.m->rows());
             float* out = y.mutable_data();
             {
               py::gil_scoped_release nogil;
               d.matvec(*w.m, x.data(), out);
             }
             return y;
           }, py::arg("w"), py::arg("x"), "y = W x on the device (float32).")
      .def("dequantize", [](gpu::Device& d, const PyMatrix& w) {
             FloatArray out({w.m->rows(), w.m->cols()});
             float* o = out.mutable_data();
             {
               py::gil_scoped_release nogil;
               d.dequantize(*w.m, o);
             }
             return out;
           }, py::arg("w"), "W as float32 [rows, cols], decoded by the GPU kernel's code.");
}

}  // namespace colibri::bindings
