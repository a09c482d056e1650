// The c10d._C extension module: every component adds its bindings here, in dependency order.
// The MPI backend is the module c10d._mpi (mpi_module.cc), so that this one needs no MPI
// library.
#include "c10d/config.h"
#include "c10d/python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "c10d: distributed communication for CPU programs (compiled core).";
  m.attr("__version__") = C10D_VERSION;
  c10d::python::init_core(m);
  c10d::python::init_reduce(m);
  c10d::python::init_store(m);
  c10d::python::init_tcp_store(m);
  c10d::python::init_pg(m);
  c10d::python::init_control(m);
  c10d::python::init_ddp(m);
#if C10D_WITH_GLOO
  c10d::python::init_gloo(m);
#endif
#if C10D_WITH_SHM
  c10d::python::init_shm(m);
#endif
#if C10D_WITH_GLOO && C10D_WITH_SHM
  c10d::python::init_hier(m);
#endif
}
