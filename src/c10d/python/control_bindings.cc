// Bindings of c10d::control: the control collectives (StoreCollectives), the worker server,
// its handler registry and the Request/Response classes handlers see. Every call that can
// block releases the GIL; Python handlers and Python Request/Response subclasses take it back.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "c10d/control/handlers.h"
#include "c10d/control/store_collectives.h"
#include "c10d/control/worker_server.h"
#include "c10d/python/bindings.h"
#include "c10d/python/store_convert.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

using control::ControlCollectives;
using control::Request;
using control::Response;
using std::chrono::milliseconds;
using store::Bytes;

constexpr milliseconds kDefaultTimeout = control::kDefaultControlTimeout;

py::list to_pylist(const std::vector<Bytes>& values) {
  py::list out;
  for (const auto& v : values) out.append(to_pybytes(v));
  return out;
}

// A Request implemented in Python (tests, or handlers driven by hand through _get_handler).
class PyRequest : public Request {
 public:
  std::string body() const override {
    py::gil_scoped_acquire gil;
    py::function fn = py::get_override(static_cast<const Request*>(this), "body");
    if (!fn) throw std::runtime_error("the _Request subclass does not implement body()");
    Bytes b = bytes_from_python(fn());
    return std::string(b.begin(), b.end());
  }
  std::map<std::string, std::string> params() const override {
    PYBIND11_OVERRIDE_PURE(PYBIND11_TYPE(std::map<std::string, std::string>), Request, params);
  }
};

class PyResponse : public Response {
 public:
  void set_content(std::string content, const std::string& content_type) override {
    py::gil_scoped_acquire gil;
    py::function fn = py::get_override(static_cast<const Response*>(this), "set_content");
    if (!fn) throw std::runtime_error("the _Response subclass does not implement set_content()");
    fn(py::bytes(content), content_type);
  }
  void set_status(int status) override {
    PYBIND11_OVERRIDE_PURE(void, Response, set_status, status);
  }
};

// Wraps a Python callable handler(request, response) as a C++ handler. The server calls it on
// its own threads without the GIL, so it takes the GIL, and turns a Python exception into a
// C++ one (which the server answers with 500 and the message).
control::HandlerFunc wrap_python_handler(py::function handler) {
  return [fn = hold_python(std::move(handler))](const Request& request, Response& response) {
    GilGuard gil;
    if (!gil) throw std::runtime_error("the Python interpreter is shutting down");
    try {
      // The objects are borrowed for the call: a handler must not keep them.
      (*fn)(py::cast(&request, py::return_value_policy::reference),
            py::cast(&response, py::return_value_policy::reference));
    } catch (py::error_already_set& e) {
      std::string message = e.what();
      throw std::runtime_error(message);
    }
  };
}

void init_collectives(py::module_& m) {
  py::class_<ControlCollectives, std::shared_ptr<ControlCollectives>>(
      m, "_ControlCollectives",
      "Collectives over small byte strings for coordination (not tensors). Every operation "
      "takes a key that all ranks pass and that is never reused, and a timeout; a timeout "
      "raises DistStoreTimeoutError naming the ranks that did not arrive.")
      .def("barrier", &ControlCollectives::barrier, py::arg("key"),
           py::arg("timeout") = kDefaultTimeout, py::arg("block") = true,
           py::call_guard<py::gil_scoped_release>(),
           "Waits until every rank has called barrier with this key (block=False: only "
           "announces this rank).")
      .def("all_sum", &ControlCollectives::all_sum, py::arg("key"), py::arg("data"),
           py::arg("timeout") = kDefaultTimeout, py::call_guard<py::gil_scoped_release>(),
           "Sums an integer over every rank; every rank gets the total.")
      .def(
          "broadcast_send",
          [](ControlCollectives& c, const std::string& key, py::handle data, milliseconds timeout) {
            Bytes bytes = bytes_from_python(data);
            py::gil_scoped_release release;
            c.broadcast_send(key, bytes, timeout);
          },
          py::arg("key"), py::arg("data"), py::arg("timeout") = kDefaultTimeout,
          "Sends data to every other rank (called by one rank).")
      .def(
          "broadcast_recv",
          [](ControlCollectives& c, const std::string& key, milliseconds timeout) {
            Bytes out;
            {
              py::gil_scoped_release release;
              out = c.broadcast_recv(key, timeout);
            }
            return to_pybytes(out);
          },
          py::arg("key"), py::arg("timeout") = kDefaultTimeout,
          "Receives what one rank sent with broadcast_send.")
      .def(
          "gather_send",
          [](ControlCollectives& c, const std::string& key, py::handle data, milliseconds timeout) {
            Bytes bytes = bytes_from_python(data);
            py::gil_scoped_release release;
            c.gather_send(key, bytes, timeout);
          },
          py::arg("key"), py::arg("data"), py::arg("timeout") = kDefaultTimeout,
          "Sends data to the rank calling gather_recv.")
      .def(
          "gather_recv",
          [](ControlCollectives& c, const std::string& key, py::handle data, milliseconds timeout) {
            Bytes bytes = bytes_from_python(data);
            std::vector<Bytes> out;
            {
              py::gil_scoped_release release;
              out = c.gather_recv(key, bytes, timeout);
            }
            return to_pylist(out);
          },
          py::arg("key"), py::arg("data"), py::arg("timeout") = kDefaultTimeout,
          "Receives every rank's data (its own included) as a list in rank order (called by "
          "one rank).")
      .def(
          "scatter_send",
          [](ControlCollectives& c, const std::string& key, py::sequence data,
             milliseconds timeout) {
            std::vector<Bytes> values;
            for (py::handle item : data) values.push_back(bytes_from_python(item));
            Bytes out;
            {
              py::gil_scoped_release release;
              out = c.scatter_send(key, values, timeout);
            }
            return to_pybytes(out);
          },
          py::arg("key"), py::arg("data"), py::arg("timeout") = kDefaultTimeout,
          "Sends data[r] to each rank r (one entry per rank) and returns this rank's entry.")
      .def(
          "scatter_recv",
          [](ControlCollectives& c, const std::string& key, milliseconds timeout) {
            Bytes out;
            {
              py::gil_scoped_release release;
              out = c.scatter_recv(key, timeout);
            }
            return to_pybytes(out);
          },
          py::arg("key"), py::arg("timeout") = kDefaultTimeout,
          "Receives this rank's entry of a scatter_send.")
      .def(
          "all_gather",
          [](ControlCollectives& c, const std::string& key, py::handle data, milliseconds timeout) {
            Bytes bytes = bytes_from_python(data);
            std::vector<Bytes> out;
            {
              py::gil_scoped_release release;
              out = c.all_gather(key, bytes, timeout);
            }
            return to_pylist(out);
          },
          py::arg("key"), py::arg("data"), py::arg("timeout") = kDefaultTimeout,
          "Every rank's data as a list in rank order, on every rank.");

  auto store_collectives =
      py::class_<control::StoreCollectives, ControlCollectives,
                 std::shared_ptr<control::StoreCollectives>>(
          m, "StoreCollectives",
          "Control collectives that communicate through a Store (keys '<key>/...').")
          .def(py::init<std::shared_ptr<store::Store>, int, int>(), py::arg("store"),
               py::arg("rank"), py::arg("world_size"))
          .def_property_readonly("rank", &control::StoreCollectives::rank)
          .def_property_readonly("world_size", &control::StoreCollectives::world_size);
  m.attr("_StoreCollectives") = store_collectives;  // torch's private name
}

void init_worker_server(py::module_& m) {
  py::class_<Request, PyRequest>(
      m, "_Request",
      "The request a control-plane handler receives. Subclass it (implementing body and "
      "params) to call a handler from _get_handler directly.")
      .def(py::init<>())
      .def(
          "body",
          [](const Request& r) {
            std::string body = r.body();
            return py::bytes(body);
          },
          "The request body as bytes.")
      .def("params", &Request::params, "Query parameters as a dict.")
      .def("get_param", &Request::get_param, py::arg("name"),
           "The value of one query parameter, or '' when absent.");

  py::class_<Response, PyResponse>(
      m, "_Response",
      "What a control-plane handler fills in (status 200 and empty text/plain by default).")
      .def(py::init<>())
      .def(
          "set_content",
          [](Response& r, py::handle content, const std::string& content_type) {
            Bytes bytes = bytes_from_python(content);
            r.set_content(std::string(bytes.begin(), bytes.end()), content_type);
          },
          py::arg("content"), py::arg("content_type"))
      .def("set_status", &Response::set_status, py::arg("status"));

  py::class_<control::WorkerServer, std::shared_ptr<control::WorkerServer>>(
      m, "_WorkerServer",
      "HTTP server of the control plane: GET /handler/ lists the handlers, POST "
      "/handler/<name> runs one. port=-1 serves on the unix socket host_or_file (mode 0600); "
      "port=0 picks a free TCP port (see .port). With a secret (or C10D_CONTROL_SECRET), "
      "requests need 'Authorization: Bearer <secret>'.")
      .def(py::init([](const std::string& host_or_file, int port,
                       std::shared_ptr<store::Store> store, std::optional<std::string> secret) {
             control::WorkerServerOptions options;
             options.host_or_file = host_or_file;
             options.port = port;
             options.store = std::move(store);
             options.secret = std::move(secret);
             py::gil_scoped_release release;
             // Shutting down joins the server's threads, which may be waiting for the GIL
             // in a Python handler, so the last reference drops without holding it.
             return std::shared_ptr<control::WorkerServer>(
                 new control::WorkerServer(std::move(options)), [](control::WorkerServer* s) {
                   if (Py_IsInitialized() && PyGILState_Check()) {
                     py::gil_scoped_release release;
                     delete s;
                   } else {
                     delete s;
                   }
                 });
           }),
           py::arg("host_or_file"), py::arg("port") = -1, py::arg("store") = nullptr,
           py::arg("secret") = py::none())
      .def("shutdown", &control::WorkerServer::shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &control::WorkerServer::port)
      .def_property_readonly("socket_path", &control::WorkerServer::socket_path)
      .def_property_readonly("address", &control::WorkerServer::address)
      .def_property_readonly("requires_auth", &control::WorkerServer::requires_auth)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](control::WorkerServer& s, py::args) {
        py::gil_scoped_release release;
        s.shutdown();
      });

  m.def(
      "_register_handler",
      [](const std::string& name, py::function handler) {
        control::register_handler(name, wrap_python_handler(std::move(handler)));
      },
      py::arg("name"), py::arg("handler"),
      "Registers handler(request, response) under name for every worker server of this "
      "process. It runs on a server thread (holding the GIL); an exception becomes a 500.");
  m.def(
      "_get_handler",
      [](const std::string& name) {
        return py::cpp_function(control::get_handler(name), py::arg("request"), py::arg("response"),
                                py::call_guard<py::gil_scoped_release>());
      },
      py::arg("name"), "The handler registered under name, callable as f(request, response).");
  m.def("_get_handler_names", &control::get_handler_names, py::call_guard<py::gil_scoped_release>(),
        "The names of every registered handler.");
}

}  // namespace

void init_control(py::module_& m) {
  init_collectives(m);
  init_worker_server(m);
}

}  // namespace c10d::python
