// Python binding of TCPStore, with torch.distributed.TCPStore's constructor signature.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <string>

#include "c10d/python/bindings.h"
#include "c10d/store/tcp_store.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

// Whether a launcher's own store already serves `port` (torchrun's agent store): then a master
// TCPStore on that port connects to it instead of failing to listen, as torch's does.
bool agent_store_serves(uint16_t port) {
  const char* use = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const char* master_port = std::getenv("MASTER_PORT");
  if (use == nullptr || master_port == nullptr) return false;
  const std::string flag(use);
  return (flag == "1" || flag == "True" || flag == "true") &&
         std::string(master_port) == std::to_string(port);
}

}  // namespace

void init_tcp_store(py::module_& m) {
  using store::Store;
  using store::TCPStore;
  using store::TCPStoreOptions;

  py::class_<TCPStore, Store, std::shared_ptr<TCPStore>>(
      m, "TCPStore", py::dynamic_attr(),
      "Store served over TCP, wire-compatible with torch.distributed.TCPStore. The master "
      "(is_master=True) runs the server in this process; everyone connects to host_name:port. "
      "Port 0 lets the master pick a free port (see .port).")
      .def(py::init([](const std::string& host_name, uint16_t port, std::optional<int> world_size,
                       bool is_master, std::chrono::milliseconds timeout, bool wait_for_workers,
                       bool multi_tenant, std::optional<int> master_listen_fd,
                       std::optional<bool> use_libuv, std::optional<std::string> secret) {
             if (world_size && *world_size == 0) {
               throw py::value_error("TCPStore world size cannot be 0");
             }
             TCPStoreOptions opts;
             opts.port = port;
             opts.is_server = is_master && !agent_store_serves(port);
             // torch accepts -1 for "no fixed world size" as well as None.
             if (world_size && *world_size >= 0) opts.num_workers = world_size;
             opts.wait_workers = wait_for_workers;
             opts.timeout = timeout;
             opts.multi_tenant = multi_tenant;
             opts.master_listen_fd = master_listen_fd;
             opts.use_libuv = use_libuv.value_or(true);
             opts.secret = std::move(secret);
             py::gil_scoped_release release;  // not call_guard (bindings.h)
             return std::make_shared<TCPStore>(host_name, opts);
           }),
           py::arg("host_name"), py::arg("port"), py::arg("world_size") = py::none(),
           py::arg("is_master").noconvert() = false,
           py::arg("timeout") = std::chrono::milliseconds(store::kDefaultStoreTimeout),
           py::arg("wait_for_workers") = true, py::arg("multi_tenant") = false,
           py::arg("master_listen_fd") = py::none(), py::arg("use_libuv") = py::none(),
           py::arg("secret") = py::none(),
           "Starts the server when is_master (unless TORCHELASTIC_USE_AGENT_STORE is set and "
           "MASTER_PORT is this port: a launcher's store already serves it), then connects "
           "(retrying until timeout). With "
           "is_master, world_size and wait_for_workers, blocks until world_size stores have "
           "joined, else raises DistStoreError (a DistTimeoutError too) naming how many did. "
           "`secret` (default: C10D_STORE_SECRET) is a shared secret the server requires and "
           "clients present.")
      .def_property_readonly("host", &TCPStore::host, "The host name clients connect to.")
      .def_property_readonly("port", &TCPStore::port,
                             "The port the server listens on (resolved when 0 was asked for).")
      .def_property_readonly("libuvBackend", &TCPStore::libuv_backend,
                             "The use_libuv option (default True). c10d's server always runs "
                             "on libuv, so the option is only recorded.")
      .def(
          "collect_client_counters", [](const TCPStore&) { return py::dict(); },
          "Per-operation client counters: c10d's TCPStore client keeps none, so none are "
          "listed.");
}

}  // namespace c10d::python
