// The inline all_reduce entry point: a plain CPython function (METH_FASTCALL, no pybind11
// argument dispatch, no Tensor or Work objects) that all_reduce() tries first for a synchronous
// call on the default group. It reads the array through the buffer protocol and hands it to
// ProcessGroup::allreduce_inline() with the GIL released. Anything it does not handle (other
// tensor kinds, PREMUL_SUM, read-only or strided arrays, hooks, coalescing, backends without an
// inline path) makes it return False before doing anything, and the general path takes over,
// with its full argument checks and error messages.
#include <pybind11/pybind11.h>

#include <exception>
#include <memory>
#include <vector>

#include "c10d/core/dtype.h"
#include "c10d/core/reduce_op.h"
#include "c10d/pg/process_group.h"
#include "c10d/python/bindings.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

constexpr const char* kCapsuleName = "c10d._C.allreduce_now";

struct AllreduceNow {
  std::shared_ptr<pg::ProcessGroup> group;
  // The ReduceOp.RedOpType members the fast path accepts, compared by identity.
  std::vector<std::pair<py::object, core::ReduceOp::Kind>> kinds;
};

// Releases a Py_buffer on every exit path (the GIL is held when it runs).
struct BufferGuard {
  Py_buffer view{};
  bool held = false;
  ~BufferGuard() {
    if (held) PyBuffer_Release(&view);
  }
};

PyObject* allreduce_now(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* state = static_cast<AllreduceNow*>(PyCapsule_GetPointer(self, kCapsuleName));
  if (state == nullptr) return nullptr;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "allreduce_now(tensor, op) takes exactly 2 arguments");
    return nullptr;
  }
  PyObject* tensor = args[0];
  const core::ReduceOp::Kind* kind = nullptr;
  for (const auto& [member, k] : state->kinds) {
    if (member.ptr() == args[1]) kind = &k;
  }
  if (kind == nullptr || !PyObject_CheckBuffer(tensor)) Py_RETURN_FALSE;
  BufferGuard buffer;
  if (PyObject_GetBuffer(tensor, &buffer.view, PyBUF_RECORDS_RO | PyBUF_WRITABLE) != 0) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  buffer.held = true;
  const Py_buffer& v = buffer.view;
  if (!PyBuffer_IsContiguous(&v, 'C') || v.itemsize <= 0) Py_RETURN_FALSE;
  const auto dtype =
      core::from_buffer_format(v.format != nullptr ? v.format : "B", static_cast<size_t>(v.itemsize));
  if (!dtype || core::element_size(*dtype) != static_cast<size_t>(v.itemsize)) Py_RETURN_FALSE;

  static_assert(sizeof(Py_ssize_t) == sizeof(int64_t));
  const pg::DenseView dense{.data = v.buf,
                            .numel = static_cast<size_t>(v.len / v.itemsize),
                            .dtype = *dtype,
                            .ndim = v.ndim,
                            .sizes = reinterpret_cast<const int64_t*>(v.shape)};
  pg::AllreduceOptions opts;
  opts.reduce_op = *kind;
  bool done = false;
  std::exception_ptr error;
  PyThreadState* thread = PyEval_SaveThread();
  try {
    done = state->group->allreduce_inline(dense, opts);
  } catch (...) {
    error = std::current_exception();
  }
  PyEval_RestoreThread(thread);
  if (error) {
    set_python_error(error);
    return nullptr;
  }
  return PyBool_FromLong(done);
}

PyMethodDef g_allreduce_now_def = {
    "allreduce_now", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(allreduce_now)),
    METH_FASTCALL,
    "allreduce_now(tensor, op) -> bool: a synchronous in-place all_reduce of a C-contiguous "
    "writable buffer on this group, if the inline path applies; False (nothing done) if not."};

}  // namespace

py::object make_allreduce_now(std::shared_ptr<pg::ProcessGroup> group) {
  auto state = std::make_unique<AllreduceNow>();
  state->group = std::move(group);
  py::dict members = py::module_::import("c10d._C").attr("ReduceOp").attr("RedOpType").attr(
      "__members__");
  for (auto [name, member] : members) {
    const auto k = member.cast<core::ReduceOp::Kind>();
    if (k != core::ReduceOp::PREMUL_SUM && k != core::ReduceOp::UNUSED) {
      state->kinds.emplace_back(py::reinterpret_borrow<py::object>(member), k);
    }
  }
  py::capsule capsule(state.get(), kCapsuleName, [](PyObject* c) {
    delete static_cast<AllreduceNow*>(PyCapsule_GetPointer(c, kCapsuleName));
  });
  state.release();
  PyObject* fn = PyCFunction_NewEx(&g_allreduce_now_def, capsule.ptr(), nullptr);
  if (fn == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

}  // namespace c10d::python
