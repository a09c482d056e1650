// Bindings of ReduceOp, shaped like torch.distributed.ReduceOp: a class with a nested enum
// `RedOpType` whose values are also class attributes (ReduceOp.SUM is a RedOpType), so code
// written for torch (`op == ReduceOp.SUM`, `ReduceOp(ReduceOp.MAX)`, pickling ops, using them
// as dict keys) works unchanged. Also the buffer-level test helpers over the reduction kernels.
#include <pybind11/eval.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "c10d/core/dtype.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"
#include "c10d/core/reduce_op.h"
#include "c10d/python/bindings.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

using core::DType;
using core::ReduceOp;

// The kind behind a ReduceOp or a RedOpType; nothing for any other object.
std::optional<ReduceOp::Kind> kind_of(py::handle obj) {
  if (py::isinstance<ReduceOp>(obj)) return obj.cast<const ReduceOp&>().kind;
  if (py::isinstance<ReduceOp::Kind>(obj)) return obj.cast<ReduceOp::Kind>();
  return std::nullopt;
}

// Equality shared by both classes: compares kinds (the premul factor is ignored, as in torch)
// and defers to the other operand's type for anything else.
py::object equal(py::handle self, py::handle other, bool negate) {
  auto a = kind_of(self), b = kind_of(other);
  if (!a || !b) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
  return py::bool_((*a == *b) != negate);
}

std::string repr(const ReduceOp& op) {
  std::string out = "ReduceOp(" + std::string(op.name());
  if (op.kind == ReduceOp::PREMUL_SUM)
    out += ", factor=" + py::repr(py::float_(op.premul_factor)).cast<std::string>();
  return out + ")";
}

DType parse_dtype(const std::string& name) {
  auto dtype = core::dtype_from_name(name);
  C10D_CHECK_ARG(dtype.has_value(), "unknown dtype '", name, "'");
  return *dtype;
}

// A C-contiguous buffer holding elements of `dtype`; its own format is not consulted (so a
// uint16 view can carry bfloat16), only its item size. Returns the element count.
size_t checked_count(const py::buffer_info& info, DType dtype, const char* what) {
  const auto elem = static_cast<py::ssize_t>(core::element_size(dtype));
  C10D_CHECK_ARG(info.itemsize == elem, what, ": item size ", info.itemsize, " does not match ",
                 core::dtype_name(dtype), " (", elem, " bytes)");
  py::ssize_t expected_stride = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    C10D_CHECK_ARG(info.shape[d] == 1 || info.strides[d] == expected_stride, what,
                   ": buffer is not contiguous");
    expected_stride *= info.shape[d];
  }
  return static_cast<size_t>(info.size);
}

// A metaclass for ReduceOp under which isinstance(ReduceOp.SUM, ReduceOp) holds: the members
// are RedOpType values, which stand for a ReduceOp wherever one is taken, and user code written
// for torch's old enum checks them with isinstance.
py::object reduce_op_metaclass() {
  py::dict scope;
  scope["base"] = py::reinterpret_borrow<py::object>(
      reinterpret_cast<PyObject*>(py::detail::get_internals().default_metaclass));
  py::exec(R"(
class ReduceOpMeta(base):
    def __instancecheck__(cls, obj):
        return type.__instancecheck__(cls, obj) or type(obj) is cls.__dict__.get("RedOpType")
)",
           scope);
  return scope["ReduceOpMeta"];
}

}  // namespace

void init_reduce(py::module_& m) {
  py::class_<ReduceOp> cls(m, "ReduceOp", py::metaclass(reduce_op_metaclass()),
                           R"(How a reducing collective combines the ranks' values.

The values are ``ReduceOp.SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``, ``BAND``, ``BOR``,
``BXOR``, ``PREMUL_SUM`` and ``UNUSED``, each a ``ReduceOp.RedOpType`` accepted wherever a
``ReduceOp`` is. ``_make_nccl_premul_sum(factor)`` builds a PREMUL_SUM with its factor.)");

  py::enum_<ReduceOp::Kind> kinds(cls, "RedOpType");
  for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
    const auto kind = static_cast<ReduceOp::Kind>(k);
    kinds.value(std::string(ReduceOp(kind).name()).c_str(), kind);
  }
  kinds.export_values();
  // pybind11's enum equality answers False for any other type; replace it so that
  // ReduceOp.SUM == ReduceOp(ReduceOp.SUM) holds in both directions.
  kinds.attr("__eq__") =
      py::cpp_function([](py::handle self, py::handle other) { return equal(self, other, false); },
                       py::is_method(kinds), py::name("__eq__"));
  kinds.attr("__ne__") =
      py::cpp_function([](py::handle self, py::handle other) { return equal(self, other, true); },
                       py::is_method(kinds), py::name("__ne__"));

  cls.def(py::init<>(), "ReduceOp.SUM.")
      .def(py::init<ReduceOp::Kind>(), py::arg("op"))
      .def(
          "__eq__", [](py::handle self, py::handle other) { return equal(self, other, false); },
          py::is_operator())
      .def(
          "__ne__", [](py::handle self, py::handle other) { return equal(self, other, true); },
          py::is_operator())
      // Hash of the kind, so equal objects (including a RedOpType) hash alike.
      .def("__hash__",
           [](const ReduceOp& self) { return py::hash(py::int_(static_cast<int>(self.kind))); })
      .def("__repr__", &repr)
      .def("__copy__", [](const ReduceOp& self) { return ReduceOp(self); })
      .def(
          "__deepcopy__", [](const ReduceOp& self, py::dict) { return ReduceOp(self); },
          py::arg("memo"))
      .def(py::pickle(
          [](const ReduceOp& self) {
            // None for a PREMUL_SUM without a factor.
            return py::make_tuple(static_cast<int>(self.kind),
                                  self.has_factor || self.kind != ReduceOp::PREMUL_SUM
                                      ? py::object(py::float_(self.premul_factor))
                                      : py::object(py::none()));
          },
          [](const py::tuple& state) {
            C10D_CHECK_ARG(state.size() == 2, "ReduceOp: bad pickle state of size ", state.size());
            const int kind = state[0].cast<int>();
            C10D_CHECK_ARG(kind >= 0 && kind < ReduceOp::kNumKinds, "ReduceOp: bad kind ", kind);
            ReduceOp op(static_cast<ReduceOp::Kind>(kind));
            if (!state[1].is_none()) {
              op.premul_factor = state[1].cast<double>();
              op.has_factor = op.kind == ReduceOp::PREMUL_SUM;
            }
            return op;
          }))
      .def_property_readonly(
          "op", [](const ReduceOp& self) { return self.kind; }, "The RedOpType of this op.")
      .def_property_readonly(
          "premul_factor", [](const ReduceOp& self) { return self.premul_factor; },
          "The factor of a PREMUL_SUM (1.0 for other ops).")
      .def_property_readonly("name", [](const ReduceOp& self) { return std::string(self.name()); });
  cls.attr("__members__") = kinds.attr("__members__");

  py::implicitly_convertible<ReduceOp::Kind, ReduceOp>();

  const char* premul_doc =
      "A PREMUL_SUM ReduceOp: every input is multiplied by `factor` before summing.";
  m.def("_make_premul_sum", &ReduceOp::premul_sum, py::arg("factor"), premul_doc);
  m.def("_make_nccl_premul_sum", &ReduceOp::premul_sum, py::arg("factor"), premul_doc);

  m.def(
      "_check_reduce_op",
      [](const ReduceOp& op, const std::string& dtype) {
        core::check_reduce_op(parse_dtype(dtype), op);
      },
      py::arg("op"), py::arg("dtype"),
      "Raises ValueError unless `op` can reduce elements of the dtype named `dtype`.");

  // Test helpers: the kernels applied in place to contiguous buffers (numpy arrays). The dtype
  // is named explicitly so that bfloat16 can travel as a uint16 view.
  m.def(
      "_reduce_buffers",
      [](py::buffer dst, py::buffer src, const ReduceOp& op, const std::string& dtype_name) {
        const DType dtype = parse_dtype(dtype_name);
        py::buffer_info d = dst.request(/*writable=*/true);
        py::buffer_info s = src.request();
        const size_t n = checked_count(d, dtype, "_reduce_buffers: dst");
        const size_t n_src = checked_count(s, dtype, "_reduce_buffers: src");
        C10D_CHECK_ARG(n == n_src, "_reduce_buffers: dst has ", n, " elements but src has ", n_src);
        py::gil_scoped_release release;
        core::reduce(d.ptr, s.ptr, n, dtype, op);
      },
      py::arg("dst"), py::arg("src"), py::arg("op"), py::arg("dtype"),
      "dst[i] = dst[i] (op) src[i] for two contiguous buffers of the named dtype.");
  m.def(
      "_scale_buffer",
      [](py::buffer data, double factor, const std::string& dtype_name) {
        const DType dtype = parse_dtype(dtype_name);
        py::buffer_info info = data.request(/*writable=*/true);
        const size_t n = checked_count(info, dtype, "_scale_buffer");
        py::gil_scoped_release release;
        core::scale(info.ptr, n, dtype, factor);
      },
      py::arg("data"), py::arg("factor"), py::arg("dtype"),
      "data[i] *= factor, as PREMUL_SUM's pre-step does.");
  m.def(
      "_finalize_avg_buffer",
      [](py::buffer data, int world_size, const std::string& dtype_name) {
        const DType dtype = parse_dtype(dtype_name);
        py::buffer_info info = data.request(/*writable=*/true);
        const size_t n = checked_count(info, dtype, "_finalize_avg_buffer");
        py::gil_scoped_release release;
        core::finalize_avg(info.ptr, n, dtype, world_size);
      },
      py::arg("data"), py::arg("world_size"), py::arg("dtype"),
      "data[i] /= world_size, as AVG's post-step does (integers truncate).");
}

}  // namespace c10d::python
