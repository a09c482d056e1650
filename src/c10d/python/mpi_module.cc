// The c10d._mpi extension module: the MPI backend, apart from c10d._C so that only programs
// that use it need an MPI library (the wheel leaves libmpi to the host, as mpi4py does).
// Python imports it on first use (c10d/_mpi_loader.py). It holds its own copy of the core
// libraries it links; the types it shares with c10d._C (Backend, Work, Tensor, the errors)
// cross between the two through pybind11's shared type registry and by virtual calls, and
// no state of the core libraries (flight recorder, profiler, registries) is read on this
// side.
#include "c10d/python/bindings.h"

PYBIND11_MODULE(_mpi, m) {
  m.doc() = "c10d: the MPI backend (needs the MPI library of the mpirun that starts the job).";
  pybind11::module_::import("c10d._C");  // Backend and the errors are registered there
  c10d::python::init_mpi(m);
}
