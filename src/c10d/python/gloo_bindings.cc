// Bindings of the Gloo backend: ProcessGroupGloo, its options and transport devices.
#include <gloo/transport/device.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "c10d/backends/gloo/gloo_backend.h"
#include "c10d/python/bindings.h"

namespace py = pybind11;

namespace c10d::python {

void init_gloo(py::module_& m) {
  using backends::gloo::GlooBackend;
  using backends::gloo::GlooOptions;
  using DevicePtr = std::shared_ptr<::gloo::transport::Device>;

  py::class_<GlooBackend, pg::Backend, std::shared_ptr<GlooBackend>> gloo(
      m, "ProcessGroupGloo", "Collectives over TCP with the Gloo library.");

  // module_local: PyTorch binds the same Gloo type; both modules must be importable together.
  py::class_<::gloo::transport::Device, DevicePtr>(gloo, "Device", py::module_local())
      .def("__repr__", [](const ::gloo::transport::Device& d) { return d.str(); });

  py::class_<GlooOptions>(gloo, "_Options")
      .def(py::init<>())
      .def_readwrite("_devices", &GlooOptions::devices)
      .def_readwrite("_threads", &GlooOptions::threads)
      .def_readwrite("_timeout", &GlooOptions::timeout)
      .def_readwrite("_ring", &GlooOptions::ring);
  gloo.attr("Options") = gloo.attr("_Options");

  gloo.def(py::init(
               [](std::shared_ptr<store::Store> store, int rank, int size, core::Millis timeout) {
                 GlooOptions opts;
                 opts.timeout = timeout;
                 py::gil_scoped_release release;  // not call_guard (bindings.h)
                 return std::make_shared<GlooBackend>(std::move(store), rank, size, opts);
               }),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout") = pg::kDefaultPgTimeout)
      .def(py::init([](std::shared_ptr<store::Store> store, int rank, int size, GlooOptions opts) {
             py::gil_scoped_release release;
             return std::make_shared<GlooBackend>(std::move(store), rank, size, opts);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options"))
      .def_static(
          "create_device",
          [](const std::string& hostname, const std::string& interface) -> DevicePtr {
            if (!hostname.empty()) return GlooBackend::create_device_for_hostname(hostname);
            if (!interface.empty()) return GlooBackend::create_device_for_interface(interface);
            return GlooBackend::create_default_device();
          },
          py::arg("hostname") = "", py::arg("interface") = "",
          "A TCP device bound to the address of `hostname`, or of network interface "
          "`interface`, or (neither) the default.")
      .def_static("create_default_device", [] { return GlooBackend::create_default_device(); })
      .def_property_readonly(
          "options",
          [](const GlooBackend& b) {
            GlooOptions options;
            options.devices = b.devices();
            options.timeout = b.timeout();
            return options;
          },
          "The backend's options: its devices and the timeout of the operations that set none.");
}

}  // namespace c10d::python
