#include "c10d/python/tensor_convert.h"

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>

#include "c10d/core/exception.h"
#include "c10d/python/bindings.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

using core::detail::str_cat;

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")); }

// Owners of converted tensors, named so that to_python() can find the caller's object again.
// A buffer's owner is its Py_buffer (whose `obj` is the exporter, e.g. the numpy array)...
struct ReleaseBuffer {
  void operator()(void* p) const {
    auto* buffer = static_cast<Py_buffer*>(p);
    GilGuard gil;
    if (gil) PyBuffer_Release(buffer);  // else the export is leaked with the interpreter
    delete buffer;
  }
};

// ... and a tensor to_tensor imported another way (DLPack, say) keeps the object it came from
// (a torch tensor) next to the owner of its memory.
struct PythonSource {
  std::shared_ptr<py::object> object;  // released under the GIL (hold_python)
  std::shared_ptr<void> memory;
  const void* data;
  std::vector<int64_t> sizes;
};
struct DeletePythonSource {
  void operator()(void* p) const { delete static_cast<PythonSource*>(p); }
};

core::Tensor from_buffer(py::handle obj, bool writable, std::string_view what) {
  auto view = std::make_unique<Py_buffer>();
  int flags = PyBUF_RECORDS_RO;  // strides + format
  if (writable) flags |= PyBUF_WRITABLE;
  if (PyObject_GetBuffer(obj.ptr(), view.get(), flags) != 0) {
    PyErr_Clear();
    if (writable && PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_RECORDS_RO) == 0) {
      PyBuffer_Release(view.get());
      throw py::value_error(str_cat(what, ": the ", type_name(obj),
                                    " is read-only, but this operation writes into it"));
    }
    PyErr_Clear();
    throw py::type_error(str_cat(what, ": cannot read a buffer from ", type_name(obj)));
  }
  // From here the buffer is released by the owner, whichever thread drops the last reference.
  std::shared_ptr<void> owner(view.release(), ReleaseBuffer{});
  auto* buffer = static_cast<Py_buffer*>(owner.get());
  const std::string format = buffer->format != nullptr ? buffer->format : "B";
  auto dtype = core::from_buffer_format(format, static_cast<size_t>(buffer->itemsize));
  if (!dtype) {
    // Name the dtype as the user wrote it (numpy's), not only the buffer format code.
    std::string named;
    try {
      if (py::hasattr(obj, "dtype")) {
        named = " of dtype " + py::str(obj.attr("dtype")).cast<std::string>();
      }
    } catch (const py::error_already_set&) {
    }
    std::string supported;
    for (int i = 0; i < core::kNumDTypes; ++i) {
      supported += str_cat(i ? ", " : "", core::dtype_name(static_cast<core::DType>(i)));
    }
    throw py::type_error(str_cat(what, ": unsupported element type: ", type_name(obj), named,
                                 " (buffer format '", format, "', itemsize ", buffer->itemsize,
                                 "); supported: ", supported, ", in native byte order"));
  }
  std::vector<int64_t> sizes(buffer->shape, buffer->shape + buffer->ndim);
  std::vector<int64_t> strides;
  for (int i = 0; i < buffer->ndim; ++i) {
    if (buffer->strides[i] % buffer->itemsize != 0) {
      throw py::value_error(str_cat(what, ": strides of the ", type_name(obj),
                                    " are not a multiple of its element size"));
    }
    strides.push_back(buffer->strides[i] / buffer->itemsize);
  }
  if (buffer->ndim == 0 && buffer->shape == nullptr) sizes.clear();
  return core::Tensor(buffer->buf, *dtype, std::move(sizes), std::move(strides), std::move(owner));
}

}  // namespace

core::Tensor with_source(const core::Tensor& t, py::handle obj) {
  std::shared_ptr<void> owner(new PythonSource{hold_python(py::reinterpret_borrow<py::object>(obj)),
                                               t.owner(), t.data(), t.sizes()},
                              DeletePythonSource{});
  return core::Tensor(t.data(), t.dtype(), t.sizes(), t.strides(), std::move(owner), t.device());
}

core::Tensor from_dlpack_object(py::handle obj, std::string_view what) {
  static PyObject* const requires_grad = PyUnicode_InternFromString("requires_grad");
  static PyObject* const detach = PyUnicode_InternFromString("detach");
  static PyObject* const dlpack = PyUnicode_InternFromString("__dlpack__");
  // Collectives are not autograd operations (as in torch.distributed): a tensor that requires
  // grad, such as a torch Parameter, is used through a detached view of the same memory, as
  // torch refuses to export it directly.
  py::object source = py::reinterpret_borrow<py::object>(obj);
  py::object grad = py::reinterpret_steal<py::object>(PyObject_GetAttr(obj.ptr(), requires_grad));
  if (!grad) {
    PyErr_Clear();
  } else if (PyObject_IsTrue(grad.ptr()) == 1 && PyObject_HasAttr(obj.ptr(), detach)) {
    source = source.attr(detach)();
  }
  py::object capsule;
  try {
    capsule = source.attr(dlpack)();
  } catch (py::error_already_set& e) {
    // A torch tensor that is not dense cannot be exported at all: say so in our words.
    const py::object layout = py::getattr(source, "layout", py::none());
    const std::string kind = layout.is_none() ? "" : py::str(layout).cast<std::string>();
    if (!kind.empty() && kind != "torch.strided") {
      throw py::type_error(str_cat(what, ": tensors of layout ", kind,
                                   " are not supported, only "
                                   "dense (strided) ones; all_reduce (SUM) also takes sparse "
                                   "COO tensors"));
    }
    // Some exporters cannot put every dtype in DLPack (torch 1.13 refuses bool); one that also
    // offers a numpy view of the same memory is used through it.
    static PyObject* const numpy = PyUnicode_InternFromString("numpy");
    if (!PyObject_HasAttr(source.ptr(), numpy)) throw;
    py::object array;
    try {
      array = source.attr(numpy)();
    } catch (py::error_already_set&) {
      throw e;
    }
    return from_buffer(array, false, what);
  }
  PyObject* raw = capsule.ptr();
  if (!PyCapsule_IsValid(raw, "dltensor")) {
    throw py::type_error(str_cat(what, ": __dlpack__ of ", type_name(obj),
                                 " did not return an unused 'dltensor' capsule"));
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(raw, "dltensor"));
  // Mark the capsule consumed: from here the tensor's owner calls the deleter.
  PyCapsule_SetName(raw, "used_dltensor");
  core::Tensor imported;
  try {
    imported = core::Tensor::from_dlpack(managed);
  } catch (const core::InvalidArgument& e) {
    throw py::type_error(str_cat(what, ": ", e.what()));
  }
  // The exporter's deleter may take the GIL itself (torch 2's drops its tensor's Python
  // object), also on the backend thread that drops the last reference: it runs under the
  // GilGuard, and not at all once the interpreter is closing (leaked with it).
  auto* dlpack_owner = new std::shared_ptr<void>(imported.owner());
  std::shared_ptr<void> owner(dlpack_owner, [](void* p) {
    auto* held = static_cast<std::shared_ptr<void>*>(p);
    GilGuard gil;
    if (gil) delete held;
  });
  return core::Tensor(imported.data(), imported.dtype(), imported.sizes(), imported.strides(),
                      std::move(owner), imported.device());
}

// Torch's words for a parameter that is not a tensor.
constexpr std::string_view kInvalidArgument = "Invalid function argument. ";

core::Tensor to_tensor(py::handle obj, bool writable, std::string_view what) {
  if (obj.is_none()) {
    throw py::type_error(str_cat(kInvalidArgument, what, ": expected a tensor, got None"));
  }
  // numpy arrays answer both protocols; the buffer protocol also covers read-only arrays and
  // bool, so it goes first. Torch tensors have only __dlpack__.
  if (PyObject_CheckBuffer(obj.ptr()) && !py::isinstance<py::str>(obj)) {
    return from_buffer(obj, writable, what);
  }
  // The tensor keeps `obj` too, so that results hand the caller's object back (to_python).
  if (py::hasattr(obj, "__dlpack__")) return with_source(from_dlpack_object(obj, what), obj);
  throw py::type_error(str_cat(kInvalidArgument, what,
                               ": expected a tensor (numpy "
                               "array, buffer or object with __dlpack__), got ",
                               type_name(obj)));
}

std::vector<core::Tensor> to_tensors(py::handle seq, bool writable, std::string_view what) {
  // Lists and tuples are the common case and need no further probing.
  const bool list_like = PyList_Check(seq.ptr()) || PyTuple_Check(seq.ptr());
  if (!list_like && (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq) ||
                     PyObject_CheckBuffer(seq.ptr()) || py::hasattr(seq, "__dlpack__"))) {
    throw py::type_error(str_cat(what, ": expected a list of tensors, got ", type_name(seq)));
  }
  std::vector<core::Tensor> out;
  out.reserve(static_cast<size_t>(PyObject_Length(seq.ptr())));
  size_t i = 0;
  // Messages name the element ("all_gather output[2]: ..."), built only on failure.
  auto with_index = [&](const char* message) {
    std::string_view text(message);
    const bool invalid = text.starts_with(kInvalidArgument);
    if (invalid) text.remove_prefix(kInvalidArgument.size());
    if (text.starts_with(what)) text.remove_prefix(what.size());
    return str_cat(invalid ? kInvalidArgument : std::string_view(), what, "[", i, "]", text);
  };
  for (py::handle item : seq) {
    try {
      out.push_back(to_tensor(item, writable, what));
    } catch (const py::type_error& e) {
      throw py::type_error(with_index(e.what()));
    } catch (const py::value_error& e) {
      throw py::value_error(with_index(e.what()));
    }
    ++i;
  }
  return out;
}

py::capsule to_dlpack_capsule(const core::Tensor& tensor) {
  DLManagedTensor* managed = tensor.to_dlpack();
  return py::capsule(managed, "dltensor", [](PyObject* capsule) {
    // Only a capsule nobody consumed still owns its tensor.
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      if (m != nullptr && m->deleter != nullptr) m->deleter(m);
    }
  });
}

py::object from_tensor(const core::Tensor& tensor) {
  if (tensor.dtype() == core::DType::kBFloat16 || tensor.device().type != core::DeviceType::kCPU) {
    return to_dlpack_capsule(tensor);
  }
  const size_t elem = tensor.element_size();
  std::vector<py::ssize_t> shape(tensor.sizes().begin(), tensor.sizes().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : tensor.strides()) strides.push_back(static_cast<py::ssize_t>(s * elem));
  auto* keep = new core::Tensor(tensor);
  py::capsule base(keep, [](void* p) { delete static_cast<core::Tensor*>(p); });
  py::dtype dtype(std::string(core::dtype_name(tensor.dtype())));
  return py::array(dtype, shape, strides, tensor.data(), base);
}

py::object to_python(const core::Tensor& tensor) {
  const std::shared_ptr<void>& owner = tensor.owner();
  if (std::get_deleter<ReleaseBuffer>(owner) != nullptr) {
    const auto* buffer = static_cast<const Py_buffer*>(owner.get());
    const bool whole = buffer->obj != nullptr && buffer->buf == tensor.data() &&
                       static_cast<size_t>(buffer->len) == tensor.nbytes() &&
                       std::equal(tensor.sizes().begin(), tensor.sizes().end(), buffer->shape,
                                  buffer->shape + buffer->ndim);
    if (whole) return py::reinterpret_borrow<py::object>(buffer->obj);
  } else if (std::get_deleter<DeletePythonSource>(owner) != nullptr) {
    const auto* source = static_cast<const PythonSource*>(owner.get());
    if (source->data == tensor.data() && source->sizes == tensor.sizes()) return *source->object;
  }
  return from_tensor(tensor);
}

void init_tensor(py::module_& m) {
  m.def(
      "_tensor_info",
      [](py::handle obj) {
        core::Tensor t = to_tensor(obj, false, "_tensor_info");
        py::dict info;
        info["dtype"] = std::string(core::dtype_name(t.dtype()));
        info["sizes"] = t.sizes();
        info["strides"] = t.strides();
        info["contiguous"] = t.is_contiguous();
        info["nbytes"] = t.nbytes();
        info["numel"] = t.numel();
        info["data_ptr"] = reinterpret_cast<uintptr_t>(t.data());
        info["device"] = t.device().str();
        return info;
      },
      py::arg("tensor"), "Describes how c10d sees a tensor-like object (for tests).");
  m.def(
      "_as_numpy", [](py::handle obj) { return from_tensor(to_tensor(obj, false, "_as_numpy")); },
      py::arg("tensor"), "A zero-copy numpy (or DLPack) view of a tensor-like object.");
  m.def(
      "_to_dlpack",
      [](py::handle obj) { return to_dlpack_capsule(to_tensor(obj, false, "_to_dlpack")); },
      py::arg("tensor"), "A zero-copy DLPack capsule of a tensor-like object.");
  m.def(
      "_empty",
      [](std::vector<int64_t> sizes, const std::string& dtype) {
        auto parsed = core::dtype_from_name(dtype);
        if (!parsed) throw py::value_error("unknown dtype '" + dtype + "'");
        return from_tensor(core::Tensor::empty(std::move(sizes), *parsed));
      },
      py::arg("sizes"), py::arg("dtype") = "float32",
      "Uninitialised, 64-byte aligned storage allocated by c10d.");
}

}  // namespace c10d::python
