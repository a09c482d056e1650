// Bindings of c10d::core: the exception classes, debug level, environment registry, Future
// and Work.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>

#include <pthread.h>

#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/core/work.h"
#include "c10d/python/bindings.h"
#include "c10d/python/tensor_convert.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

using core::Future;
using core::FutureValue;
using core::Millis;
using core::Work;

// Python exception classes, created once at import.
PyObject* g_dist_error = nullptr;
PyObject* g_store_error = nullptr;
PyObject* g_network_error = nullptr;
PyObject* g_backend_error = nullptr;
PyObject* g_timeout_error = nullptr;
PyObject* g_store_timeout_error = nullptr;
PyObject* g_queue_empty_error = nullptr;
PyObject* g_argument_value_error = nullptr;
PyObject* g_argument_type_error = nullptr;

PyObject* new_exception(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  std::string qualified = std::string("c10d.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // the module keeps a reference
  return type;
}

void translate_exception(std::exception_ptr p);

void register_exceptions(py::module_& m) {
  g_dist_error = new_exception(m, "DistError", PyExc_RuntimeError,
                               "Base class of every error raised by c10d's distributed calls.");
  g_store_error = new_exception(m, "DistStoreError", g_dist_error, "A store operation failed.");
  g_network_error = new_exception(m, "DistNetworkError", g_dist_error,
                                  "A connection failed, was reset, or a peer went away.");
  g_backend_error = new_exception(m, "DistBackendError", g_dist_error,
                                  "A collective or point-to-point operation failed.");
  g_timeout_error =
      new_exception(m, "DistTimeoutError", g_dist_error, "A blocking call reached its timeout.");
  py::tuple store_timeout_bases =
      py::make_tuple(py::handle(g_store_error), py::handle(g_timeout_error));
  g_store_timeout_error =
      new_exception(m, "DistStoreTimeoutError", store_timeout_bases.ptr(),
                    "A store wait or get reached its timeout (a DistStoreError and a "
                    "DistTimeoutError).");
  g_queue_empty_error = new_exception(m, "DistQueueEmptyError", g_store_error,
                                      "queue_pop found the queue empty and was told not to block.");
  // Bad arguments. torch.distributed raises RuntimeError for the checks its C++ layer makes
  // (and older releases for most Python ones) and ValueError/TypeError for others, so c10d's
  // are both: code written for either catches them.
  py::tuple value_bases =
      py::make_tuple(py::handle(PyExc_ValueError), py::handle(PyExc_RuntimeError));
  g_argument_value_error = new_exception(m, "DistValueError", value_bases.ptr(),
                                         "A bad argument (a ValueError and a RuntimeError).");
  py::tuple type_bases =
      py::make_tuple(py::handle(PyExc_TypeError), py::handle(PyExc_RuntimeError));
  g_argument_type_error = new_exception(m, "DistTypeError", type_bases.ptr(),
                                        "An argument of the wrong type (a TypeError and a "
                                        "RuntimeError).");

  py::register_exception_translator(&translate_exception);
}

// Sets the Python error for c10d's C++ exceptions; rethrows anything else so the next
// translator sees it.
void translate_exception(std::exception_ptr p) {
  {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const PythonException& e) {
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.exception().ptr())),
                      e.exception().ptr());
    } catch (const core::DistStoreTimeoutError& e) {
      PyErr_SetString(g_store_timeout_error, e.what());
    } catch (const core::DistQueueEmptyError& e) {
      PyErr_SetString(g_queue_empty_error, e.what());
    } catch (const core::DistStoreError& e) {
      PyErr_SetString(g_store_error, e.what());
    } catch (const core::DistNetworkError& e) {
      PyErr_SetString(g_network_error, e.what());
    } catch (const core::DistBackendError& e) {
      PyErr_SetString(g_backend_error, e.what());
    } catch (const core::DistTimeoutError& e) {
      PyErr_SetString(g_timeout_error, e.what());
    } catch (const core::DistError& e) {
      PyErr_SetString(g_dist_error, e.what());
    } catch (const core::InvalidArgument& e) {
      PyErr_SetString(g_argument_value_error, e.what());
    } catch (const py::value_error& e) {  // the bindings' own checks
      PyErr_SetString(g_argument_value_error, e.what());
    } catch (const py::type_error& e) {
      PyErr_SetString(g_argument_type_error, e.what());
    }
  }
}

py::object value_to_python(const FutureValue& value) {
  if (value.object) return *static_cast<py::object*>(value.object.get());
  py::list out;
  for (const auto& t : value.tensors) out.append(to_python(t));
  return out;
}

FutureValue value_from_python(py::handle obj) {
  FutureValue value;
  value.object = hold_python(py::reinterpret_borrow<py::object>(obj));
  return value;
}

// The Work that Python's Work() makes (a base for Python subclasses): no operation behind it.
class BareWork : public Work {};

// What then() stores when its callback raised: torch's RuntimeError naming the callback's
// error, which becomes its __cause__.
std::exception_ptr callback_error(const py::error_already_set& e) {
  py::object error = py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(
      "Got the following error when running the callback: " +
      py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
      py::str(e.value()).cast<std::string>());
  error.attr("__cause__") = e.value();
  return std::make_exception_ptr(PythonException(error));
}

}  // namespace

PythonException::PythonException(py::handle exception)
    : held_(hold_python(py::reinterpret_borrow<py::object>(exception))),
      what_(py::str(exception).cast<std::string>()) {}

std::exception_ptr python_exception_ptr(const py::error_already_set& error) {
  return std::make_exception_ptr(PythonException(error.value()));
}

namespace {

// GilGuard's gate. Never destroyed: C++ threads may pass it while the process exits.
struct PythonGate {
  std::mutex mutex;
  std::condition_variable left;
  bool closed = false;  // guarded by mutex
  int inside = 0;       // guarded by mutex
};

// A fork child starts with no thread inside and an unlocked mutex (another thread of the parent
// may have held it): the gate is built anew in place, without allocating.
alignas(PythonGate) unsigned char gate_storage[sizeof(PythonGate)];

PythonGate& python_gate() {
  static PythonGate* const gate = [] {
    auto* g = new (gate_storage) PythonGate;
    ::pthread_atfork(nullptr, nullptr, [] {
      const bool closed = python_gate().closed;
      new (gate_storage) PythonGate;
      python_gate().closed = closed;
    });
    return g;
  }();
  return *gate;
}

}  // namespace

GilGuard::GilGuard() {
  PythonGate& gate = python_gate();
  // A thread that holds the GIL already (atexit handlers run after the gate closed, module
  // teardown) may go on using Python; PyGILState_Check is true for any thread once the
  // interpreter is gone, hence Py_IsInitialized first.
  const bool holder = Py_IsInitialized() && PyGILState_Check();
  {
    std::lock_guard<std::mutex> lock(gate.mutex);
    if ((gate.closed && !holder) || !Py_IsInitialized()) return;
    ++gate.inside;
  }
  entered_ = true;
  gil_.emplace();
}

GilGuard::~GilGuard() {
  if (!entered_) return;
  gil_.reset();
  PythonGate& gate = python_gate();
  std::lock_guard<std::mutex> lock(gate.mutex);
  if (--gate.inside == 0) gate.left.notify_all();
}

void close_python_gate() {
  PythonGate& gate = python_gate();
  py::gil_scoped_release release;  // the threads inside may be waiting for the GIL
  std::unique_lock<std::mutex> lock(gate.mutex);
  gate.closed = true;
  if (!gate.left.wait_for(lock, std::chrono::seconds(5), [&] { return gate.inside == 0; })) {
    core::log(core::LogLevel::kWarning,
              "c10d: a thread still ran Python code 5 s after the interpreter began to exit");
  }
}

std::shared_ptr<py::object> hold_python(py::object obj) {
  return std::shared_ptr<py::object>(new py::object(std::move(obj)), [](py::object* o) {
    GilGuard gil;
    if (gil) delete o;  // else leaked with the interpreter
  });
}

void set_python_error(std::exception_ptr error) {
  try {
    translate_exception(error);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

void init_core(py::module_& m) {
  register_exceptions(m);
  init_tensor(m);
  py::module_::import("atexit").attr("register")(py::cpp_function(&close_python_gate));

  py::enum_<core::DebugLevel>(m, "DebugLevel", "How much c10d logs and checks.")
      .value("OFF", core::DebugLevel::kOff)
      .value("INFO", core::DebugLevel::kInfo)
      .value("DETAIL", core::DebugLevel::kDetail);
  m.def("get_debug_level", &core::debug_level, "The current debug level.");
  m.def("_set_global_rank", &core::set_log_rank, py::arg("rank"),
        "The rank c10d's log lines name this process by (\"[c10d rank 3 WARNING] ...\").");
  m.def("set_debug_level", &core::set_debug_level, py::arg("level"), "Sets the debug level.");
  m.def("set_debug_level_from_env", &core::set_debug_level_from_env,
        "Sets the debug level from TORCH_DISTRIBUTED_DEBUG (OFF, INFO or DETAIL).");
  m.def(
      "_env_registry",
      [] {
        py::list out;
        for (const auto& var : core::env_registry()) {
          out.append(py::make_tuple(var.name, var.default_value, var.doc));
        }
        return out;
      },
      "Every environment variable c10d reads: (name, default, documentation).");

  py::class_<Future, std::shared_ptr<Future>> future(
      m, "Future", "The eventual result of an asynchronous operation.");
  // Future[T] in annotations (comm hooks are written `-> dist.Future[...]`), as torch's allows.
  future.def_static("__class_getitem__",
                    [future](const py::object& /*item*/) -> py::object { return future; });
  future
      .def(py::init(
               [](const py::object& /*devices: CPU only*/) { return std::make_shared<Future>(); }),
           py::arg("devices") = py::none())
      .def("done", &Future::completed, "True once the future has a result or an error.")
      .def(
          "wait",
          [](Future& f) {
            {
              py::gil_scoped_release release;
              f.wait();
            }
            return value_to_python(f.value_now());
          },
          "Blocks until done, then returns the value or raises the error.")
      .def(
          "value", [](Future& f) { return value_to_python(f.value_now()); },
          "The value of a completed future (raises its error, or if not done).")
      .def(
          "set_result",
          [](Future& f, py::object value) { f.mark_completed(value_from_python(value)); },
          py::arg("result"))
      .def(
          "set_exception",
          [](Future& f, py::object exc) {
            if (!PyExceptionInstance_Check(exc.ptr())) {
              PyErr_SetString(
                  PyExc_AssertionError,
                  (py::repr(exc).cast<std::string>() + " is of type " +
                   py::str(py::type::of(exc)).cast<std::string>() + ", not an Exception.")
                      .c_str());
              throw py::error_already_set();
            }
            f.set_error(std::make_exception_ptr(PythonException(exc)));
          },
          py::arg("result"))
      .def(
          "then",
          [](const std::shared_ptr<Future>& f, py::function callback) {
            // The callback runs whether this future succeeded or failed (it may handle the
            // error through wait() or value()), as torch's does.
            auto child = std::make_shared<Future>();
            f->add_callback([self = f, child, fn = hold_python(std::move(callback))](Future&) {
              FutureValue value;
              {
                GilGuard gil;
                if (!gil) {
                  child->set_error(std::make_exception_ptr(
                      std::runtime_error("Future.then: the Python interpreter is shutting down")));
                  return;
                }
                try {
                  value = value_from_python((*fn)(self));
                } catch (py::error_already_set& e) {
                  child->set_error(callback_error(e));
                  return;
                }
              }
              child->mark_completed(std::move(value));
            });
            return child;
          },
          py::arg("callback"),
          "A new future completed with callback(this future)'s return value; the callback "
          "runs also when this future failed, and an exception in it becomes the new future's "
          "error (a RuntimeError naming it).")
      .def(
          "add_done_callback",
          [](const std::shared_ptr<Future>& f, py::function callback) {
            f->add_callback([self = f, fn = hold_python(std::move(callback))](Future&) {
              GilGuard gil;
              if (!gil) return;
              try {
                (*fn)(self);
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable("c10d.Future done-callback");
              }
            });
          },
          py::arg("callback"));

  py::class_<Work, std::shared_ptr<Work>>(m, "Work", "An operation in flight.")
      .def(py::init([]() -> std::shared_ptr<Work> { return std::make_shared<BareWork>(); }))
      .def("is_completed", &Work::is_completed)
      .def("is_success", &Work::is_success)
      .def("exception",
           [](const Work& w) -> py::object {
             auto error = w.exception();
             if (!error) return py::none();
             try {
               std::rethrow_exception(error);
             } catch (const PythonException& e) {
               return py::reinterpret_borrow<py::object>(e.exception());
             } catch (...) {
             }
             // Build the Python exception object the same way a raising call would.
             try {
               translate_exception(error);
             } catch (const std::exception& e) {
               PyErr_SetString(PyExc_RuntimeError, e.what());
             } catch (...) {
               PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
             }
             py::error_already_set python_error;
             return python_error.value();
           })
      .def("source_rank", &Work::source_rank)
      .def("_source_rank", &Work::source_rank)
      .def("result",
           [](const Work& w) -> py::object {
             // A Work() made in Python has no operation behind it (torch's base raises too).
             if (dynamic_cast<const BareWork*>(&w) != nullptr) {
               throw std::runtime_error("result() not implemented.");
             }
             const FutureValue* value = nullptr;
             {
               py::gil_scoped_release release;
               value = &w.get_future()->value();
             }
             if (!value->object) return value_to_python(*value);
             // A work made from a Python future (_create_work_from_future): its tensors.
             py::object held = value_to_python(*value);
             if (py::isinstance<py::list>(held) || py::isinstance<py::tuple>(held)) {
               return py::list(held);
             }
             py::list out;
             if (!held.is_none()) out.append(held);
             return out;
           })
      .def("synchronize", [](Work&) {})
      .def(
          "wait",
          [](Work& w, Millis timeout) {
            // The outcome of a finished operation needs no other thread: the GIL stays.
            if (w.is_completed()) return w.wait(timeout);
            py::gil_scoped_release release;
            return w.wait(timeout);
          },
          py::arg("timeout") = Millis(0),
          "Blocks until the operation finishes and raises its error. With a timeout, raises "
          "DistTimeoutError if it has not finished by then; the operation then goes on and "
          "may still write into its outputs.")
      .def("abort", &Work::abort)
      .def(
          "get_future",
          [](const std::shared_ptr<Work>& w) {
            if (dynamic_cast<const BareWork*>(w.get()) != nullptr) {
              throw std::runtime_error("Work::getFuture not implemented.");
            }
            return Work::future_of(w);
          },
          "A Future completed when this operation is (with its output tensors). A send or "
          "receive advances only in wait(): until it completed, this raises.")
      .def_property_readonly(
          "op_type", [](const Work& w) { return std::string(core::op_type_name(w.op_type())); })
      .def("_get_op_type",
           [](const Work& w) {
             // torch's OpType numbers: the operations in this order, then UNKNOWN = 100.
             const auto type = w.op_type();
             return type == core::OpType::kUnknown ? 100 : static_cast<int>(type);
           })
      .def("_get_duration",
           [](const Work&) -> double {
             throw std::runtime_error("This Backend doesn't support getDuration.");
           })
      // TorchScript's boxing of a Work: without TorchScript the object stands for itself.
      .def("boxed", [](py::object self) { return self; })
      .def_static("unbox",
                  [](py::object obj) {
                    if (!py::isinstance<Work>(obj)) {
                      throw py::type_error("Work.unbox expects a boxed Work, got " +
                                           py::str(py::type::of(obj)).cast<std::string>());
                    }
                    return obj;
                  })
      .def("__repr__", [](const Work& w) {
        return "<c10d.Work " + w.description() +
               (w.is_completed() ? (w.is_success() ? " completed>" : " failed>") : " pending>");
      });
  m.def(
      "_create_work_from_future",
      [](std::shared_ptr<Future> f) { return Work::from_future(std::move(f)); }, py::arg("future"),
      "A Work that completes when the future does.");
}

}  // namespace c10d::python
