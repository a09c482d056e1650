// The inline entry points: plain CPython functions (METH_FASTCALL, no pybind11 argument
// dispatch, no Tensor, options or Work objects) that the synchronous collectives and the
// point-to-point calls of distributed_c10d.py try first (isend and irecv return a Work). They read
// arrays through the buffer protocol, and other tensors (torch's) through __dlpack__, and hand them
// to ProcessGroup::run_inline() with the GIL released. Anything they do not handle (PREMUL_SUM,
// read-only or strided arrays, tensors DLPack cannot export, malformed calls, hooks, coalescing,
// backends without an inline path) makes them return False before doing anything, and the general
// path takes over with its full argument checks and error messages.
#include <pybind11/pybind11.h>

#ifdef C10D_HAVE_NUMPY_HEADERS
// Only the array struct's inline accessors are used: no numpy C-API table, no import_array().
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>
#endif

#include <array>
#include <exception>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#ifdef C10D_HAVE_NUMPY_HEADERS
#define C10D_ADOPT_ARRAYS 1  // numpy arrays reused by collectives move into a backend's memory
#endif
#include "c10d/core/blocking.h"
#include "c10d/core/dtype.h"
#include "c10d/core/env.h"
#include "c10d/core/reduce_op.h"
#include "c10d/pg/process_group.h"
#include "c10d/python/bindings.h"
#include "c10d/python/tensor_convert.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

using core::OpType;
using pg::DenseView;
using pg::InlineOp;

struct InlineState {
  std::shared_ptr<pg::ProcessGroup> group;
#ifdef C10D_ADOPT_ARRAYS
  // The group's CPU backend when it adopts memory (for adopt_reused), else null.
  std::shared_ptr<pg::Backend> adopter;
  size_t adopt_bytes = 0;  // C10D_SHM_ADOPT_BYTES; 0: never
#endif
  // The ReduceOp.RedOpType members accepted, compared by identity.
  std::vector<std::pair<py::object, core::ReduceOp::Kind>> kinds;
  // The Python object of the last Work returned that had completed without outputs (a small
  // send: shm returns one shared Work for them all), handed out again for the same Work, as
  // making a new one costs about as much as the send itself. It holds no tensor.
  const pg::Work* quiet_work = nullptr;
  py::object quiet_object;
};

// A Py_buffer, a numpy array read directly (a reference to it), or a tensor imported through
// __dlpack__ (torch tensors), released on every exit path (the GIL is held then, which some
// DLPack deleters need). Only what an argument uses gets initialised: zeroing the whole of it
// on every call cost ~5 ns of a ~175 ns call.
struct Buffer {
  Py_buffer view;  // filled by PyObject_GetBuffer, read only when `held`
  bool held = false;
  PyObject* array = nullptr;
  std::optional<core::Tensor> imported;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (held) PyBuffer_Release(&view);
    Py_XDECREF(array);
  }
};

#ifdef C10D_HAVE_NUMPY_HEADERS
// numpy.ndarray and its built-in dtype objects (numpy keeps one per native type), filled by
// make_inline_ops() when numpy is importable; the GIL guards them.
struct NumpyTypes {
  PyTypeObject* ndarray = nullptr;
  std::vector<std::pair<PyObject*, core::DType>> dtypes;  // strong references, never freed
};
NumpyTypes g_numpy;

void load_numpy_types() {
  if (g_numpy.ndarray != nullptr) return;
  try {
    py::module_ np = py::module_::import("numpy");
    NumpyTypes loaded;
    // Every type code that maps to a DType, the platform-sized integer ones included.
    for (const char* code : {"?", "b", "B", "h", "i", "l", "q", "e", "f", "d", "F", "D"}) {
      py::object dtype = np.attr("dtype")(code);
      const std::string kind = py::str(dtype.attr("kind"));
      const auto itemsize = dtype.attr("itemsize").cast<size_t>();
      const std::string format = kind == "c" ? (itemsize == 8 ? "Zf" : "Zd") : code;
      if (const auto d = core::from_buffer_format(format, itemsize)) {
        loaded.dtypes.emplace_back(dtype.release().ptr(), *d);
      }
    }
    py::object ndarray = np.attr("ndarray");
    loaded.ndarray = reinterpret_cast<PyTypeObject*>(ndarray.release().ptr());
    g_numpy = std::move(loaded);
  } catch (const py::error_already_set&) {
    // No numpy: every array goes through the buffer protocol.
  }
}

// A numpy array (exactly numpy.ndarray) read from its own fields: numpy's buffer export
// rebuilds the format string on every call, about 0.13 us, more than the rest of an inline
// call's argument handling. What it does not take goes on to the buffer path: arrays that
// are not C-contiguous or not aligned, read-only ones where a writable one is needed, and
// dtype objects other than numpy's built-in ones.
bool dense_ndarray(PyObject* obj, bool writable, Buffer& buffer, DenseView& out) {
  auto* a = reinterpret_cast<PyArrayObject*>(obj);
  const int flags = PyArray_FLAGS(a);
  constexpr int kNeeded = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
  if ((flags & kNeeded) != kNeeded) return false;
  // numpy marks arrays it warns about on write with a private flag (the sign bit): leave those
  // to the buffer protocol, which gives numpy's own warning.
  if (writable && ((flags & NPY_ARRAY_WRITEABLE) == 0 || flags < 0)) return false;
  const auto* descr = reinterpret_cast<PyObject*>(PyArray_DESCR(a));
  const core::DType* dtype = nullptr;
  for (const auto& [known, d] : g_numpy.dtypes) {
    if (known == descr) {
      dtype = &d;
      break;
    }
  }
  if (dtype == nullptr) return false;
  const int ndim = PyArray_NDIM(a);
  const npy_intp* dims = PyArray_DIMS(a);
  size_t numel = 1;
  for (int i = 0; i < ndim; ++i) numel *= static_cast<size_t>(dims[i]);
  Py_INCREF(obj);  // a list item may lose its last other reference while the GIL is released
  buffer.array = obj;
  static_assert(sizeof(npy_intp) == sizeof(int64_t));
  out = {.data = PyArray_DATA(a),
         .numel = numel,
         .dtype = *dtype,
         .ndim = ndim,
         .sizes = reinterpret_cast<const int64_t*>(dims)};
  return true;
}
#endif

#ifdef C10D_ADOPT_ARRAYS
// Numpy arrays that a group's collectives use again get the zero-copy path of memory its backend
// shares with its peers (Backend::adopt; shm's heap, as shm_empty's arrays): from the second
// synchronous collective (adopt_if_reused) of C10D_SHM_ADOPT_BYTES or more on the memory of one
// array (the array that owns it: views count for their owner, so the buckets of a flat gradient
// buffer count together), the whole pages of the buffer, and only those, are adopted. A weak
// reference to the owner, taken at the first, forgets it when it goes, and gives the pages back
// before numpy frees the memory (numpy calls weak-reference callbacks first in its dealloc).
// Counting by address alone would take a fresh array where a dead one was for the same, and
// adopt (and soon release) arrays used once per step. numpy refuses to resize an array with weak
// references in place: that is the visible cost. The GIL guards this state; never destroyed
// (callbacks may run while the process exits).
struct Tracked {
  PyObject* owner = nullptr;  // borrowed: only a key of g_ref_of, dropped when it goes
  void* data = nullptr;       // the owner's memory when first seen
  size_t bytes = 0;
  int uses = 0;          // collectives counted so far; negative after a refusal (tried again at 2)
  bool adopted = false;  // some buffer inside [data, data + bytes) was
};
// A refused adoption is tried again after this many more collectives on the array.
constexpr int kRetryUses = 64;
auto& g_tracked = *new std::unordered_map<PyObject*, Tracked>;   // by weak reference
auto& g_ref_of = *new std::unordered_map<PyObject*, PyObject*>;  // owner -> weak reference

// The memory `t` recorded is no longer its owner's (ndarray.data assigned, __setstate__):
// numpy freed it, and what lies there now is not ours to touch.
void owner_memory_replaced(Tracked& t) {
  if (t.adopted) pg::forget_adopted_memory(t.data, t.bytes);
  t.adopted = false;
}

PyObject* owner_collected(PyObject* /*self*/, PyObject* weakref) {
  auto it = g_tracked.find(weakref);
  if (it != g_tracked.end()) {
    Tracked t = it->second;
    g_tracked.erase(it);
    g_ref_of.erase(t.owner);
    // numpy frees the owner's memory next (its data pointer is still valid here): the contents
    // do not matter. Memory it replaced earlier is someone else's now.
    auto* owner = reinterpret_cast<PyArrayObject*>(t.owner);
    if (PyArray_DATA(owner) != t.data || (PyArray_FLAGS(owner) & NPY_ARRAY_OWNDATA) == 0) {
      owner_memory_replaced(t);
    } else if (t.adopted) {
      pg::release_adopted_memory(t.data, t.bytes);
    }
    Py_DECREF(weakref);  // ours; the caller holds another for the callback
  }
  Py_RETURN_NONE;
}

PyMethodDef g_owner_collected_def = {"_owner_collected", owner_collected, METH_O, nullptr};

// The array that owns `array`'s memory (itself or the root of its chain of numpy bases), or
// null when the memory is someone else's (np.frombuffer, memmap, DLPack imports).
PyObject* memory_owner(PyObject* array) {
  PyObject* at = array;
  while ((PyArray_FLAGS(reinterpret_cast<PyArrayObject*>(at)) & NPY_ARRAY_OWNDATA) == 0) {
    PyObject* base = PyArray_BASE(reinterpret_cast<PyArrayObject*>(at));
    if (base == nullptr || Py_TYPE(base) != g_numpy.ndarray) return nullptr;
    at = base;
  }
  return at;
}

// The array's size in bytes, 0 if unknown. Asked of Python: numpy 2 keeps the item size
// behind its C API, which this file does not import (only ndarraytypes.h).
size_t array_bytes(PyObject* array) {
  PyObject* n = PyObject_GetAttrString(array, "nbytes");
  const Py_ssize_t bytes = n == nullptr ? -1 : PyLong_AsSsize_t(n);
  Py_XDECREF(n);
  if (bytes < 0) {
    PyErr_Clear();
    return 0;
  }
  return static_cast<size_t>(bytes);
}

// Counts a collective on the numpy array `array`, whose buffer is `view`, and from the second
// on its owner's memory adopts the whole pages of `view` (see above).
void adopt_reused(const InlineState& state, PyObject* array, const DenseView& view) {
  PyObject* owner = memory_owner(array);
  if (owner == nullptr) return;
  void* data = PyArray_DATA(reinterpret_cast<PyArrayObject*>(owner));
  const size_t bytes = array_bytes(owner);
  if (bytes == 0) return;
  auto found = g_ref_of.find(owner);
  if (found == g_ref_of.end()) {
    static PyObject* const callback = PyCFunction_New(&g_owner_collected_def, nullptr);
    PyObject* ref = callback == nullptr ? nullptr : PyWeakref_NewRef(owner, callback);
    if (ref == nullptr) {  // not to be tracked: never adopted
      PyErr_Clear();
      return;
    }
    g_ref_of.emplace(owner, ref);
    g_tracked.emplace(ref, Tracked{.owner = owner, .data = data, .bytes = bytes, .uses = 1});
    return;
  }
  Tracked& t = g_tracked[found->second];
  if (t.data != data || t.bytes != bytes) {
    owner_memory_replaced(t);
    t = Tracked{.owner = owner, .data = data, .bytes = bytes, .uses = 1};
    return;
  }
  // Unverified: the collective's own lookup checks the record (and drops it if stale) next.
  if (state.adopter->adopted(view.data, view.nbytes(), /*verify=*/false)) {
    t.adopted = true;  // perhaps by an array that had this memory before: released with this one
    return;
  }
  if (t.uses < 2) ++t.uses;
  if (t.uses < 2) return;
  switch (state.adopter->adopt(view.data, view.nbytes())) {
    case pg::Backend::Adoption::kDone:
      t.adopted = true;
      break;
    case pg::Backend::Adoption::kBusy:
      t.uses = 1;  // at the next collective again
      break;
    case pg::Backend::Adoption::kRefused:
      t.uses = 2 - kRetryUses;
      break;
  }
}
#endif

// Adoption for `view`, the buffer of an operation of kind `type` that its peers read in place
// when it lies in the shared heap: an all_reduce's or a broadcast's tensor, the input of an
// all_gather, gather or all_to_all, a message sent. (A reduce's root and a reduce_scatter read
// their peers' inputs through the slots.)
void adopt_if_reused(const InlineState& state, OpType type, const Buffer& buffer,
                     const DenseView& view) {
#ifdef C10D_ADOPT_ARRAYS
  switch (type) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kAllgather:
    case OpType::kAllgatherBase:
    case OpType::kGather:
    case OpType::kAlltoallBase:
    case OpType::kSend:
      break;
    default:
      return;
  }
  if (state.adopt_bytes != 0 && buffer.array != nullptr && state.adopter &&
      view.nbytes() >= state.adopt_bytes) {
    adopt_reused(state, buffer.array, view);
  }
#else
  (void)state, (void)type, (void)buffer, (void)view;
#endif
}

#ifndef C10D_HAVE_NUMPY_HEADERS
void load_numpy_types() {}  // without numpy's headers every array takes the buffer protocol
#endif

// Describes an object with __dlpack__ when it imports as a C-contiguous tensor; false, with no
// Python error set, otherwise (the general path then reports what is wrong).
bool dense_dlpack(PyObject* obj, Buffer& buffer, DenseView& out) {
  static PyObject* const name = PyUnicode_InternFromString("__dlpack__");
  if (!PyObject_HasAttr(obj, name)) return false;
  try {
    buffer.imported.emplace(from_dlpack_object(obj, "inline"));
  } catch (...) {  // pybind11 has already taken the Python error, if any
    PyErr_Clear();
    return false;
  }
  const core::Tensor& t = *buffer.imported;
  if (!t.is_contiguous()) return false;
  out = {.data = t.data(),
         .numel = static_cast<size_t>(t.numel()),
         .dtype = t.dtype(),
         .ndim = static_cast<int>(t.dim()),
         .sizes = t.sizes().data()};
  return true;
}

// Describes `obj` when it is a C-contiguous buffer of a supported dtype (writable if asked) or
// a tensor with __dlpack__; false, with no Python error set, otherwise.
bool dense(PyObject* obj, bool writable, Buffer& buffer, DenseView& out) {
#ifdef C10D_HAVE_NUMPY_HEADERS
  if (Py_TYPE(obj) == g_numpy.ndarray && dense_ndarray(obj, writable, buffer, out)) return true;
#endif
  if (!PyObject_CheckBuffer(obj)) return dense_dlpack(obj, buffer, out);  // always writable
  const int flags = PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj, &buffer.view, flags) != 0) {
    PyErr_Clear();
    return false;
  }
  buffer.held = true;
  const Py_buffer& v = buffer.view;
  if (v.itemsize <= 0 || !PyBuffer_IsContiguous(&v, 'C')) return false;
  const auto dtype = core::from_buffer_format(v.format != nullptr ? v.format : "B",
                                              static_cast<size_t>(v.itemsize));
  if (!dtype || core::element_size(*dtype) != static_cast<size_t>(v.itemsize)) return false;
  static_assert(sizeof(Py_ssize_t) == sizeof(int64_t));
  out = {.data = v.buf,
         .numel = static_cast<size_t>(v.len / v.itemsize),
         .dtype = *dtype,
         .ndim = v.ndim,
         .sizes = reinterpret_cast<const int64_t*>(v.shape)};
  return true;
}

bool reduce_kind(const InlineState& state, PyObject* obj, core::ReduceOp& op) {
  for (const auto& [member, kind] : state.kinds) {
    if (member.ptr() == obj) {
      op = kind;
      return true;
    }
  }
  return false;
}

bool int_arg(PyObject* obj, int& value) {
  if (!PyLong_CheckExact(obj)) return false;
  const long v = PyLong_AsLong(obj);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  if (v < INT32_MIN || v > INT32_MAX) return false;
  value = static_cast<int>(v);
  return true;
}

// The buffers of a list/tuple argument; None means no list.
// Lists of up to kInlineList buffers (the usual world sizes) need no allocation.
struct BufferList {
  static constexpr size_t kInlineList = 16;
  std::array<Buffer, kInlineList> local_buffers;
  std::array<DenseView, kInlineList> local_views;
  std::unique_ptr<Buffer[]> heap_buffers;
  std::unique_ptr<DenseView[]> heap_views;
  DenseView* views = nullptr;
  size_t size = 0;
};

bool dense_list(PyObject* obj, bool writable, BufferList& out) {
  if (obj == Py_None) return true;
  if (!PyList_CheckExact(obj) && !PyTuple_CheckExact(obj)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
  if (n < 0) return false;
  out.size = static_cast<size_t>(n);
  PyObject** items = PySequence_Fast_ITEMS(obj);
  Buffer* buffers = out.local_buffers.data();
  out.views = out.local_views.data();
  if (out.size > BufferList::kInlineList) {
    out.heap_buffers.reset(new Buffer[out.size]);
    out.heap_views.reset(new DenseView[out.size]);
    buffers = out.heap_buffers.get();
    out.views = out.heap_views.get();
  }
  for (size_t i = 0; i < out.size; ++i) {
    if (!dense(items[i], writable, buffers[i], out.views[i])) return false;
  }
  return true;
}

InlineState* state_of(PyObject* self) {
  return static_cast<InlineState*>(PyCapsule_GetPointer(self, nullptr));
}

bool check_nargs(Py_ssize_t nargs, Py_ssize_t expected, const char* name) {
  if (nargs == expected) return true;
  PyErr_Format(PyExc_TypeError, "%s takes exactly %zd arguments (%zd given)", name, expected,
               nargs);
  return false;
}

// Up to this many bytes in all, an operation keeps the GIL until it would block (see
// core/blocking.h): releasing and retaking it costs ~40 ns, a tenth of a small collective.
// Larger ones release it at once, as their copies alone take microseconds.
constexpr size_t kKeepGilBytes = size_t{16} << 10;

size_t total_bytes(const InlineOp& op) {
  size_t bytes = op.input.nbytes() + op.output.nbytes();
  for (size_t i = 0; i < op.list_size; ++i) bytes += op.list[i].nbytes();
  return bytes;
}

void release_gil(void* saved) { *static_cast<PyThreadState**>(saved) = PyEval_SaveThread(); }

// Runs `op` without holding the GIL while it waits: True if it ran (an asynchronous one's
// Work instead), False if the inline path did not apply, NULL with the Python error set if it
// failed.
PyObject* run(InlineState& state, const InlineOp& op) {
  bool done = false;
  pg::WorkPtr work;
  std::exception_ptr error;
  PyThreadState* saved = nullptr;
  {
    core::BlockingNoticeScope notice(release_gil, &saved);
    // Posting an asynchronous operation does not wait, and its hold needs the GIL.
    if (total_bytes(op) > kKeepGilBytes && !op.hold) core::before_blocking();
    try {
      done = state.group->run_inline(op, &work);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (saved != nullptr) PyEval_RestoreThread(saved);
  if (error) {
    set_python_error(error);
    return nullptr;
  }
  if (done && work) {
    if (work.get() == state.quiet_work) return state.quiet_object.inc_ref().ptr();
    try {
      py::object out = py::cast(work);
      if (work->is_completed() && work->is_success() && work->result().empty()) {
        state.quiet_work = work.get();
        state.quiet_object = out;
      }
      return out.release().ptr();
    } catch (...) {
      set_python_error(std::current_exception());
      return nullptr;
    }
  }
  return PyBool_FromLong(done);
}

// In place on one tensor: allreduce(tensor, op) / broadcast(tensor, root) /
// reduce(tensor, root, op).
PyObject* in_place(PyObject* self, PyObject* const* args, Py_ssize_t nargs, OpType type,
                   const char* name, bool with_root, bool with_op) {
  InlineState* state = state_of(self);
  if (state == nullptr || !check_nargs(nargs, 1 + with_root + with_op, name)) return nullptr;
  Buffer buffer;
  InlineOp op;
  op.type = type;
  if ((with_root && !int_arg(args[1], op.root)) ||
      (with_op && !reduce_kind(*state, args[1 + with_root], op.reduce_op)) ||
      !dense(args[0], true, buffer, op.input)) {
    Py_RETURN_FALSE;
  }
  adopt_if_reused(*state, type, buffer, op.input);
  return run(*state, op);
}

PyObject* allreduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return in_place(self, args, nargs, OpType::kAllreduce, "allreduce", false, true);
}

PyObject* broadcast(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return in_place(self, args, nargs, OpType::kBroadcast, "broadcast", true, false);
}

PyObject* reduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return in_place(self, args, nargs, OpType::kReduce, "reduce", true, true);
}

// (output, input) pairs: all_gather_into_tensor, reduce_scatter_tensor(+ op), all_to_all_single.
PyObject* output_input(PyObject* self, PyObject* const* args, Py_ssize_t nargs, OpType type,
                       const char* name, bool with_op) {
  InlineState* state = state_of(self);
  if (state == nullptr || !check_nargs(nargs, with_op ? 3 : 2, name)) return nullptr;
  Buffer out, in;
  InlineOp op;
  op.type = type;
  if ((with_op && !reduce_kind(*state, args[2], op.reduce_op)) ||
      !dense(args[0], true, out, op.output) || !dense(args[1], false, in, op.input)) {
    Py_RETURN_FALSE;
  }
  adopt_if_reused(*state, type, in, op.input);
  return run(*state, op);
}

PyObject* all_gather_into_tensor(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return output_input(self, args, nargs, OpType::kAllgatherBase, "all_gather_into_tensor", false);
}

PyObject* reduce_scatter_tensor(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return output_input(self, args, nargs, OpType::kReduceScatterBase, "reduce_scatter_tensor", true);
}

PyObject* all_to_all_single(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return output_input(self, args, nargs, OpType::kAlltoallBase, "all_to_all_single", false);
}

// The collectives with a list of per-rank tensors: gather(tensor, gather_list or None, root),
// scatter(tensor, scatter_list or None, root), all_gather(output_list, input) and
// reduce_scatter(output, input_list, op). The gathering ones' list holds their outputs.
PyObject* list_op(PyObject* self, PyObject* const* args, Py_ssize_t nargs, OpType type,
                  const char* name) {
  InlineState* state = state_of(self);
  const bool gathers = type == OpType::kGather || type == OpType::kAllgather;
  const bool rooted = type == OpType::kGather || type == OpType::kScatter;
  const int list_at = type == OpType::kAllgather ? 0 : 1;
  if (state == nullptr || !check_nargs(nargs, type == OpType::kAllgather ? 2 : 3, name)) {
    return nullptr;
  }
  Buffer mine;
  BufferList list;
  InlineOp op;
  op.type = type;
  if ((rooted && !int_arg(args[2], op.root)) ||
      (type == OpType::kReduceScatter && !reduce_kind(*state, args[2], op.reduce_op)) ||
      !dense(args[1 - list_at], !gathers, mine, gathers ? op.input : op.output) ||
      !dense_list(args[list_at], gathers, list)) {
    Py_RETURN_FALSE;
  }
  op.list = list.views;
  op.list_size = list.size;
  if (gathers) adopt_if_reused(*state, type, mine, op.input);
  return run(*state, op);
}

PyObject* gather(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return list_op(self, args, nargs, OpType::kGather, "gather");
}

PyObject* scatter(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return list_op(self, args, nargs, OpType::kScatter, "scatter");
}

PyObject* all_gather(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return list_op(self, args, nargs, OpType::kAllgather, "all_gather");
}

PyObject* reduce_scatter(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return list_op(self, args, nargs, OpType::kReduceScatter, "reduce_scatter");
}

// The buffer dense() read from `obj`, as a tensor that holds `obj` (and an import's owner)
// for an asynchronous operation that outlives the call (InlineOp::hold).
struct Held {
  PyObject* obj;
  const Buffer* buffer;
  const DenseView* view;
};

core::Tensor hold(const void* context) {
  const auto& h = *static_cast<const Held*>(context);
  if (h.buffer->imported) return with_source(*h.buffer->imported, h.obj);
  const DenseView& v = *h.view;
  return with_source(core::Tensor(v.data, v.dtype, std::vector<int64_t>(v.sizes, v.sizes + v.ndim)),
                     h.obj);
}

// Point to point with the default group: send(tensor, dst, tag) and recv(tensor, src, tag)
// return True once done; isend and irecv (`async`) return the posted operation's Work.
PyObject* p2p(PyObject* self, PyObject* const* args, Py_ssize_t nargs, OpType type,
              const char* name, bool async) {
  InlineState* state = state_of(self);
  if (state == nullptr || !check_nargs(nargs, 3, name)) return nullptr;
  const bool send = type == OpType::kSend;
  Buffer buffer;
  InlineOp op;
  op.type = type;
  DenseView& view = send ? op.input : op.output;
  if (!int_arg(args[1], op.root) || !int_arg(args[2], op.tag) ||
      !dense(args[0], !send, buffer, view)) {
    Py_RETURN_FALSE;
  }
  adopt_if_reused(*state, type, buffer, view);
  const Held held{args[0], &buffer, &view};
  if (async) {
    // Other buffer-protocol exporters (bytearray, array.array) pin their memory only while
    // exported: the general path keeps their export.
    if (!buffer.imported && buffer.array == nullptr) Py_RETURN_FALSE;
    op.hold = {&hold, &held};
  }
  return run(*state, op);
}

PyObject* send(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return p2p(self, args, nargs, OpType::kSend, "send", false);
}

PyObject* recv(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return p2p(self, args, nargs, OpType::kRecv, "recv", false);
}

PyObject* isend(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return p2p(self, args, nargs, OpType::kSend, "isend", true);
}

PyObject* irecv(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return p2p(self, args, nargs, OpType::kRecv, "irecv", true);
}

PyObject* barrier(PyObject* self, PyObject* const* /*args*/, Py_ssize_t nargs) {
  InlineState* state = state_of(self);
  if (state == nullptr || !check_nargs(nargs, 0, "barrier")) return nullptr;
  InlineOp op;
  op.type = OpType::kBarrier;
  return run(*state, op);
}

template <PyObject* (*Fn)(PyObject*, PyObject* const*, Py_ssize_t)>
constexpr PyCFunction fastcall() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Fn));
}

PyMethodDef g_methods[] = {
    {"allreduce", fastcall<allreduce>(), METH_FASTCALL, "allreduce(tensor, op) -> bool"},
    {"broadcast", fastcall<broadcast>(), METH_FASTCALL, "broadcast(tensor, root) -> bool"},
    {"reduce", fastcall<reduce>(), METH_FASTCALL, "reduce(tensor, root, op) -> bool"},
    {"all_gather_into_tensor", fastcall<all_gather_into_tensor>(), METH_FASTCALL,
     "all_gather_into_tensor(output, input) -> bool"},
    {"reduce_scatter_tensor", fastcall<reduce_scatter_tensor>(), METH_FASTCALL,
     "reduce_scatter_tensor(output, input, op) -> bool"},
    {"all_to_all_single", fastcall<all_to_all_single>(), METH_FASTCALL,
     "all_to_all_single(output, input) -> bool (equal splits)"},
    {"all_gather", fastcall<all_gather>(), METH_FASTCALL,
     "all_gather(tensor_list, tensor) -> bool"},
    {"reduce_scatter", fastcall<reduce_scatter>(), METH_FASTCALL,
     "reduce_scatter(output, input_list, op) -> bool"},
    {"gather", fastcall<gather>(), METH_FASTCALL, "gather(tensor, gather_list, root) -> bool"},
    {"scatter", fastcall<scatter>(), METH_FASTCALL, "scatter(tensor, scatter_list, root) -> bool"},
    {"barrier", fastcall<barrier>(), METH_FASTCALL, "barrier() -> bool"},
    {"send", fastcall<send>(), METH_FASTCALL, "send(tensor, dst, tag) -> bool"},
    {"recv", fastcall<recv>(), METH_FASTCALL, "recv(tensor, src, tag) -> bool"},
    {"isend", fastcall<isend>(), METH_FASTCALL, "isend(tensor, dst, tag) -> Work or False"},
    {"irecv", fastcall<irecv>(), METH_FASTCALL, "irecv(tensor, src, tag) -> Work or False"},
};

}  // namespace

py::dict make_inline_ops(std::shared_ptr<pg::ProcessGroup> group) {
  load_numpy_types();
  auto state = std::make_unique<InlineState>();
  state->group = std::move(group);
#ifdef C10D_ADOPT_ARRAYS
  try {
    auto cpu = state->group->get_backend(core::DeviceType::kCPU);
    if (cpu && cpu->adopts_memory()) state->adopter = std::move(cpu);
  } catch (const std::exception&) {
    // No CPU backend: nothing to adopt for.
  }
  state->adopt_bytes =
      static_cast<size_t>(std::max<int64_t>(0, core::env_int(core::kEnvShmAdoptBytes)));
#endif
  py::dict members =
      py::module_::import("c10d._C").attr("ReduceOp").attr("RedOpType").attr("__members__");
  for (auto [name, member] : members) {
    const auto kind = member.cast<core::ReduceOp::Kind>();
    if (kind != core::ReduceOp::PREMUL_SUM && kind != core::ReduceOp::UNUSED) {
      state->kinds.emplace_back(py::reinterpret_borrow<py::object>(member), kind);
    }
  }
  // Unnamed: a name costs a strcmp in every PyCapsule_GetPointer, i.e. in every call.
  PyObject* raw = PyCapsule_New(state.get(), nullptr, [](PyObject* c) {
    delete static_cast<InlineState*>(PyCapsule_GetPointer(c, nullptr));
  });
  if (raw == nullptr) throw py::error_already_set();
  state.release();
  py::object capsule = py::reinterpret_steal<py::object>(raw);
  py::dict out;
  for (PyMethodDef& def : g_methods) {
    PyObject* fn = PyCFunction_NewEx(&def, capsule.ptr(), nullptr);
    if (fn == nullptr) throw py::error_already_set();
    out[def.ml_name] = py::reinterpret_steal<py::object>(fn);
  }
  return out;
}

}  // namespace c10d::python
