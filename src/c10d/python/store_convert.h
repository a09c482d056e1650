// Conversions between Python str/bytes and store byte strings, shared by the store bindings.
#pragma once

#include <pybind11/pybind11.h>

#include "c10d/store/store.h"

namespace c10d::python {

// Accepts str (encoded as UTF-8), bytes, bytearray or any buffer of bytes.
inline store::Bytes bytes_from_python(pybind11::handle value) {
  if (PyUnicode_Check(value.ptr())) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
    if (data == nullptr) throw pybind11::error_already_set();
    return store::Bytes(data, data + size);
  }
  if (PyBytes_Check(value.ptr())) {
    const char* data = PyBytes_AS_STRING(value.ptr());
    return store::Bytes(data, data + PyBytes_GET_SIZE(value.ptr()));
  }
  if (PyObject_CheckBuffer(value.ptr())) {
    pybind11::buffer_info info = pybind11::reinterpret_borrow<pybind11::buffer>(value).request();
    const auto* data = static_cast<const uint8_t*>(info.ptr);
    return store::Bytes(data, data + info.size * info.itemsize);
  }
  throw pybind11::type_error(
      "store values must be str or bytes, got " +
      pybind11::str(pybind11::type::of(value).attr("__name__")).cast<std::string>());
}

inline pybind11::bytes to_pybytes(const store::Bytes& value) {
  return pybind11::bytes(reinterpret_cast<const char*>(value.data()), value.size());
}

}  // namespace c10d::python
