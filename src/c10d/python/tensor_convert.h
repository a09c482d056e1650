// Conversions between Python objects and core::Tensor, shared by every binding that takes or
// returns tensors. Zero-copy in both directions.
#pragma once

#include <pybind11/pybind11.h>

#include <string_view>
#include <vector>

#include "c10d/core/tensor.h"

namespace c10d::python {

// Wraps `obj` without copying. Accepts objects with the buffer protocol (numpy arrays,
// bytearray, memoryview, array.array) and objects with `__dlpack__` (PyTorch tensors, numpy).
// With `writable`, a read-only buffer is rejected. Errors are TypeError/ValueError naming
// `what` (e.g. "all_reduce: tensor").
core::Tensor to_tensor(pybind11::handle obj, bool writable, std::string_view what);
std::vector<core::Tensor> to_tensors(pybind11::handle seq, bool writable, std::string_view what);
// The __dlpack__ half of to_tensor, for callers that know `obj` has no buffer protocol. A
// tensor that requires grad (torch) is exported through detach(), and a dtype DLPack cannot
// carry through the object's numpy() view. Unlike to_tensor, the result does not keep `obj`
// (the inline path needs no result object and no extra allocation).
core::Tensor from_dlpack_object(pybind11::handle obj, std::string_view what);

// `t` (whose memory `obj` exported) with `obj` kept alive beside its owner, so that
// to_python() hands `obj` back.
core::Tensor with_source(const core::Tensor& t, pybind11::handle obj);

// A Python view of a tensor's memory: a numpy array when the dtype exists in numpy, otherwise
// a DLPack capsule. The array keeps the memory alive.
pybind11::object from_tensor(const core::Tensor& tensor);
// The caller's own object when `tensor` is exactly a tensor it passed in (the numpy array,
// torch tensor, ... that to_tensor converted), else from_tensor(tensor). Results handed back
// to Python (Work.result, Future values) use this, so they are the caller's tensors, as in
// torch.distributed.
pybind11::object to_python(const core::Tensor& tensor);

// A DLPack capsule ("dltensor") sharing the tensor's memory.
pybind11::capsule to_dlpack_capsule(const core::Tensor& tensor);

// Registers the conversion test helpers (_tensor_info, _as_numpy, _to_dlpack).
void init_tensor(pybind11::module_& m);

}  // namespace c10d::python
