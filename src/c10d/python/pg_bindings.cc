// Bindings of c10d::pg: option structs, Backend, ProcessGroup, WorkInfo.
// Attribute and argument names follow torch.distributed's C++ bindings (rootRank, reduceOp,
// ...), so code written against torch's classes works unchanged.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/native_enum.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "c10d/backends/fake/fake_backend.h"
#include "c10d/control/handlers.h"
#include "c10d/core/exception.h"
#include "c10d/pg/flight_recorder.h"
#include "c10d/pg/process_group.h"
#include "c10d/pg/profiler.h"
#include "c10d/pg/registry.h"
#include "c10d/pg/wrapper_backend.h"
#include "c10d/python/bindings.h"
#include "c10d/python/tensor_convert.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

enum class BackendType { kUndefined, kGloo, kNccl, kUcc, kMpi, kCustom };

// The kinds of operation as torch numbers them (its OpType): core::OpType's order up to
// kAllreduceSparse, then two of torch's own.
enum class TorchOpType : int {
  kReduceScatterTensorCoalesced = 19,
  kUnknown = 100,
};
TorchOpType torch_op_type(core::OpType op) {
  return op == core::OpType::kUnknown ? TorchOpType::kUnknown : static_cast<TorchOpType>(op);
}

using core::ReduceOp;
using core::Tensor;
using pg::Backend;
using pg::ProcessGroup;
using pg::WorkPtr;

using TensorLists = std::vector<std::vector<Tensor>>;

// A completion hook calling `fn` on a backend thread; skipped once the interpreter is
// closing (see GilGuard).
ProcessGroup::Hook python_hook(py::function fn) {
  return [held = hold_python(std::move(fn))](std::shared_ptr<pg::WorkInfo> info) {
    GilGuard gil;
    if (!gil) return;
    try {
      (*held)(std::move(info));
    } catch (py::error_already_set& e) {
      throw std::runtime_error(e.what());  // ProcessGroup logs it; `e` dies under the GIL
    }
  };
}

// A tensor or a list of tensors -> list (torch's single-tensor overloads).
std::vector<Tensor> tensor_or_list(py::handle obj, bool writable, const char* what) {
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    return to_tensors(obj, writable, what);
  }
  return {to_tensor(obj, writable, what)};
}

TensorLists tensor_lists(py::handle obj, bool writable, const char* what) {
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj)) {
    throw py::type_error(std::string(what) + ": expected a list of lists of tensors");
  }
  TensorLists out;
  for (py::handle inner : obj) out.push_back(to_tensors(inner, writable, what));
  return out;
}

// The list side of a collective whose other side is `single_or_list`: one list of tensors
// when that is a single tensor (torch's single-tensor overloads), else a list of lists.
TensorLists lists_beside(py::handle lists, py::handle single_or_list, bool writable,
                         const char* what) {
  if (py::isinstance<py::list>(single_or_list) || py::isinstance<py::tuple>(single_or_list)) {
    return tensor_lists(lists, writable, what);
  }
  return {to_tensors(lists, writable, what)};
}

std::vector<int64_t> int_list(py::handle obj) {
  if (obj.is_none()) return {};
  return obj.cast<std::vector<int64_t>>();
}

core::DeviceType device_type_from(py::handle device) {
  std::string text = py::str(device);
  if (text.rfind("cpu", 0) == 0) return core::DeviceType::kCPU;
  if (text.rfind("cuda", 0) == 0) return core::DeviceType::kCUDA;
  throw py::value_error("unknown device type '" + text + "'");
}

// The result of a collective: its Work, or, for a synchronous call (asyncOp false), None
// after waiting here with the GIL released, so no Work object crosses into Python.
template <typename Options>
py::object finish(WorkPtr work, const Options& opts) {
  if (opts.async_op || !work) return py::cast(std::move(work));
  {
    py::gil_scoped_release release;
    work->wait();
  }
  return py::none();
}

// The collectives with options, which the overloads taking a root or an op (as torch's) fill.
using G = py::gil_scoped_release;

// Calls the backend without the GIL and returns what finish() makes of its Work; a group
// remembers the Works of its asynchronous calls (ProcessGroup.wait_for_pending_works).
template <typename Class, typename Options, typename Call>
py::object run_released(Class& self, const Options& opts, Call&& call) {
  WorkPtr work;
  {
    G g;
    work = call();
  }
  if constexpr (std::is_same_v<Class, ProcessGroup>) {
    if (opts.async_op && work) self.track_pending(work);
  }
  return finish(std::move(work), opts);
}

// The group a collective runs through: a ProcessGroup itself, or, for a call on a backend
// object (c10d.ProcessGroupGloo(...).allreduce(...), as torch's own tests make), a group of
// that backend alone, so that the call gets the same argument checks, staging of strided
// tensors and uneven all_gather as through any group instead of reaching the backend raw.
ProcessGroup& target(ProcessGroup& group) { return group; }

// ProcessGroup._backend_id: the id() of the group's backend of a torch BackendType (by its
// name; CUSTOM: a backend that is none of torch's kinds).
intptr_t backend_id(const ProcessGroup& g, py::handle backend_type) {
  static const std::map<std::string, std::string> kinds = {
      {"GLOO", "gloo"}, {"MPI", "mpi"}, {"NCCL", "nccl"}, {"UCC", "ucc"}};
  const std::string type_name = py::hasattr(backend_type, "name")
                                    ? std::string(py::str(backend_type.attr("name")))
                                    : std::string(py::str(backend_type));
  const auto wanted = kinds.find(type_name);
  for (const auto device : g.device_types()) {
    std::shared_ptr<Backend> backend = g.get_backend(device);
    std::string name = backend->name();
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    const bool known = std::any_of(kinds.begin(), kinds.end(),
                                   [&](const auto& kind) { return kind.second == name; });
    if ((wanted != kinds.end() && name == wanted->second) || (type_name == "CUSTOM" && !known)) {
      return reinterpret_cast<intptr_t>(py::cast(backend).ptr());
    }
  }
  std::string lower = type_name;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  const int number = py::reinterpret_borrow<py::object>(backend_type).cast<int>();
  throw std::runtime_error(core::detail::str_cat("Could not find backend type ", number,
                                                 " for Process Group with name ", lower, "."));
}

ProcessGroup& target(Backend& backend) {
  static std::mutex mutex;
  // Per live backend: the backend (weak, to notice it is gone) and its group, which refers to
  // it without owning it (the backend's Python object owns it).
  using Entry = std::pair<std::weak_ptr<Backend>, std::shared_ptr<ProcessGroup>>;
  static std::map<const Backend*, Entry> groups;
  std::lock_guard lock(mutex);
  std::erase_if(groups, [](const auto& entry) { return entry.second.first.expired(); });
  auto& [owner, group] = groups[&backend];
  if (!group) {
    owner = backend.weak_from_this();
    pg::ProcessGroupOptions opts;
    opts.backend = backend.name();
    opts.timeout = backend.timeout();
    group = std::make_shared<ProcessGroup>(nullptr, backend.rank(), backend.size(), opts);
    group->register_backend(core::DeviceType::kCPU,
                            std::shared_ptr<Backend>(std::shared_ptr<Backend>(), &backend));
  }
  return *group;
}

template <typename Class>
py::object broadcast_with(Class& self, py::handle tensors, const pg::BroadcastOptions& opts) {
  auto ts = tensor_or_list(tensors, true, "broadcast");
  return run_released(self, opts, [&] { return target(self).broadcast(ts, opts); });
}

template <typename Class>
py::object allreduce_with(Class& self, py::handle tensors, const pg::AllreduceOptions& opts) {
  auto ts = tensor_or_list(tensors, true, "allreduce");
  return run_released(self, opts, [&] { return target(self).allreduce(ts, opts); });
}

template <typename Class>
py::object reduce_with(Class& self, py::handle tensors, const pg::ReduceOptions& opts) {
  auto ts = tensor_or_list(tensors, true, "reduce");
  return run_released(self, opts, [&] { return target(self).reduce(ts, opts); });
}

template <typename Class>
py::object gather_with(Class& self, py::handle outputs, py::handle inputs,
                       const pg::GatherOptions& opts) {
  auto in = tensor_or_list(inputs, false, "gather input");
  TensorLists out = lists_beside(outputs, inputs, true, "gather output");
  return run_released(self, opts, [&] { return target(self).gather(out, in, opts); });
}

template <typename Class>
py::object scatter_with(Class& self, py::handle outputs, py::handle inputs,
                        const pg::ScatterOptions& opts) {
  auto out = tensor_or_list(outputs, true, "scatter output");
  TensorLists in = lists_beside(inputs, outputs, false, "scatter input");
  return run_released(self, opts, [&] { return target(self).scatter(out, in, opts); });
}

template <typename Class>
py::object reduce_scatter_with(Class& self, py::handle outputs, py::handle inputs,
                               const pg::ReduceScatterOptions& opts) {
  auto out = tensor_or_list(outputs, true, "reduce_scatter output");
  TensorLists in = lists_beside(inputs, outputs, false, "reduce_scatter input");
  return run_released(self, opts, [&] { return target(self).reduce_scatter(out, in, opts); });
}

// Binds one collective of a class (ProcessGroup or Backend) that share the signatures.
template <typename Class, typename PyClass>
void bind_collectives(PyClass& cls) {
  cls.def("broadcast", &broadcast_with<Class>, py::arg("tensors"),
          py::arg_v("opts", pg::BroadcastOptions(), "BroadcastOptions()"))
      .def(
          "broadcast",
          [](Class& self, py::handle tensor, int64_t root) {
            pg::BroadcastOptions opts;
            opts.root_rank = root;
            return broadcast_with(self, tensor, opts);
          },
          py::arg("tensor"), py::arg("root"))
      .def("allreduce", &allreduce_with<Class>, py::arg("tensors"),
           py::arg_v("opts", pg::AllreduceOptions(), "AllreduceOptions()"))
      .def(
          "allreduce",
          [](Class& self, py::handle tensors, const core::ReduceOp& op) {
            pg::AllreduceOptions opts;
            opts.reduce_op = op;
            return allreduce_with(self, tensors, opts);
          },
          py::arg("tensors"), py::arg("op"))
      .def(
          "allreduce_coalesced",
          [](Class& self, py::handle tensors, const pg::AllreduceCoalescedOptions& opts) {
            auto ts = to_tensors(tensors, true, "allreduce_coalesced");
            return run_released(self, opts,
                                [&] { return target(self).allreduce_coalesced(ts, opts); });
          },
          py::arg("tensors"),
          py::arg_v("opts", pg::AllreduceCoalescedOptions(), "AllreduceCoalescedOptions()"))
      .def("reduce", &reduce_with<Class>, py::arg("tensors"),
           py::arg_v("opts", pg::ReduceOptions(), "ReduceOptions()"))
      .def(
          "reduce",
          [](Class& self, py::handle tensor, int64_t root, const core::ReduceOp& op) {
            pg::ReduceOptions opts;
            opts.root_rank = root;
            opts.reduce_op = op;
            return reduce_with(self, tensor, opts);
          },
          py::arg("tensor"), py::arg("root"), py::arg("op") = core::ReduceOp())
      .def(
          "allgather",
          [](Class& self, py::handle outputs, py::handle inputs, const pg::AllgatherOptions& opts) {
            auto in = tensor_or_list(inputs, false, "allgather input");
            TensorLists out = lists_beside(outputs, inputs, true, "allgather output");
            return run_released(self, opts, [&] { return target(self).allgather(out, in, opts); });
          },
          py::arg("output_tensors"), py::arg("input_tensors"),
          py::arg_v("opts", pg::AllgatherOptions(), "AllgatherOptions()"))
      .def(
          "_allgather_base",
          [](Class& self, py::handle output, py::handle input, const pg::AllgatherOptions& opts) {
            Tensor out = to_tensor(output, true, "_allgather_base output");
            Tensor in = to_tensor(input, false, "_allgather_base input");
            return run_released(self, opts,
                                [&] { return target(self).allgather_base(out, in, opts); });
          },
          py::arg("output"), py::arg("input"),
          py::arg_v("opts", pg::AllgatherOptions(), "AllgatherOptions()"))
      .def(
          "allgather_coalesced",
          [](Class& self, py::handle outputs, py::handle inputs, const pg::AllgatherOptions& opts) {
            auto out = tensor_lists(outputs, true, "allgather_coalesced output");
            auto in = to_tensors(inputs, false, "allgather_coalesced input");
            return run_released(self, opts,
                                [&] { return target(self).allgather_coalesced(out, in, opts); });
          },
          py::arg("output_lists"), py::arg("input_list"),
          py::arg_v("opts", pg::AllgatherOptions(), "AllgatherOptions()"))
      .def(
          "allgather_into_tensor_coalesced",
          [](Class& self, py::handle outputs, py::handle inputs, const pg::AllgatherOptions& opts) {
            auto out = to_tensors(outputs, true, "allgather_into_tensor_coalesced output");
            auto in = to_tensors(inputs, false, "allgather_into_tensor_coalesced input");
            return run_released(self, opts, [&] {
              return target(self).allgather_into_tensor_coalesced(out, in, opts);
            });
          },
          py::arg("outputs"), py::arg("inputs"),
          py::arg_v("opts", pg::AllgatherOptions(), "AllgatherOptions()"))
      .def("gather", &gather_with<Class>, py::arg("output_tensors"), py::arg("input_tensors"),
           py::arg_v("opts", pg::GatherOptions(), "GatherOptions()"))
      .def(
          "gather",
          [](Class& self, py::handle outputs, py::handle input, int64_t root) {
            pg::GatherOptions opts;
            opts.root_rank = root;
            return gather_with(self, outputs, input, opts);
          },
          py::arg("output_tensors"), py::arg("input_tensor"), py::arg("root"))
      .def("scatter", &scatter_with<Class>, py::arg("output_tensors"), py::arg("input_tensors"),
           py::arg_v("opts", pg::ScatterOptions(), "ScatterOptions()"))
      .def(
          "scatter",
          [](Class& self, py::handle output, py::handle inputs, int64_t root) {
            pg::ScatterOptions opts;
            opts.root_rank = root;
            return scatter_with(self, output, inputs, opts);
          },
          py::arg("output_tensor"), py::arg("input_tensors"), py::arg("root"))
      .def("reduce_scatter", &reduce_scatter_with<Class>, py::arg("output_tensors"),
           py::arg("input_tensors"),
           py::arg_v("opts", pg::ReduceScatterOptions(), "ReduceScatterOptions()"))
      .def(
          "reduce_scatter",
          [](Class& self, py::handle output, py::handle inputs, const core::ReduceOp& op) {
            pg::ReduceScatterOptions opts;
            opts.reduce_op = op;
            return reduce_scatter_with(self, output, inputs, opts);
          },
          py::arg("output"), py::arg("input"), py::arg("op") = core::ReduceOp())
      .def(
          "_reduce_scatter_base",
          [](Class& self, py::handle output, py::handle input,
             const pg::ReduceScatterOptions& opts) {
            Tensor out = to_tensor(output, true, "_reduce_scatter_base output");
            Tensor in = to_tensor(input, false, "_reduce_scatter_base input");
            return run_released(self, opts,
                                [&] { return target(self).reduce_scatter_base(out, in, opts); });
          },
          py::arg("outputTensor"), py::arg("inputTensor"),
          py::arg_v("opts", pg::ReduceScatterOptions(), "ReduceScatterOptions()"))
      .def(
          "reduce_scatter_tensor_coalesced",
          [](Class& self, py::handle outputs, py::handle inputs,
             const pg::ReduceScatterOptions& opts) {
            auto out = to_tensors(outputs, true, "reduce_scatter_tensor_coalesced output");
            auto in = to_tensors(inputs, false, "reduce_scatter_tensor_coalesced input");
            return run_released(self, opts, [&] {
              return target(self).reduce_scatter_tensor_coalesced(out, in, opts);
            });
          },
          py::arg("outputs"), py::arg("inputs"),
          py::arg_v("opts", pg::ReduceScatterOptions(), "ReduceScatterOptions()"))
      .def(
          "alltoall_base",
          [](Class& self, py::handle output, py::handle input, py::handle output_split_sizes,
             py::handle input_split_sizes, const pg::AllToAllOptions& opts) {
            Tensor out = to_tensor(output, true, "alltoall_base output");
            Tensor in = to_tensor(input, false, "alltoall_base input");
            auto out_splits = int_list(output_split_sizes);
            auto in_splits = int_list(input_split_sizes);
            return run_released(self, opts, [&] {
              return target(self).alltoall_base(out, in, out_splits, in_splits, opts);
            });
          },
          py::arg("output"), py::arg("input"), py::arg("output_split_sizes"),
          py::arg("input_split_sizes"),
          py::arg_v("opts", pg::AllToAllOptions(), "AllToAllOptions()"))
      .def(
          "alltoall",
          [](Class& self, py::handle outputs, py::handle inputs, const pg::AllToAllOptions& opts) {
            auto out = to_tensors(outputs, true, "alltoall output");
            auto in = to_tensors(inputs, false, "alltoall input");
            return run_released(self, opts, [&] { return target(self).alltoall(out, in, opts); });
          },
          py::arg("output_tensors"), py::arg("input_tensors"),
          py::arg_v("opts", pg::AllToAllOptions(), "AllToAllOptions()"))
      .def(
          "send",
          [](Class& self, py::handle tensors, int dst, int tag) {
            auto ts = tensor_or_list(tensors, false, "send");
            G g;
            return target(self).send(ts, dst, tag);
          },
          py::arg("tensors"), py::arg("dstRank"), py::arg("tag") = 0)
      .def(
          "recv",
          [](Class& self, py::handle tensors, int src, int tag) {
            auto ts = tensor_or_list(tensors, true, "recv");
            G g;
            return target(self).recv(ts, src, tag);
          },
          py::arg("tensors"), py::arg("srcRank"), py::arg("tag") = 0)
      .def(
          "recv_anysource",
          [](Class& self, py::handle tensors, int tag) {
            auto ts = tensor_or_list(tensors, true, "recv_anysource");
            G g;
            return target(self).recv_anysource(ts, tag);
          },
          py::arg("tensors"), py::arg("tag") = 0)
      .def(
          "barrier",
          [](Class& self, const pg::BarrierOptions& opts) {
            return run_released(self, opts, [&] { return target(self).barrier(opts); });
          },
          py::arg_v("opts", pg::BarrierOptions(), "BarrierOptions()"))
      .def(
          "monitored_barrier",
          [](Class& self, core::Millis timeout, bool wait_all_ranks) {
            pg::BarrierOptions opts;
            opts.timeout = timeout;
            target(self).monitored_barrier(opts, wait_all_ranks);
          },
          py::arg("timeout") = pg::kUnsetTimeout, py::arg("wait_all_ranks") = false,
          py::call_guard<py::gil_scoped_release>());
}

}  // namespace

void init_pg(py::module_& m) {
  m.attr("_DEFAULT_PG_TIMEOUT") = pg::kDefaultPgTimeout;

  m.def(
      "_set_profiler_bridge",
      [](uintptr_t recording, py::function open) {
        pg::ProfilerBridge bridge;
        bridge.recording = reinterpret_cast<bool (*)()>(recording);
        bridge.open =
            [opener = hold_python(std::move(open))](
                const std::string& name,
                const std::vector<std::vector<int64_t>>& shapes) -> std::function<void()> {
          GilGuard gil;
          if (!gil) return {};
          try {
            std::shared_ptr<py::object> close = hold_python((*opener)(name, shapes));
            return [close] {
              GilGuard inner;
              if (!inner) return;
              try {
                (*close)();
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable("c10d: closing a torch profiler event");
              }
            };
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("c10d: opening a torch profiler event");
            return {};
          }
        };
        pg::set_profiler_bridge(std::move(bridge));
      },
      py::arg("recording"), py::arg("open"),
      "Makes every dispatched operation a torch profiler event while `recording` (the address "
      "of torch's C++ bool() 'this thread profiles') says so: open(name, shapes) opens one and "
      "returns what closes it.");

  py::class_<pg::BroadcastOptions>(
      m, "BroadcastOptions",
      "Options of ProcessGroup.broadcast: the root rank and which of its tensors is the source, "
      "the timeout (unset: the group's), whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("rootRank", &pg::BroadcastOptions::root_rank)
      .def_readwrite("rootTensor", &pg::BroadcastOptions::root_tensor)
      .def_readwrite("timeout", &pg::BroadcastOptions::timeout)
      .def_readwrite("asyncOp", &pg::BroadcastOptions::async_op);
  py::class_<pg::AllreduceOptions>(
      m, "AllreduceOptions",
      "Options of ProcessGroup.allreduce: the reduction (ReduceOp), the timeout (unset: the "
      "group's), whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("reduceOp", &pg::AllreduceOptions::reduce_op)
      .def_readwrite("timeout", &pg::AllreduceOptions::timeout)
      .def_readwrite("asyncOp", &pg::AllreduceOptions::async_op);
  py::class_<pg::AllreduceCoalescedOptions, pg::AllreduceOptions>(
      m, "AllreduceCoalescedOptions",
      "Options of ProcessGroup.allreduce_coalesced: as AllreduceOptions.")
      .def(py::init<>());
  py::class_<pg::ReduceOptions>(m, "ReduceOptions",
                                "Options of ProcessGroup.reduce: the reduction, the root rank and "
                                "tensor, the timeout, whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("reduceOp", &pg::ReduceOptions::reduce_op)
      .def_readwrite("rootRank", &pg::ReduceOptions::root_rank)
      .def_readwrite("rootTensor", &pg::ReduceOptions::root_tensor)
      .def_readwrite("timeout", &pg::ReduceOptions::timeout)
      .def_readwrite("asyncOp", &pg::ReduceOptions::async_op);
  py::class_<pg::AllgatherOptions>(m, "AllgatherOptions",
                                   "Options of the all_gather forms: the timeout (unset: the "
                                   "group's), whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("timeout", &pg::AllgatherOptions::timeout)
      .def_readwrite("asyncOp", &pg::AllgatherOptions::async_op);
  py::class_<pg::GatherOptions>(m, "GatherOptions",
                                "Options of ProcessGroup.gather: the root rank, the timeout, "
                                "whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("rootRank", &pg::GatherOptions::root_rank)
      .def_readwrite("timeout", &pg::GatherOptions::timeout)
      .def_readwrite("asyncOp", &pg::GatherOptions::async_op);
  py::class_<pg::ScatterOptions>(m, "ScatterOptions",
                                 "Options of ProcessGroup.scatter: the root rank, the timeout, "
                                 "whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("rootRank", &pg::ScatterOptions::root_rank)
      .def_readwrite("timeout", &pg::ScatterOptions::timeout)
      .def_readwrite("asyncOp", &pg::ScatterOptions::async_op);
  py::class_<pg::ReduceScatterOptions>(m, "ReduceScatterOptions",
                                       "Options of the reduce_scatter forms: the reduction, the "
                                       "timeout, whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("reduceOp", &pg::ReduceScatterOptions::reduce_op)
      .def_readwrite("timeout", &pg::ReduceScatterOptions::timeout)
      .def_readwrite("asyncOp", &pg::ReduceScatterOptions::async_op);
  py::class_<pg::AllToAllOptions>(m, "AllToAllOptions",
                                  "Options of the all_to_all forms: the timeout (unset: the "
                                  "group's), whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("timeout", &pg::AllToAllOptions::timeout)
      .def_readwrite("asyncOp", &pg::AllToAllOptions::async_op);
  py::class_<pg::BarrierOptions>(m, "BarrierOptions", py::dynamic_attr(),
                                 "Options of ProcessGroup.barrier: device ids (ignored on CPUs), "
                                 "the timeout, whether the call is asynchronous.")
      .def(py::init<>())
      .def_readwrite("device_ids", &pg::BarrierOptions::device_ids)
      // The device the barrier runs on (None: the backend's); kept for torch's code, which
      // sets it, in the instance's own attributes.
      .def_property(
          "device",
          [](py::object self) -> py::object {
            py::dict attributes = self.attr("__dict__");
            if (!attributes.contains("device")) return py::none();
            return attributes["device"];
          },
          [](py::object self, py::object device) { self.attr("__dict__")["device"] = device; })
      .def_readwrite("timeout", &pg::BarrierOptions::timeout)
      .def_readwrite("asyncOp", &pg::BarrierOptions::async_op);

  // A Python IntEnum, as iterable and int()-able as torch's callers expect.
  // A Python Enum, iterable as torch's callers expect; int() gives torch's number, while a
  // member equals no int (as torch's pybind11 enum).
  py::native_enum<TorchOpType> op_type(
      m, "OpType", "enum.Enum",
      "The kind of operation a Work did, numbered as torch numbers them.");
  for (int i = 0; i < static_cast<int>(core::OpType::kUnknown); ++i) {
    const auto op = static_cast<core::OpType>(i);
    op_type.value(std::string(core::op_type_name(op)).c_str(), torch_op_type(op));
  }
  op_type.value("REDUCE_SCATTER_TENSOR_COALESCED", TorchOpType::kReduceScatterTensorCoalesced)
      .value("UNKNOWN", TorchOpType::kUnknown)
      .finalize();
  py::object op_type_class = m.attr("OpType");
  for (const char* conversion : {"__int__", "__index__"}) {
    op_type_class.attr(conversion) = py::cpp_function(
        [](py::object member) { return member.attr("value"); }, py::is_method(op_type_class));
  }

  py::class_<pg::WorkInfo, std::shared_ptr<pg::WorkInfo>>(
      m, "WorkInfo",
      "What a finished operation reports to the hooks of "
      "ProcessGroup._register_on_completion_hook: "
      "its kind, sequence number, start and end times and active duration.")
      .def_property_readonly("op_type",
                             [](const pg::WorkInfo& w) { return torch_op_type(w.op_type); })
      .def_readonly("seq", &pg::WorkInfo::seq)
      .def_property_readonly(
          "time_started", [](const pg::WorkInfo& w) { return w.time_started.time_since_epoch(); })
      .def_property_readonly(
          "time_finished", [](const pg::WorkInfo& w) { return w.time_finished.time_since_epoch(); })
      .def_readonly("active_duration", &pg::WorkInfo::active_duration);

  py::class_<Backend, std::shared_ptr<Backend>> backend(
      m, "_Backend", "One implementation of the collectives, registered in a ProcessGroup.");
  backend.def("rank", &Backend::rank)
      .def("size", &Backend::size)
      .def("name", &Backend::name)
      .def("_get_backend_name", &Backend::name)
      .def("_get_sequence_number_for_group", &Backend::group_sequence_number,
           "The sequence number of the group this backend serves (0: none).")
      .def(
          "_set_sequence_number_for_group", [](Backend&) {},
          "Nothing to do: the group numbers its operations itself.")
      .def_property_readonly("supports_splitting", &Backend::supports_splitting,
                             "Whether torch's split_group can split this backend (Gloo's can).")
      .def(
          "eager_connect_single_device", [](Backend&, py::handle) {},
          py::arg("device") = py::none(),
          "Nothing to do: c10d's backends connect when they are made.")
      // Coalescing is the ProcessGroup's (see _coalescing_manager), as with torch's Gloo.
      .def(
          "_start_coalescing",
          [](Backend& b) -> void {
            throw std::runtime_error("Backend " + b.name() + " does not implement startCoalescing");
          })
      .def("_end_coalescing",
           [](Backend& b) -> void {
             throw std::runtime_error("Backend " + b.name() + " does not implement endCoalescing");
           })
      .def_property_readonly("options_timeout", &Backend::timeout)
      .def("_set_default_timeout", &Backend::set_timeout, py::arg("timeout"),
           "The timeout of the operations submitted from now on that set none.");
  bind_collectives<Backend>(backend);

  py::class_<backends::fake::FakeBackend, Backend, std::shared_ptr<backends::fake::FakeBackend>>(
      m, "FakeProcessGroup", "A backend that completes every operation at once, for tests.")
      .def(py::init<int, int>(), py::arg("rank"), py::arg("world_size"));

  py::class_<pg::WrapperBackend, Backend, std::shared_ptr<pg::WrapperBackend>>(
      m, "_ProcessGroupWrapper",
      "Checks before each collective that every rank calls the same one (debug level DETAIL).")
      .def(py::init<std::shared_ptr<Backend>, std::shared_ptr<Backend>>(), py::arg("backend"),
           py::arg("gloo_backend"))
      .def_property_readonly("wrapped_pg", &pg::WrapperBackend::wrapped);

  py::class_<pg::ProcessGroupOptions>(m, "_ProcessGroupOptions")
      .def(py::init<>())
      .def(py::init([](std::string backend, core::Millis timeout) {
             pg::ProcessGroupOptions opts;
             opts.backend = std::move(backend);
             opts.timeout = timeout;
             return opts;
           }),
           py::arg("backend"), py::arg("timeout") = pg::ProcessGroupOptions{}.timeout)
      .def_readwrite("backend", &pg::ProcessGroupOptions::backend)
      .def_readwrite("_timeout", &pg::ProcessGroupOptions::timeout);

  py::class_<ProcessGroup, std::shared_ptr<ProcessGroup>> group(
      m, "ProcessGroup",
      "A set of ranks running collectives together, with one backend per device.");
  group.attr("Options") = m.attr("_ProcessGroupOptions");
  // torch's names for the kinds of backend, as _register_backend takes them (c10d keys its
  // backends by device and ignores the kind).
  py::enum_<BackendType>(group, "BackendType")
      .value("UNDEFINED", BackendType::kUndefined)
      .value("GLOO", BackendType::kGloo)
      .value("NCCL", BackendType::kNccl)
      .value("UCC", BackendType::kUcc)
      .value("MPI", BackendType::kMpi)
      .value("CUSTOM", BackendType::kCustom)
      .export_values();
  group
      .def(py::init([](std::shared_ptr<store::Store> store, int rank, int size,
                       std::optional<std::string> backend, std::optional<core::Millis> timeout) {
             pg::ProcessGroupOptions opts;
             if (backend) opts.backend = *backend;
             if (timeout) opts.timeout = *timeout;
             return std::make_shared<ProcessGroup>(std::move(store), rank, size, opts);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("backend") = py::none(),
           py::arg("timeout") = py::none())
      // torch's form: the Options give the backend's name and the timeout.
      .def(py::init([](std::shared_ptr<store::Store> store, int rank, int size,
                       const pg::ProcessGroupOptions& options) {
             return std::make_shared<ProcessGroup>(std::move(store), rank, size, options);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options"))
      .def(py::init([](int rank, int size) {
             return std::make_shared<ProcessGroup>(nullptr, rank, size);
           }),
           py::arg("rank"), py::arg("size"))
      .def_property_readonly(
          "options",
          [](const ProcessGroup& g) {
            pg::ProcessGroupOptions options = g.options();
            if (options.backend == pg::ProcessGroupOptions{}.backend) {
              options.backend = g.backend_name();
            }
            return options;
          },
          "The Options the group was made with (backend, timeout).")
      // Python's id(): torch's code keys tables by it.
      .def("_id", [](py::handle self) { return reinterpret_cast<intptr_t>(self.ptr()); })
      .def("_backend_id", &backend_id, py::arg("backend_type"),
           "The id() of this group's backend of `backend_type` (a ProcessGroup.BackendType).")
      .def(
          "boxed", [](py::object self) { return self; },
          "Itself: without TorchScript there is no IValue to box into.")
      .def_static(
          "unbox",
          [](py::object obj) {
            if (!py::isinstance<ProcessGroup>(obj)) {
              throw py::type_error("unbox expects a boxed ProcessGroup, got " +
                                   std::string(py::str(py::type::of(obj).attr("__name__"))));
            }
            return obj;
          },
          py::arg("obj"))
      .def("rank", &ProcessGroup::rank)
      .def("size", &ProcessGroup::size)
      // A Python subclass names its backend by overriding getBackendName, as with torch.
      .def("name", [](py::object self) { return self.attr("getBackendName")(); })
      .def("getBackendName", &ProcessGroup::backend_name)
      .def("_get_backend_name", &ProcessGroup::backend_name)
      .def_property_readonly("group_name", &ProcessGroup::group_name)
      .def("_set_group_name", &ProcessGroup::set_group_name, py::arg("name"))
      .def_property_readonly("group_desc", &ProcessGroup::group_desc)
      .def("_set_group_desc", &ProcessGroup::set_group_desc, py::arg("desc"))
      .def_property_readonly("bound_device_id", [](const ProcessGroup&) { return py::none(); })
      .def_property_readonly("_timeout", [](const ProcessGroup& g) { return g.options().timeout; })
      .def_property_readonly("_store", &ProcessGroup::store)
      .def("_inline_ops", &make_inline_ops,
           "The group's inline entry points by name (allreduce, broadcast, reduce, "
           "all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, gather, scatter, "
           "barrier): synchronous collectives on C-contiguous buffers that return False, having "
           "done nothing, when the inline path does not apply.")
      .def(
          "_register_backend",
          [](ProcessGroup& g, py::handle device, py::handle /*backend_type*/,
             std::shared_ptr<Backend> backend) {
            g.register_backend(device_type_from(device), std::move(backend));
          },
          py::arg("device"), py::arg("backend_type"), py::arg("backend") = py::none())
      .def(
          "_get_backend",
          [](const ProcessGroup& g, py::handle device) {
            return g.get_backend(device_type_from(device));
          },
          py::arg("device"))
      .def("_device_types",
           [](const ProcessGroup& g) {
             std::vector<std::string> out;
             for (auto d : g.device_types()) out.push_back(core::Device{d, 0}.str());
             return out;
           })
      .def("_get_sequence_number_for_group", &ProcessGroup::sequence_number)
      .def("_set_sequence_number_for_group", [](ProcessGroup&) {})
      .def(
          "_register_on_completion_hook",
          [](ProcessGroup& g, py::function hook) {
            g.register_on_completion_hook(python_hook(std::move(hook)));
          },
          py::arg("hook"))
      .def("_has_hooks", &ProcessGroup::has_hooks)
      .def("_wait_for_pending_works", &ProcessGroup::wait_for_pending_works,
           py::call_guard<py::gil_scoped_release>(),
           "Waits for this group's asynchronous operations that have not completed.")
      .def("_enable_collectives_timing", &ProcessGroup::enable_collectives_timing)
      .def(
          "_start_coalescing",
          [](ProcessGroup& g, py::handle device) {
            g.get_backend(device_type_from(device));  // the device must be served
            g.start_coalescing();
          },
          py::arg("device"))
      .def(
          "_end_coalescing",
          [](ProcessGroup& g, py::handle device) {
            g.get_backend(device_type_from(device));  // needs the GIL: before releasing it
            py::gil_scoped_release release;
            return g.end_coalescing();
          },
          py::arg("device"))
      .def("_shutdown", &ProcessGroup::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("__repr__", [](const ProcessGroup& g) {
        return "<c10d.ProcessGroup " + g.backend_name() + " rank " + std::to_string(g.rank()) +
               "/" + std::to_string(g.size()) + ">";
      });
  bind_collectives<ProcessGroup>(group);

  m.def("_register_process_group", &pg::register_process_group, py::arg("group_name"),
        py::arg("group"));
  m.def("_resolve_process_group", &pg::resolve_process_group, py::arg("group_name"));
  m.def("_unregister_process_group", &pg::unregister_process_group, py::arg("group_name"));
  m.def("_unregister_all_process_groups", &pg::unregister_all_process_groups);
  m.def("_registered_process_groups", &pg::registered_process_groups);

  // Flight recorder (c10d/pg/flight_recorder.h).
  group.def("_set_global_ranks", &ProcessGroup::set_global_ranks, py::arg("ranks"))
      .def_property_readonly("_global_ranks", &ProcessGroup::global_ranks);
  m.def(
      "_dump_trace_json",
      [](bool include_completed, bool only_active) {
        return pg::FlightRecorder::instance().dump_trace_json(include_completed, only_active);
      },
      py::arg("include_completed") = true, py::arg("only_active") = false,
      py::call_guard<py::gil_scoped_release>(),
      "This process's flight-recorder trace (the last C10D_TRACE_BUFFER_SIZE operations) as "
      "JSON.");
  m.def(
      "_dump_trace_to_file",
      [](const std::string& reason) { return pg::FlightRecorder::instance().dump_to_file(reason); },
      py::arg("reason") = "on demand", py::call_guard<py::gil_scoped_release>(),
      "Writes the trace to <C10D_TRACE_DUMP_DIR>/c10d_trace_<job>_rank<rank>.json; returns the "
      "path.");
  m.def(
      "_set_trace_job", [](const std::string& job) { pg::FlightRecorder::instance().set_job(job); },
      py::arg("job"),
      "Names the job this process belongs to in its flight-recorder dumps (init_process_group "
      "sets it).");
  m.def(
      "_trace_job", [] { return pg::FlightRecorder::instance().job(); },
      "The job named in this process's flight-recorder dumps.");
  // The control plane's dump_trace_json handler serves this process's recorder, with the
  // query parameters onlyActive and includeCompleted ("true"/"false", also snake_case).
  control::set_trace_json_provider([](const std::map<std::string, std::string>& params) {
    auto flag = [&](const char* camel, const char* snake, bool fallback) {
      auto it = params.find(camel);
      if (it == params.end()) it = params.find(snake);
      if (it == params.end()) return fallback;
      return it->second == "true" || it->second == "1" || it->second == "True";
    };
    return pg::FlightRecorder::instance().dump_trace_json(
        flag("includeCompleted", "include_completed", true),
        flag("onlyActive", "only_active", false));
  });
}

}  // namespace c10d::python
