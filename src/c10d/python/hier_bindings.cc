// Bindings of the hierarchical backend (shm within hosts, Gloo between them) and of the
// backend "auto" picks.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "c10d/backends/hier/hier_backend.h"
#include "c10d/python/bindings.h"

namespace py = pybind11;

namespace c10d::python {

void init_hier(py::module_& m) {
  using backends::hier::HierBackend;

  py::class_<HierBackend, pg::Backend, std::shared_ptr<HierBackend>>(
      m, "ProcessGroupHier",
      "Collectives over shared memory within each host and Gloo between hosts.")
      .def(py::init([](std::shared_ptr<store::Store> store, int rank, int size,
                       core::Millis timeout) {
             py::gil_scoped_release release;  // not call_guard (bindings.h)
             auto topology = backends::hier::discover_topology(*store, rank, size, "hier/host/");
             return std::make_shared<HierBackend>(std::move(store), rank, size, std::move(topology),
                                                  timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout") = pg::kDefaultPgTimeout)
      .def_property_readonly(
          "hosts", [](const HierBackend& self) { return self.topology().hosts; },
          "The ranks of each host (hosts in order of their lowest rank).");
  m.def(
      "_create_auto_backend",
      [](std::shared_ptr<store::Store> store, int rank, int size, core::Millis timeout) {
        py::gil_scoped_release release;
        return HierBackend::create_auto(std::move(store), rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      "The shm backend when every rank runs on this host, else the hierarchical one.");
}

}  // namespace c10d::python
