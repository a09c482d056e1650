// Bindings of the MPI backend: ProcessGroupMPI.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "c10d/backends/mpi/mpi_backend.h"
#include "c10d/python/bindings.h"

namespace py = pybind11;

namespace c10d::python {

void init_mpi(py::module_& m) {
  using backends::mpi::MpiBackend;

  py::class_<MpiBackend, pg::Backend, std::shared_ptr<MpiBackend>>(
      m, "ProcessGroupMPI", "Collectives through the MPI library, for programs run by mpirun.")
      .def_static(
          "create",
          [](std::vector<int> ranks, core::Millis timeout) {
            py::gil_scoped_release release;  // the progress thread may run Python callbacks
            return MpiBackend::create(std::move(ranks), timeout);
          },
          py::arg("ranks") = std::vector<int>{}, py::arg("timeout") = pg::kDefaultPgTimeout,
          "A backend for the group of these world ranks (all if empty), or None on a rank "
          "outside it. Initialises MPI the first time.")
      .def_static(
          "_world",
          [] {
            py::gil_scoped_release release;
            return MpiBackend::world();
          },
          "(rank, size) of this process in MPI_COMM_WORLD.")
      .def_static(
          "_finalize",
          [](core::Millis grace) {
            py::gil_scoped_release release;
            MpiBackend::finalize(grace);
          },
          py::arg("grace") = core::Millis(10000),
          "Lets submitted operations finish (at most `grace`) and finalises MPI if c10d "
          "initialised it.");
}

}  // namespace c10d::python
