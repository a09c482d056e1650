// Entry points of the pieces of the c10d._C module, one per component, called by module.cc.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <memory>
#include <optional>

namespace c10d::pg {
class ProcessGroup;
}

namespace c10d::python {

void init_core(pybind11::module_& m);    // core_bindings.cc: errors, dtypes, Tensor, Work
void init_reduce(pybind11::module_& m);  // reduce_bindings.cc: ReduceOp, reduction kernels
void init_store(
    pybind11::module_& m);  // store_bindings.cc: Store, HashStore, FileStore, PrefixStore
void init_tcp_store(pybind11::module_& m);  // tcp_store_bindings.cc: TCPStore
void init_pg(pybind11::module_& m);         // pg_bindings.cc: options, Backend, ProcessGroup
void init_gloo(pybind11::module_& m);       // gloo_bindings.cc: ProcessGroupGloo (C10D_WITH_GLOO)
void init_control(pybind11::module_& m);    // control_bindings.cc: StoreCollectives, WorkerServer
void init_shm(pybind11::module_& m);        // shm_bindings.cc: ProcessGroupShm (C10D_WITH_SHM)
void init_mpi(pybind11::module_& m);        // mpi_bindings.cc: ProcessGroupMPI (module c10d._mpi)
void init_hier(pybind11::module_& m);       // hier_bindings.cc: ProcessGroupHier (gloo and shm)
void init_ddp(pybind11::module_& m);        // ddp_bindings.cc: Reducer, GradBucket, comm hooks

// Constructors that block (stores, backends) release the GIL inside their py::init factory,
// around the C++ construction only. Never py::call_guard<gil_scoped_release> on py::init:
// pybind11 registers the new instance in its global table inside the guarded call, and two
// threads doing that at once (ranks that are threads of one process) corrupted the table, so
// a later deallocation aborted the process ("Tried to deallocate unregistered instance").

// The GIL for a C++ thread (backend workers, servers, future callbacks), while Python code may
// still run. A thread that takes the GIL once the interpreter finalizes is ended by Python in
// the middle of its C++ frames, and the process with std::terminate; so an atexit hook (run
// before finalization) closes a gate that every such thread passes first, and waits for those
// already inside. Where the gate is closed the guard is empty: the caller skips its Python
// work (and leaks what it would have released).
class GilGuard {
 public:
  GilGuard();
  ~GilGuard();
  GilGuard(const GilGuard&) = delete;
  GilGuard& operator=(const GilGuard&) = delete;
  explicit operator bool() const { return entered_; }

 private:
  bool entered_ = false;
  std::optional<pybind11::gil_scoped_acquire> gil_;
};

// Closes the gate (atexit, GIL held): later GilGuards are empty, and this returns once the
// threads inside left, or after a few seconds.
void close_python_gate();

// A Python object owned by C++ code that other threads run or drop: released under the GIL
// (GilGuard) by whichever thread drops the last reference, and leaked once the interpreter is
// closing.
std::shared_ptr<pybind11::object> hold_python(pybind11::object obj);

// A Python exception stored in a core::Future (set_exception, a raising then() callback, a
// Python hook): raised again as itself every time the future is waited on. pybind11's own
// error_already_set may be raised only once, so it must never be stored.
class PythonException : public std::exception {
 public:
  explicit PythonException(pybind11::handle exception);  // an exception instance; GIL held
  const char* what() const noexcept override { return what_.c_str(); }
  pybind11::handle exception() const { return *held_; }

 private:
  std::shared_ptr<pybind11::object> held_;
  std::string what_;
};

// The exception_ptr for the Python error being handled (e.g. a caught error_already_set's).
std::exception_ptr python_exception_ptr(const pybind11::error_already_set& error);

// Sets the Python error for a C++ exception as pybind11 would (c10d's error classes, ValueError
// for invalid arguments, RuntimeError otherwise); for code outside pybind11's dispatch.
void set_python_error(std::exception_ptr error);

// inline_path.cc: the inline entry points of `group` by name ("allreduce", "broadcast", ...),
// plain CPython functions returning False when the inline path does not apply.
pybind11::dict make_inline_ops(std::shared_ptr<pg::ProcessGroup> group);

}  // namespace c10d::python
