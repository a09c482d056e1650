// Bindings of c10d::ddp: GradBucket, Reducer, comm hooks, bucket assignment and the start-up
// collectives of data-parallel training (names as in torch.distributed).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "c10d/core/exception.h"
#include "c10d/ddp/bucket_assignment.h"
#include "c10d/ddp/comm.h"
#include "c10d/ddp/reducer.h"
#include "c10d/pg/process_group.h"
#include "c10d/python/bindings.h"
#include "c10d/python/tensor_convert.h"

namespace c10d::python {
namespace {

namespace py = pybind11;
using core::Future;
using core::FutureValue;
using core::Tensor;
using ddp::GradBucket;
using ddp::Reducer;
using pg::ProcessGroup;

// A Reducer with the Python objects it was given: a torch parameter's gradient is its .grad,
// which exists only once the backward pass made it, so it is looked up per mark_ready.
struct PyReducer {
  std::shared_ptr<Reducer> reducer;
  py::list params;
  std::vector<bool> own_grad;  // per parameter: has_own_grad, decided once
};

// A torch parameter: its gradient is its .grad, not itself.
bool has_own_grad(py::handle param) {
  return py::hasattr(param, "grad") && py::hasattr(param, "requires_grad");
}

// The gradient of parameter `index`: `grad` when given, the parameter's .grad when it has
// that attribute (a torch tensor), else the parameter itself (the caller's gradient buffer).
std::optional<Tensor> gradient_of(const PyReducer& self, size_t index, const py::object& grad) {
  if (!grad.is_none()) return to_tensor(grad, true, "Reducer: grad");
  if (index >= self.params.size()) return std::nullopt;  // the reducer names the bad index
  if (!self.own_grad[index]) return std::nullopt;
  py::object g = self.params[index].attr("grad");
  if (g.is_none()) {
    throw core::InvalidArgument("Reducer: parameter " + std::to_string(index) +
                                " has no gradient (its .grad is None)");
  }
  return to_tensor(g, true, "Reducer: parameter .grad");
}

// A torch parameter that this rank did not use in the pass but another rank did gets the
// average as its .grad, as torch's Reducer does (a numpy parameter is its own gradient and
// has it already).
void give_averages_to_unused(PyReducer& self) {
  const std::vector<bool> here = self.reducer->local_used_map();
  const std::vector<bool> anywhere = self.reducer->global_used_map();
  for (size_t i = 0; i < here.size(); ++i) {
    if (here[i] || !anywhere[i] || !self.own_grad[i]) continue;
    py::object param = self.params[i];
    py::object average = py::module_::import("torch.utils.dlpack")
                             .attr("from_dlpack")(to_dlpack_capsule(self.reducer->bucket_view(i)))
                             .attr("clone")();
    py::object grad = param.attr("grad");
    if (grad.is_none()) {
      param.attr("grad") = average;
    } else {
      grad.attr("copy_")(average);
    }
  }
}

py::list python_list(const std::vector<Tensor>& tensors) {
  py::list out;
  for (const Tensor& t : tensors) out.append(to_python(t));
  return out;
}

py::object used_map(const std::vector<bool>& used) {
  py::array_t<int32_t> out(static_cast<py::ssize_t>(used.size()));
  for (size_t i = 0; i < used.size(); ++i) out.mutable_at(i) = used[i] ? 1 : 0;
  return out;
}

// A comm hook's result as the reducer needs it: the future of the hook's own collective (its
// tensors) as is, or a future of a Python value (a tensor, or a list holding one) converted.
std::shared_ptr<Future> tensor_future(std::shared_ptr<Future> future) {
  if (future == nullptr) throw core::InvalidArgument("comm hook: returned None, not a Future");
  return future->then([](Future& done) -> FutureValue {
    const FutureValue& value = done.value_now();
    if (!value.object) return value;
    GilGuard gil;
    if (!gil) throw std::runtime_error("comm hook: the Python interpreter is shutting down");
    py::object obj = *static_cast<py::object*>(value.object.get());
    if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
      if (py::len(obj) == 0) return FutureValue{};
      obj = obj[py::int_(0)];
    }
    return FutureValue{{to_tensor(obj, false, "comm hook: result")}, nullptr};
  });
}

}  // namespace

void init_ddp(py::module_& m) {
  m.attr("_DEFAULT_FIRST_BUCKET_BYTES") = ddp::kDefaultFirstBucketBytes;

  py::enum_<ddp::BuiltinCommHookType>(m, "BuiltinCommHookType",
                                      "The comm hooks implemented in C++.")
      .value("ALLREDUCE", ddp::BuiltinCommHookType::kAllreduce)
      .value("FP16_COMPRESS", ddp::BuiltinCommHookType::kFp16Compress);

  py::class_<GradBucket, std::shared_ptr<GradBucket>>(
      m, "GradBucket",
      "A bucket of gradients as a comm hook receives it: one flat buffer holding the gradients "
      "of its parameters one after another.")
      .def("index", &GradBucket::index, "The bucket's index (0 is reduced first).")
      .def(
          "buffer", [](const GradBucket& b) { return to_python(b.buffer()); },
          "The flat buffer (reduce it in place, or return a new one from the hook's future).")
      .def(
          "gradients", [](const GradBucket& b) { return python_list(b.gradients()); },
          "Views of the buffer, one per parameter, shaped like the parameters.")
      .def(
          "parameters", [](const GradBucket& b) { return python_list(b.parameters()); },
          "The bucket's parameters.")
      .def("is_last", &GradBucket::is_last,
           "Whether this is the last bucket reduced in a backward pass.")
      .def(
          "set_buffer",
          [](GradBucket& b, py::object buffer) {
            b.set_buffer(to_tensor(buffer, true, "GradBucket.set_buffer: buffer"));
          },
          py::arg("buffer"), "Replaces the buffer (same dtype and number of elements).");

  py::class_<PyReducer>(
      m, "Reducer",
      "Averages gradients across a process group during the backward pass, bucket by bucket, "
      "each bucket as soon as all of its gradients are ready. Call prepare_for_backward(), "
      "then _autograd_hook(i) as each parameter's gradient becomes final (a torch parameter's "
      ".grad is used; otherwise the parameter is its own gradient buffer, or pass grad=); the "
      "call that completes the last bucket waits for every reduction and writes the averages "
      "back. With find_unused_parameters, finish with finalize_backward().")
      .def(py::init([](py::object params, std::vector<std::vector<size_t>> bucket_indices,
                       std::vector<size_t> per_bucket_size_limits,
                       std::shared_ptr<ProcessGroup> process_group,
                       std::vector<bool> expect_sparse_gradients, int64_t bucket_bytes_cap,
                       bool find_unused_parameters, bool gradient_as_bucket_view,
                       py::object /*param_to_name_mapping*/, int64_t first_bucket_bytes_cap) {
             ddp::ReducerOptions opts;
             opts.first_bucket_bytes_cap = first_bucket_bytes_cap;
             opts.expect_sparse_gradients = std::move(expect_sparse_gradients);
             opts.bucket_bytes_cap = bucket_bytes_cap;
             opts.find_unused_parameters = find_unused_parameters;
             opts.gradient_as_bucket_view = gradient_as_bucket_view;
             py::list objects(params);
             std::vector<bool> own_grad;
             for (py::handle p : objects) own_grad.push_back(has_own_grad(p));
             for (bool own : own_grad) opts.param_is_gradient.push_back(!own);
             auto reducer = std::make_shared<Reducer>(
                 to_tensors(objects, true, "Reducer: params"), std::move(bucket_indices),
                 std::move(per_bucket_size_limits), std::move(process_group), std::move(opts));
             return PyReducer{std::move(reducer), std::move(objects), std::move(own_grad)};
           }),
           py::arg("params"), py::arg("bucket_indices"), py::arg("per_bucket_size_limits"),
           py::arg("process_group"), py::arg("expect_sparse_gradients") = std::vector<bool>{},
           py::arg("bucket_bytes_cap") = static_cast<int64_t>(ddp::kDefaultBucketBytes),
           py::arg("find_unused_parameters") = false, py::arg("gradient_as_bucket_view") = false,
           py::arg("param_to_name_mapping") = py::dict(),
           py::arg("first_bucket_bytes_cap") = static_cast<int64_t>(ddp::kDefaultFirstBucketBytes))
      .def(
          "prepare_for_backward",
          [](PyReducer& self, py::object /*outputs*/) { self.reducer->prepare_for_backward(); },
          py::arg("outputs") = py::none(),
          "Starts a backward pass (DistError if the previous one was not finished).")
      .def(
          "_autograd_hook",
          [](PyReducer& self, size_t index, py::object grad) {
            if (!self.reducer->in_backward()) {  // ignored, before .grad is looked at
              self.reducer->mark_ready(index);
              return;
            }
            std::optional<Tensor> g = gradient_of(self, index, grad);
            py::gil_scoped_release release;
            self.reducer->mark_ready(index, std::move(g));
          },
          py::arg("index"), py::arg("grad") = py::none(),
          "Parameter `index`'s gradient is final for this backward pass.")
      .def(
          "finalize_backward",
          [](PyReducer& self) {
            const bool was_open = self.reducer->in_backward();
            {
              py::gil_scoped_release release;
              self.reducer->finalize_backward();
            }
            if (was_open) give_averages_to_unused(self);
          },
          "Reduces what is pending, waits, and writes the averages into the gradients.")
      .def("_check_reducer_finalized", [](PyReducer& self) { self.reducer->check_finalized(); })
      .def("_reset_state",
           [](PyReducer& self) {
             py::gil_scoped_release release;
             self.reducer->reset_state();
           })
      .def(
          "get_backward_stats", [](PyReducer& self) { return self.reducer->backward_stats(); },
          "Nanoseconds from prepare_for_backward to each parameter's gradient being ready.")
      .def(
          "_get_local_used_map",
          [](PyReducer& self) { return used_map(self.reducer->local_used_map()); },
          "Per parameter, 1 if this rank marked it ready in the last pass (int32 array).")
      .def(
          "_get_global_used_map",
          [](PyReducer& self) { return used_map(self.reducer->global_used_map()); },
          "Per parameter: whether any rank used it in the last finished pass.")
      .def("_get_zeros_like_grad_buckets",
           [](PyReducer& self) {
             std::vector<std::shared_ptr<GradBucket>> out;
             for (GradBucket& b : self.reducer->zeros_like_grad_buckets()) {
               out.push_back(std::make_shared<GradBucket>(std::move(b)));
             }
             return out;
           })
      .def(
          "_run_comm_hook",
          [](PyReducer& self, GradBucket& bucket) {
            return tensor_future(self.reducer->run_comm_hook(bucket));
          },
          py::arg("bucket"))
      .def(
          "_run_allreduce_hook",
          [](PyReducer& self, GradBucket& bucket) {
            return self.reducer->run_allreduce_hook(bucket);
          },
          py::arg("bucket"))
      .def(
          "_bucket_view",
          [](PyReducer& self, size_t index) { return to_python(self.reducer->bucket_view(index)); },
          py::arg("index"), "Where parameter `index`'s gradient sits in its bucket.")
      .def_property_readonly("bucket_indices",
                             [](PyReducer& self) { return self.reducer->bucket_indices(); })
      .def_property_readonly("per_bucket_size_limits",
                             [](PyReducer& self) { return self.reducer->per_bucket_size_limits(); })
      .def(
          "_rebuild_buckets",
          [](PyReducer& self) {
            py::gil_scoped_release release;
            return self.reducer->rebuild_buckets();
          },
          "Regroups the buckets in the order the last full backward pass marked gradients "
          "ready (rank 0's grouping, broadcast); once per reducer. Returns whether it did. "
          "Bucket views taken before are no longer the buckets.")
      .def(
          "_push_all_rebuilt_params",
          [](PyReducer& self) { self.reducer->push_all_rebuilt_params(); },
          "Takes the parameters in index order as the order for _rebuild_buckets.")
      .def(
          "_update_process_group",
          [](PyReducer& self, std::shared_ptr<ProcessGroup> group) {
            py::gil_scoped_release release;
            self.reducer->update_process_group(std::move(group));
          },
          py::arg("new_process_group"),
          "Reduces over new_process_group from now on (not during a backward pass); the "
          "buckets may be rebuilt again after the next full pass.")
      .def("_has_rebuilt_buckets",
           [](PyReducer& self) { return self.reducer->has_rebuilt_buckets(); })
      .def("_set_static_graph", [](PyReducer& self) { self.reducer->set_static_graph(); })
      .def("_ddp_graph_static", [](PyReducer& self) { return self.reducer->static_graph(); })
      .def_property_readonly("num_iterations",
                             [](PyReducer& self) { return self.reducer->num_iterations(); });

  m.def(
      "_register_comm_hook",
      [](PyReducer& self, py::object state, py::function hook) {
        auto fn = hold_python(std::move(hook));
        auto st = hold_python(std::move(state));
        self.reducer->register_comm_hook([fn, st](GradBucket& bucket) {
          GilGuard gil;
          if (!gil) throw std::runtime_error("comm hook: the Python interpreter is shutting down");
          auto handle = std::make_shared<GradBucket>(bucket);
          py::object result;
          try {
            result = (*fn)(*st, handle);
          } catch (const py::error_already_set& e) {
            // Kept by the reducer and raised to Python later, maybe more than once.
            std::rethrow_exception(python_exception_ptr(e));
          }
          // The hook may have replaced the buffer of its copy.
          bucket.set_buffer(handle->buffer());
          return tensor_future(result.cast<std::shared_ptr<Future>>());
        });
      },
      py::arg("reducer"), py::arg("state"), py::arg("comm_hook"),
      "Registers comm_hook(state, bucket) -> Future, whose value is the reduced bucket buffer.");
  m.def(
      "_register_builtin_comm_hook",
      [](PyReducer& self, ddp::BuiltinCommHookType type) {
        self.reducer->register_builtin_comm_hook(type);
      },
      py::arg("reducer"), py::arg("comm_hook_type"));

  m.def(
      "_compute_bucket_assignment_by_size",
      [](py::object tensors, std::vector<size_t> bucket_size_limits,
         std::vector<bool> expect_sparse_gradient, std::vector<int64_t> tensor_indices,
         py::object /*logger*/) {
        ddp::BucketAssignment a = ddp::compute_bucket_assignment_by_size(
            to_tensors(tensors, false, "_compute_bucket_assignment_by_size: tensors"),
            bucket_size_limits, expect_sparse_gradient, tensor_indices);
        return py::make_tuple(a.buckets, a.size_limits);
      },
      py::arg("tensors"), py::arg("bucket_size_limits"),
      py::arg("expect_sparse_gradient") = std::vector<bool>{},
      py::arg("tensor_indices") = std::vector<int64_t>{}, py::arg("logger") = py::none(),
      "Groups tensors into buckets by dtype and size; returns (bucket indices, size limits).");
  m.def(
      "_broadcast_coalesced",
      [](std::shared_ptr<ProcessGroup> group, py::object tensors, size_t buffer_size, int src) {
        std::vector<Tensor> ts = to_tensors(tensors, true, "_broadcast_coalesced: tensors");
        py::gil_scoped_release release;
        ddp::broadcast_coalesced(group, ts, buffer_size, src);
      },
      py::arg("process_group"), py::arg("tensors"), py::arg("buffer_size"), py::arg("src") = 0,
      "Overwrites `tensors` with their values on rank `src`, in flat buffers of buffer_size.");
  m.def(
      "_verify_params_across_processes",
      [](std::shared_ptr<ProcessGroup> group, py::object params, py::object /*logger*/) {
        std::vector<Tensor> ts = to_tensors(params, false, "_verify_params_across_processes");
        py::gil_scoped_release release;
        ddp::verify_params_across_processes(group, ts);
      },
      py::arg("process_group"), py::arg("params"), py::arg("logger") = py::none(),
      "Raises if this rank's parameters differ in count, dtype or shape from rank 0's.");
}

}  // namespace c10d::python
