// Bindings of the shared-memory backend: ProcessGroupShm and its shared-heap allocator.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "c10d/backends/shm/alias.h"
#include "c10d/backends/shm/shm_backend.h"
#include "c10d/core/exception.h"
#include "c10d/python/bindings.h"
#include "c10d/python/tensor_convert.h"

namespace py = pybind11;

namespace c10d::python {

void init_shm(py::module_& m) {
  using backends::shm::ShmBackend;
  using backends::shm::ShmOptions;

  py::class_<ShmBackend, pg::Backend, std::shared_ptr<ShmBackend>>(
      m, "ProcessGroupShm", "Collectives between the processes of one host through shared memory.")
      .def(py::init(
               [](std::shared_ptr<store::Store> store, int rank, int size, core::Millis timeout) {
                 ShmOptions opts;
                 opts.timeout = timeout;
                 py::gil_scoped_release release;  // not call_guard (bindings.h)
                 return std::make_shared<ShmBackend>(std::move(store), rank, size, opts);
               }),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout") = pg::kDefaultPgTimeout)
      .def(
          "_empty",
          [](ShmBackend& self, std::vector<int64_t> shape, const std::string& dtype) {
            auto parsed = core::dtype_from_name(dtype);
            C10D_CHECK_ARG(parsed.has_value(), "shm_empty: unknown dtype '", dtype, "'");
            return from_tensor(self.empty(std::move(shape), *parsed));
          },
          py::arg("shape"), py::arg("dtype"),
          "An uninitialised C-contiguous array in this rank's shared heap (numpy when the "
          "dtype exists there, else a DLPack capsule).")
      .def(
          "_aliased",
          [](const ShmBackend& self, const py::buffer& array) {
            const py::buffer_info info = array.request();
            return self.adopted(info.ptr, static_cast<size_t>(info.size * info.itemsize),
                                /*verify=*/true);
          },
          py::arg("array"),
          "Whether part of the array's memory was moved into this rank's shared heap (after "
          "repeated all_reduces; C10D_SHM_ADOPT_BYTES).")
      .def("_next_sequence", &ShmBackend::next_sequence);
  m.def("_shm_alias_count", &backends::shm::alias_count,
        "Number of arrays whose pages live in a shared heap of this process (for tests).");
}

}  // namespace c10d::python
