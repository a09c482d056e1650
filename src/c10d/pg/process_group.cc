// ProcessGroup: one dispatch method per collective of torch's ProcessGroup interface (over 800
// lines because there are that many; each is a few lines around the shared validation, sequence
// numbers, hooks and backend choice written once here).
#include "c10d/pg/process_group.h"

#include <bit>

#include <algorithm>
#include <cstring>

#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/pg/profiler.h"
#include "c10d/pg/staging.h"
#include "c10d/pg/validate.h"

namespace c10d::pg {

using core::DeviceType;
using core::OpType;

ProcessGroup::ProcessGroup(std::shared_ptr<store::Store> store, int rank, int size, Options options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)),
      trace_(FlightRecorder::instance().register_group(store_, rank_, size_, options_.backend,
                                                       options_.timeout)) {
  C10D_CHECK_ARG(size_ > 0, "ProcessGroup: world size must be positive, got ", size_);
  check_rank("ProcessGroup", "rank", rank_, size_);
}

std::string ProcessGroup::group_name() const {
  std::lock_guard lock(mutex_);
  return group_name_;
}
void ProcessGroup::set_group_name(const std::string& name) {
  std::lock_guard lock(mutex_);
  group_name_ = name;
  if (trace_) FlightRecorder::instance().set_group_name(*trace_, name);
}
std::string ProcessGroup::group_desc() const {
  std::lock_guard lock(mutex_);
  return group_desc_;
}
void ProcessGroup::set_group_desc(const std::string& desc) {
  std::lock_guard lock(mutex_);
  group_desc_ = desc;
  if (trace_) FlightRecorder::instance().set_group_desc(*trace_, desc);
}
std::optional<std::vector<int>> ProcessGroup::global_ranks() const {
  std::lock_guard lock(mutex_);
  return global_ranks_;
}
void ProcessGroup::set_global_ranks(std::vector<int> ranks) {
  C10D_CHECK_ARG_EQ(ranks.size(), static_cast<size_t>(size_),
                    "set_global_ranks: one global rank per group rank");
  std::lock_guard lock(mutex_);
  global_ranks_ = ranks;
  if (trace_) FlightRecorder::instance().set_global_ranks(*trace_, std::move(ranks));
}

void ProcessGroup::register_backend(DeviceType device, std::shared_ptr<Backend> backend) {
  C10D_CHECK_ARG(backend != nullptr, "register_backend: backend is None");
  backend->set_group_sequence([group = weak_from_this()]() -> std::optional<uint64_t> {
    const auto alive = group.lock();
    if (!alive) return std::nullopt;
    return alive->sequence_number();
  });
  std::lock_guard lock(mutex_);
  std::shared_ptr<Backend>& slot = backends_[device];
  if (device == DeviceType::kCPU) {
    if (slot) replaced_.push_back(slot);
    cpu_backend_.store(backend.get(), std::memory_order_release);
  }
  slot = std::move(backend);
}

void ProcessGroup::track_pending(const WorkPtr& work) {
  std::lock_guard lock(pending_mutex_);
  // Bounded by the Works still alive and running: the list is pruned as it grows.
  if (pending_.size() >= 64 && std::has_single_bit(pending_.size())) {
    std::erase_if(pending_, [](const std::weak_ptr<Work>& w) {
      const auto alive = w.lock();
      return !alive || alive->is_completed();
    });
  }
  pending_.push_back(work);
}

void ProcessGroup::wait_for_pending_works() {
  std::vector<std::weak_ptr<Work>> pending;
  {
    std::lock_guard lock(pending_mutex_);
    pending.swap(pending_);
  }
  for (const auto& w : pending) {
    if (const auto work = w.lock(); work && !work->is_completed()) work->wait();
  }
}

std::shared_ptr<Backend> ProcessGroup::get_backend(DeviceType device) const {
  std::lock_guard lock(mutex_);
  auto it = backends_.find(device);
  if (it == backends_.end()) {
    throw core::InvalidArgument("No backend of process group '" + group_name_ +
                                "' serves device type " + core::Device{device, 0}.str());
  }
  return it->second;
}

Tensor ProcessGroup::empty_for_collectives(const std::vector<int64_t>& sizes,
                                           core::DType dtype) const {
  std::shared_ptr<Backend> backend;
  {
    std::lock_guard lock(mutex_);
    auto it = backends_.find(DeviceType::kCPU);
    if (it != backends_.end()) backend = it->second;
  }
  std::optional<Tensor> t;
  if (backend) t = backend->empty_for_collectives(sizes, dtype);
  if (!t) t = Tensor::empty(sizes, dtype);
  std::memset(t->data(), 0, t->nbytes());
  return *std::move(t);
}

std::vector<DeviceType> ProcessGroup::device_types() const {
  std::lock_guard lock(mutex_);
  std::vector<DeviceType> out;
  for (const auto& [device, backend] : backends_) out.push_back(device);
  return out;
}

void ProcessGroup::register_on_completion_hook(Hook hook) {
  std::lock_guard lock(mutex_);
  hooks_.push_back(std::move(hook));
  any_hooks_.store(true, std::memory_order_release);
}

bool ProcessGroup::has_hooks() const {
  std::lock_guard lock(mutex_);
  return !hooks_.empty();
}

DeviceType ProcessGroup::device_of(const std::vector<Tensor>& tensors) const {
  return tensors.empty() ? DeviceType::kCPU : tensors.front().device().type;
}

void ProcessGroup::finish_trace(TraceHandle traced, const WorkPtr& work) {
  // A synchronous operation is already done: no callback to allocate.
  if (!work || work->is_completed()) {
    FlightRecorder::instance().record_finished(traced, work ? work->exception() : nullptr);
    return;
  }
  // Before wait() returns: whoever waited may read the recorder at once.
  // The handle does not own its group: the observer keeps it alive.
  work->get_future()->add_observer(
      [traced = std::move(traced), group = trace_](std::exception_ptr error) {
        FlightRecorder::instance().record_finished(traced, error);
      });
}

template <typename Fn>
WorkPtr ProcessGroup::dispatch(TraceOp trace, DeviceType device, Fn&& fn) {
  const OpType op = trace.op;
  std::shared_ptr<Backend> backend;
  {
    std::lock_guard lock(mutex_);
    auto it = backends_.find(device);
    if (it != backends_.end()) {
      backend = it->second;
    } else if (backends_.empty()) {
      // A ProcessGroup subclass (a Python backend) that does not override this collective.
      throw core::NotSupported(core::detail::str_cat(
          "ProcessGroup '", group_name_, "' does not support ", core::op_type_name(op),
          ": it has no backend, and its subclass does not implement it"));
    }
  }
  if (!backend) backend = get_backend(device);  // throws, naming the device
  const uint64_t seq = ++seq_;
  std::vector<Hook> hooks;
  if (any_hooks_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mutex_);
    hooks = hooks_;
  }
  // Backends do not report when an operation really starts: calling them counts as the start.
  TraceHandle traced;
  if (trace_) {
    trace.pg_seq = seq;
    traced = FlightRecorder::instance().record(trace_, trace, /*started=*/true);
  }
  const auto started = core::Clock::now();
  std::function<void()> close_event;  // torch's profiler's event for this operation
  if (const ProfilerBridge* bridge = profiling()) {
    close_event = open_profiler_event(*bridge, backend->name(), op,
                                      trace.inputs == TensorRefs() ? trace.outputs : trace.inputs);
  }
  WorkPtr work;
  try {
    work = fn(*backend);
  } catch (...) {
    if (traced) FlightRecorder::instance().record_finished(traced, std::current_exception());
    if (close_event) close_event();
    throw;
  }
  if (close_event) {
    if (!work || work->is_completed()) {
      close_event();
    } else {
      work->get_future()->add_observer(
          [close = std::move(close_event)](std::exception_ptr) { close(); });
    }
  }
  if (work && any_coalescing_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mutex_);
    if (coalescing_) coalesced_.push_back(work);
  }
  if (traced) finish_trace(std::move(traced), work);
  if (!hooks.empty() && work) {
    work->get_future()->add_callback([hooks = std::move(hooks), op, seq, started](core::Future&) {
      auto info = std::make_shared<WorkInfo>();
      info->op_type = op;
      info->seq = seq;
      info->time_started = started;
      info->time_finished = core::Clock::now();
      info->active_duration = info->time_finished - started;
      for (const auto& hook : hooks) {
        try {
          hook(info);
        } catch (const std::exception& e) {
          core::log(core::LogLevel::kWarning, std::string("a completion hook raised: ") + e.what());
        }
      }
    });
  }
  return work;
}

WorkPtr ProcessGroup::broadcast(std::vector<Tensor>& tensors, const BroadcastOptions& opts) {
  if (auto w = Staging::run_in_place("broadcast", tensors,
                                     [&](auto& t) { return broadcast(t, opts); })) {
    return *w;
  }
  check_rank("broadcast", "root rank", opts.root_rank, size_);
  C10D_CHECK_ARG(opts.root_tensor >= 0 && opts.root_tensor < int64_t(tensors.size()),
                 "broadcast: invalid root tensor index ", opts.root_tensor, " (the list holds ",
                 tensors.size(), " tensors)");
  check_tensor_list("broadcast", tensors);
  return dispatch(
      {.op = OpType::kBroadcast, .inputs = tensors, .outputs = tensors, .timeout = opts.timeout},
      device_of(tensors), [&](Backend& b) { return b.broadcast(tensors, opts); });
}

WorkPtr ProcessGroup::allreduce(std::vector<Tensor>& tensors, const AllreduceOptions& opts) {
  if (auto w = Staging::run_in_place("allreduce", tensors,
                                     [&](auto& t) { return allreduce(t, opts); })) {
    return *w;
  }
  check_tensor_list("allreduce", tensors);
  check_reduce("allreduce", tensors.front(), opts.reduce_op);
  return dispatch(
      {.op = OpType::kAllreduce, .inputs = tensors, .outputs = tensors, .timeout = opts.timeout},
      device_of(tensors), [&](Backend& b) { return b.allreduce(tensors, opts); });
}

bool ProcessGroup::run_inline(const InlineOp& op, WorkPtr* work) {
  // Profiled operations take the general path, which opens their events.
  if (any_hooks_.load(std::memory_order_acquire) ||
      any_coalescing_.load(std::memory_order_acquire) || profiling() != nullptr ||
      !inline_well_formed(op, rank_, size_)) {
    return false;
  }
  Backend* const backend = cpu_backend_.load(std::memory_order_acquire);
  if (backend == nullptr || !backend->has_inline(op.type)) return false;
  const uint64_t seq = ++seq_;
  TraceHandle traced;
  if (trace_) {
    TraceOp trace{.op = op.type, .pg_seq = seq, .timeout = op.timeout};
    switch (op.type) {
      case OpType::kBarrier:
        break;
      case OpType::kAllreduce:
      case OpType::kBroadcast:
      case OpType::kReduce:
        trace.inputs = trace.outputs = op.input;
        break;
      case OpType::kGather:
      case OpType::kAllgather:
        trace.inputs = op.input;
        trace.outputs = TensorRefs(op.list, op.list_size);
        break;
      case OpType::kReduceScatter:
      case OpType::kScatter:
        trace.inputs = TensorRefs(op.list, op.list_size);
        trace.outputs = op.output;
        break;
      case OpType::kSend:
        trace.inputs = op.input;
        trace.peer = op.root;
        break;
      case OpType::kRecv:
        trace.outputs = op.output;
        trace.peer = op.root;
        break;
      default:
        trace.inputs = op.input;
        trace.outputs = op.output;
    }
    traced = FlightRecorder::instance().record(trace_, trace, /*started=*/true);
  }
  WorkPtr posted;
  try {
    posted = backend->run_inline(op);
  } catch (...) {
    if (traced) FlightRecorder::instance().record_finished(traced, std::current_exception());
    throw;
  }
  if (traced) finish_trace(std::move(traced), posted);
  if (work != nullptr) *work = std::move(posted);
  return true;
}

namespace {
// Whether some of these tensors are complex and some are not.
bool mixes_complex_and_real(const std::vector<std::vector<Tensor>>& outputs,
                            const std::vector<Tensor>& inputs) {
  bool complex = false, real = false;
  auto see = [&](const Tensor& t) {
    (core::is_complex(t.dtype()) ? complex : real) = true;
  };
  for (const auto& list : outputs) std::for_each(list.begin(), list.end(), see);
  std::for_each(inputs.begin(), inputs.end(), see);
  return complex && real;
}

// As torch, complex tensors mixed with real ones take part as pairs of reals (float32[..., 2]
// for complex64): a complex tensor and the real view of one gather into each other, and a
// list of both reduces in one call.
std::vector<Tensor> as_reals(std::vector<Tensor> tensors) {
  for (auto& t : tensors) {
    if (core::is_complex(t.dtype())) t = t.view_as_real();
  }
  return tensors;
}

std::vector<std::vector<Tensor>> as_reals(const std::vector<std::vector<Tensor>>& lists) {
  std::vector<std::vector<Tensor>> reals;
  for (const auto& list : lists) reals.push_back(as_reals(list));
  return reals;
}
}  // namespace

WorkPtr ProcessGroup::allreduce_coalesced(std::vector<Tensor>& tensors,
                                          const AllreduceCoalescedOptions& opts) {
  if (auto w = Staging::run_in_place("allreduce_coalesced", tensors,
                                     [&](auto& t) { return allreduce_coalesced(t, opts); })) {
    return *w;
  }
  if (mixes_complex_and_real({}, tensors)) {
    for (const auto& t : tensors) check_reduce("allreduce_coalesced", t, opts.reduce_op);
    std::vector<Tensor> reals = as_reals(tensors);
    return allreduce_coalesced(reals, opts);
  }
  check_tensor_list("allreduce_coalesced", tensors, /*same_shape=*/false);
  check_reduce("allreduce_coalesced", tensors.front(), opts.reduce_op);
  return dispatch({.op = OpType::kAllreduceCoalesced,
                   .inputs = tensors,
                   .outputs = tensors,
                   .timeout = opts.timeout},
                  device_of(tensors),
                  [&](Backend& b) { return b.allreduce_coalesced(tensors, opts); });
}

WorkPtr ProcessGroup::reduce(std::vector<Tensor>& tensors, const ReduceOptions& opts) {
  if (auto w = Staging::run_in_place("reduce", tensors, [&](auto& t) { return reduce(t, opts); })) {
    return *w;
  }
  check_tensor_list("reduce", tensors);
  C10D_CHECK_ARG(tensors.size() == 1, "reduce: requires a single-element tensor list, got ",
                 tensors.size());
  C10D_CHECK_ARG(opts.root_tensor == 0, "reduce: invalid root tensor index ", opts.root_tensor,
                 " (the list holds 1 tensor)");
  check_rank("reduce", "root rank", opts.root_rank, size_);
  check_reduce("reduce", tensors.front(), opts.reduce_op);
  return dispatch(
      {.op = OpType::kReduce, .inputs = tensors, .outputs = tensors, .timeout = opts.timeout},
      device_of(tensors), [&](Backend& b) { return b.reduce(tensors, opts); });
}

namespace {
// Checks lists[i] holds `size` tensors shaped and typed like singles[i]; `side` ("output" or
// "input") names the lists.
void check_gathered(std::string_view op, std::string_view side,
                    std::vector<std::vector<Tensor>>& lists, std::vector<Tensor>& singles,
                    int size) {
  check_list_length(op, core::detail::str_cat(side, " list"), lists.size(), singles.size());
  for (size_t i = 0; i < lists.size(); ++i) {
    // Both of torch's wordings ("invalid output tensor list", "Incorrect output list size").
    C10D_CHECK_ARG(lists[i].size() == static_cast<size_t>(size), op, ": invalid ", side,
                   " tensor list: Incorrect ", side, " list size ", lists[i].size(), ". ",
                   side == "output" ? "Output" : "Input", " list size should be ", size,
                   " (one tensor per rank)");
    check_tensor_list(op, lists[i]);
    if (side == "output") {
      check_same_dtype(op, lists[i].front(), singles[i]);
    } else {
      check_same_dtype(op, singles[i], lists[i].front());
    }
    C10D_CHECK_ARG(lists[i].front().numel() == singles[i].numel(), op,
                   ": invalid tensor size: ", side, " tensors ", lists[i].front().str(),
                   " must have as many elements as ", singles[i].str());
  }
}
}  // namespace

WorkPtr ProcessGroup::allgather(std::vector<std::vector<Tensor>>& outputs,
                                std::vector<Tensor>& inputs, const AllgatherOptions& opts) {
  if (auto w = Staging::run("allgather", outputs, inputs,
                            [&](auto& o, auto& i) { return allgather(o, i, opts); })) {
    return *w;
  }
  if (mixes_complex_and_real(outputs, inputs)) {
    auto real_outputs = as_reals(outputs);
    auto real_inputs = as_reals(inputs);
    return allgather(real_outputs, real_inputs, opts);
  }
  if (inputs.size() == 1 && outputs.size() == 1 && outputs[0].size() > 1 &&
      std::any_of(outputs[0].begin(), outputs[0].end(),
                  [&](const Tensor& t) { return t.numel() != outputs[0][0].numel(); })) {
    return allgather_uneven(outputs[0], inputs[0], opts);
  }
  C10D_CHECK_ARG(!inputs.empty(), "allgather: requires non-empty input tensor list");
  C10D_CHECK_ARG(outputs.size() == inputs.size(),
                 "allgather: requires input/output tensor lists to have the same length: ",
                 outputs.size(), " output lists for ", inputs.size(), " input tensors");
  check_tensor_list("allgather", inputs);
  check_gathered("allgather", "output", outputs, inputs, size_);
  return dispatch(
      {.op = OpType::kAllgather, .inputs = inputs, .outputs = outputs, .timeout = opts.timeout},
      device_of(inputs), [&](Backend& b) { return b.allgather(outputs, inputs, opts); });
}

// Every rank contributes its input padded to the largest output through one allgather_base,
// and the leading elements of each rank's piece land in that rank's output.
WorkPtr ProcessGroup::allgather_uneven(std::vector<Tensor>& outputs, const Tensor& input,
                                       const AllgatherOptions& opts) {
  constexpr std::string_view op = "allgather";
  check_list_length(op, "output tensor list (one tensor per rank)", outputs.size(),
                    static_cast<size_t>(size_));
  check_tensor(op, input);
  int64_t largest = 0;
  for (const auto& out : outputs) {
    check_tensor(op, out);
    check_same_dtype(op, out, input);
    largest = std::max(largest, out.numel());
  }
  // The ranks exchange how many elements each sends and expects from every rank, so that all
  // of them reach the same verdict on the sizes: a wrong list on one rank fails on every rank
  // instead of leaving the others waiting in the allgather. (Other mistakes, a dtype say, are
  // found by each rank alone, as for any collective; and the exchange completes before the
  // call returns, also with async_op.)
  const int64_t row = size_ + 1;
  Tensor mine = Tensor::empty({row}, core::DType::kInt64);
  mine.data_as<int64_t>()[0] = input.numel();
  for (int r = 0; r < size_; ++r) mine.data_as<int64_t>()[1 + r] = outputs[r].numel();
  Tensor views = Tensor::empty({row * size_}, core::DType::kInt64);
  std::memset(views.data(), 0, views.nbytes());  // a backend that moves no data (fake) agrees
  AllgatherOptions exchange = opts;
  exchange.async_op = false;
  // The backend times the exchange out itself (naming the ranks missing); this bound is the
  // backstop for a backend that does not.
  allgather_base(views, mine, exchange)
      ->wait(opts.timeout == kUnsetTimeout ? options_.timeout : opts.timeout);
  const int64_t* v = views.data_as<int64_t>();
  for (int q = 0; q < size_; ++q) {
    for (int r = 0; r < size_; ++r) {
      C10D_CHECK_ARG(v[q * row + 1 + r] == v[r * row], op, ": invalid tensor size: rank ", q,
                     "'s output tensor ", r, " holds ", v[q * row + 1 + r], " elements, but rank ",
                     r, " sends ", v[r * row]);
    }
  }
  Tensor padded = Tensor::empty({largest}, input.dtype());
  std::memset(padded.data(), 0, padded.nbytes());
  core::copy_elements(padded.flat_slice(0, input.numel()), input.reshape({input.numel()}));
  Tensor gathered = Tensor::empty({largest * size_}, input.dtype());
  std::memset(gathered.data(), 0, gathered.nbytes());
  WorkPtr work = allgather_base(gathered, padded, opts);
  auto placed = work->get_future()->then([outputs, gathered, padded, largest](core::Future&) {
    for (size_t r = 0; r < outputs.size(); ++r) {
      const Tensor& out = outputs[r];
      core::copy_elements(
          out,
          gathered.flat_slice(static_cast<int64_t>(r) * largest, out.numel()).reshape(out.sizes()));
    }
    return core::FutureValue{outputs, nullptr};
  });
  return Work::from_future(std::move(placed), OpType::kAllgather, work->description());
}

WorkPtr ProcessGroup::allgather_base(Tensor& output, Tensor& input, const AllgatherOptions& opts) {
  if (auto w = Staging::run("_allgather_base", output, input,
                            [&](auto& o, auto& i) { return allgather_base(o, i, opts); })) {
    return *w;
  }
  check_tensor("_allgather_base", output);
  check_tensor("_allgather_base", input);
  check_same_dtype("_allgather_base", output, input);
  check_numel_ratio("_allgather_base", output, input, size_);
  return dispatch(
      {.op = OpType::kAllgatherBase, .inputs = input, .outputs = output, .timeout = opts.timeout},
      input.device().type, [&](Backend& b) { return b.allgather_base(output, input, opts); });
}

WorkPtr ProcessGroup::allgather_coalesced(std::vector<std::vector<Tensor>>& outputs,
                                          std::vector<Tensor>& inputs,
                                          const AllgatherOptions& opts) {
  if (auto w = Staging::run("allgather_coalesced", outputs, inputs,
                            [&](auto& o, auto& i) { return allgather_coalesced(o, i, opts); })) {
    return *w;
  }
  if (mixes_complex_and_real(outputs, inputs)) {
    auto real_outputs = as_reals(outputs);
    auto real_inputs = as_reals(inputs);
    return allgather_coalesced(real_outputs, real_inputs, opts);
  }
  check_tensor_list("allgather_coalesced", inputs, /*same_shape=*/false);
  // Dtypes first, as torch checks them before the lists' lengths.
  for (const auto& per_rank : outputs) {
    for (size_t i = 0; i < per_rank.size() && i < inputs.size(); ++i) {
      C10D_CHECK_ARG(per_rank[i].dtype() == inputs[i].dtype(),
                     "allgather_coalesced: ", core::kDifferentDtypes,
                     ": invalid tensor type at index ", i, ": output is ",
                     core::dtype_name(per_rank[i].dtype()), " but input is ",
                     core::dtype_name(inputs[i].dtype()));
    }
  }
  C10D_CHECK_ARG(outputs.size() == static_cast<size_t>(size_),
                 "allgather_coalesced: output lists should be equal to world size: got ",
                 outputs.size(), " lists for ", size_, " ranks");
  for (auto& per_rank : outputs) {
    check_list_length("allgather_coalesced", "output list of each rank (one tensor per input)",
                      per_rank.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_tensor("allgather_coalesced", per_rank[i]);
      C10D_CHECK_ARG(per_rank[i].numel() == inputs[i].numel(),
                     "allgather_coalesced: invalid size of output tensor at index ", i, ": ",
                     per_rank[i].str(), " for an input ", inputs[i].str());
    }
  }
  return dispatch({.op = OpType::kAllgatherCoalesced,
                   .inputs = inputs,
                   .outputs = outputs,
                   .timeout = opts.timeout},
                  device_of(inputs),
                  [&](Backend& b) { return b.allgather_coalesced(outputs, inputs, opts); });
}

namespace {
// The (output, input) pairs of a coalesced tensor collective: one output per input, same
// dtype, the larger of each pair (the output of allgather, the input of reduce_scatter)
// holding `size` times the other's elements.
void check_tensor_pairs(std::string_view op, std::vector<Tensor>& outputs,
                        std::vector<Tensor>& inputs, int size, bool output_larger) {
  check_list_length(op, "output list (one tensor per input)", outputs.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(op, inputs[i]);
    check_tensor(op, outputs[i]);
    check_same_dtype(op, outputs[i], inputs[i]);
    if (output_larger) {
      check_numel_ratio(op, outputs[i], inputs[i], size);
    } else {
      check_numel_ratio(op, inputs[i], outputs[i], size);
    }
  }
}
}  // namespace

WorkPtr ProcessGroup::allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                      std::vector<Tensor>& inputs,
                                                      const AllgatherOptions& opts) {
  if (auto w = Staging::run(
          "allgather_into_tensor_coalesced", outputs, inputs,
          [&](auto& o, auto& i) { return allgather_into_tensor_coalesced(o, i, opts); })) {
    return *w;
  }
  check_tensor_pairs("allgather_into_tensor_coalesced", outputs, inputs, size_,
                     /*output_larger=*/true);
  return dispatch({.op = OpType::kAllgatherCoalesced,
                   .inputs = inputs,
                   .outputs = outputs,
                   .timeout = opts.timeout},
                  device_of(inputs), [&](Backend& b) {
                    return b.allgather_into_tensor_coalesced(outputs, inputs, opts);
                  });
}

WorkPtr ProcessGroup::gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                             const GatherOptions& opts) {
  if (auto w = Staging::run("gather", outputs, inputs,
                            [&](auto& o, auto& i) { return gather(o, i, opts); })) {
    return *w;
  }
  check_rank("gather", "root rank", opts.root_rank, size_);
  check_list_length("gather", "input tensor list", inputs.size(), 1);
  check_tensor("gather", inputs[0]);
  if (rank_ == opts.root_rank) {
    check_gathered("gather", "output", outputs, inputs, size_);
  } else {
    C10D_CHECK_ARG(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                   "gather: requires empty output on non-root: only the root rank (",
                   opts.root_rank, ") may pass output tensors; rank ", rank_, " passed some");
  }
  return dispatch(
      {.op = OpType::kGather, .inputs = inputs, .outputs = outputs, .timeout = opts.timeout},
      inputs[0].device().type, [&](Backend& b) { return b.gather(outputs, inputs, opts); });
}

WorkPtr ProcessGroup::scatter(std::vector<Tensor>& outputs,
                              std::vector<std::vector<Tensor>>& inputs,
                              const ScatterOptions& opts) {
  if (auto w = Staging::run("scatter", outputs, inputs,
                            [&](auto& o, auto& i) { return scatter(o, i, opts); })) {
    return *w;
  }
  check_rank("scatter", "root rank", opts.root_rank, size_);
  check_list_length("scatter", "output tensor list", outputs.size(), 1);
  check_tensor("scatter", outputs[0]);
  if (rank_ == opts.root_rank) {
    check_gathered("scatter", "input", inputs, outputs, size_);
  } else {
    C10D_CHECK_ARG(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                   "scatter: requires empty input on non-root: only the root rank (",
                   opts.root_rank, ") may pass input tensors; rank ", rank_, " passed some");
  }
  return dispatch(
      {.op = OpType::kScatter, .inputs = inputs, .outputs = outputs, .timeout = opts.timeout},
      outputs[0].device().type, [&](Backend& b) { return b.scatter(outputs, inputs, opts); });
}

WorkPtr ProcessGroup::reduce_scatter(std::vector<Tensor>& outputs,
                                     std::vector<std::vector<Tensor>>& inputs,
                                     const ReduceScatterOptions& opts) {
  if (auto w = Staging::run("reduce_scatter", outputs, inputs,
                            [&](auto& o, auto& i) { return reduce_scatter(o, i, opts); })) {
    return *w;
  }
  check_tensor_list("reduce_scatter", outputs);
  check_reduce("reduce_scatter", outputs.front(), opts.reduce_op);
  check_gathered("reduce_scatter", "input", inputs, outputs, size_);
  return dispatch(
      {.op = OpType::kReduceScatter, .inputs = inputs, .outputs = outputs, .timeout = opts.timeout},
      device_of(outputs), [&](Backend& b) { return b.reduce_scatter(outputs, inputs, opts); });
}

WorkPtr ProcessGroup::reduce_scatter_base(Tensor& output, Tensor& input,
                                          const ReduceScatterOptions& opts) {
  if (auto w = Staging::run("_reduce_scatter_base", output, input,
                            [&](auto& o, auto& i) { return reduce_scatter_base(o, i, opts); })) {
    return *w;
  }
  check_tensor("_reduce_scatter_base", output);
  check_tensor("_reduce_scatter_base", input);
  check_same_dtype("_reduce_scatter_base", output, input);
  check_numel_ratio("_reduce_scatter_base", input, output, size_);
  check_reduce("_reduce_scatter_base", output, opts.reduce_op);
  return dispatch({.op = OpType::kReduceScatterBase,
                   .inputs = input,
                   .outputs = output,
                   .timeout = opts.timeout},
                  input.device().type,
                  [&](Backend& b) { return b.reduce_scatter_base(output, input, opts); });
}

WorkPtr ProcessGroup::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                      std::vector<Tensor>& inputs,
                                                      const ReduceScatterOptions& opts) {
  if (auto w = Staging::run(
          "reduce_scatter_tensor_coalesced", outputs, inputs,
          [&](auto& o, auto& i) { return reduce_scatter_tensor_coalesced(o, i, opts); })) {
    return *w;
  }
  check_tensor_pairs("reduce_scatter_tensor_coalesced", outputs, inputs, size_,
                     /*output_larger=*/false);
  for (const auto& out : outputs) {
    check_reduce("reduce_scatter_tensor_coalesced", out, opts.reduce_op);
  }
  return dispatch({.op = OpType::kReduceScatterBase,
                   .inputs = inputs,
                   .outputs = outputs,
                   .timeout = opts.timeout},
                  device_of(inputs), [&](Backend& b) {
                    return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
                  });
}

WorkPtr ProcessGroup::alltoall_base(Tensor& output, Tensor& input,
                                    std::vector<int64_t>& output_split_sizes,
                                    std::vector<int64_t>& input_split_sizes,
                                    const AllToAllOptions& opts) {
  if (auto w = Staging::run("alltoall_base", output, input, [&](auto& o, auto& i) {
        return alltoall_base(o, i, output_split_sizes, input_split_sizes, opts);
      })) {
    return *w;
  }
  check_tensor("alltoall_base", output);
  check_tensor("alltoall_base", input);
  check_same_dtype("alltoall_base", output, input);
  check_splits("alltoall_base", "output split sizes", output, output_split_sizes, size_);
  check_splits("alltoall_base", "input split sizes", input, input_split_sizes, size_);
  return dispatch(
      {.op = OpType::kAlltoallBase, .inputs = input, .outputs = output, .timeout = opts.timeout},
      input.device().type, [&](Backend& b) {
        return b.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
      });
}

WorkPtr ProcessGroup::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                               const AllToAllOptions& opts) {
  if (auto w = Staging::run("alltoall", outputs, inputs,
                            [&](auto& o, auto& i) { return alltoall(o, i, opts); })) {
    return *w;
  }
  check_list_length("alltoall", "output tensor list (one tensor per rank)", outputs.size(),
                    static_cast<size_t>(size_));
  check_list_length("alltoall", "input tensor list (one tensor per rank)", inputs.size(),
                    static_cast<size_t>(size_));
  check_tensor_list("alltoall", outputs, /*same_shape=*/false);
  check_tensor_list("alltoall", inputs, /*same_shape=*/false);
  check_same_dtype("alltoall", outputs.front(), inputs.front());
  return dispatch(
      {.op = OpType::kAlltoall, .inputs = inputs, .outputs = outputs, .timeout = opts.timeout},
      device_of(inputs), [&](Backend& b) { return b.alltoall(outputs, inputs, opts); });
}

WorkPtr ProcessGroup::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  check_single_tensor("send", tensors);
  check_rank("send", "destination rank", dst_rank, size_);
  C10D_CHECK_ARG(dst_rank != rank_, "send: rank ", rank_,
                 " cannot send to itself (destination rank == own rank)");
  return dispatch({.op = OpType::kSend, .inputs = tensors, .peer = dst_rank}, device_of(tensors),
                  [&](Backend& b) { return b.send(tensors, dst_rank, tag); });
}

WorkPtr ProcessGroup::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  check_single_tensor("recv", tensors);
  check_rank("recv", "source rank", src_rank, size_);
  C10D_CHECK_ARG(src_rank != rank_, "recv: rank ", rank_,
                 " cannot receive from itself (source rank == own rank)");
  return dispatch({.op = OpType::kRecv, .outputs = tensors, .peer = src_rank}, device_of(tensors),
                  [&](Backend& b) { return b.recv(tensors, src_rank, tag); });
}

WorkPtr ProcessGroup::recv_anysource(std::vector<Tensor>& tensors, int tag) {
  check_single_tensor("recv_anysource", tensors);
  C10D_CHECK_ARG(size_ > 1, "recv_anysource: a group of one rank has nobody to receive from");
  return dispatch({.op = OpType::kRecvAnySource, .outputs = tensors}, device_of(tensors),
                  [&](Backend& b) { return b.recv_anysource(tensors, tag); });
}

WorkPtr ProcessGroup::barrier(const BarrierOptions& opts) {
  return dispatch({.op = OpType::kBarrier, .timeout = opts.timeout}, DeviceType::kCPU,
                  [&](Backend& b) { return b.barrier(opts); });
}

void ProcessGroup::monitored_barrier(const BarrierOptions& given, bool wait_all_ranks) {
  BarrierOptions opts = given;
  if (opts.timeout == Millis::zero()) {
    // No time at all: rank 0's wait is over before it starts, as torch's Gloo reports it; the
    // others take the shortest wait (a zero timeout means none to the backends' deadlines).
    if (rank_ == 0) {
      throw core::DistTimeoutError("Rank 0 timed out in monitoredBarrier after 0 ms");
    }
    opts.timeout = Millis(1);
  }
  // Through dispatch like every operation, so that it takes a sequence number (the backends
  // count it too) and shows in the flight recorder.
  dispatch({.op = OpType::kBarrier, .timeout = opts.timeout}, DeviceType::kCPU, [&](Backend& b) {
    b.monitored_barrier(opts, wait_all_ranks);
    return WorkPtr();
  });
}

void ProcessGroup::start_coalescing() {
  std::lock_guard lock(mutex_);
  C10D_CHECK(!coalescing_, "start_coalescing: already coalescing on group '", group_name_, "'");
  coalescing_ = true;
  any_coalescing_.store(true, std::memory_order_release);
  coalesced_.clear();
}

WorkPtr ProcessGroup::end_coalescing() {
  std::vector<WorkPtr> works;
  {
    std::lock_guard lock(mutex_);
    C10D_CHECK(coalescing_, "end_coalescing without start_coalescing on group '", group_name_, "'");
    coalescing_ = false;
    any_coalescing_.store(false, std::memory_order_release);
    works.swap(coalesced_);
  }
  // A future completed by the last of the works to finish.
  auto all = std::make_shared<core::Future>();
  struct Pending {
    std::mutex mutex;
    size_t left;
    std::exception_ptr error;
    std::vector<Tensor> outputs;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = works.size();
  if (works.empty()) {
    all->mark_completed({});
  }
  for (auto& work : works) {
    work->get_future()->add_callback([pending, all](core::Future& f) {
      bool last = false;
      {
        std::lock_guard lock(pending->mutex);
        if (f.has_error() && !pending->error) pending->error = f.error();
        if (!f.has_error()) {
          for (const auto& t : f.value_now().tensors) pending->outputs.push_back(t);
        }
        last = --pending->left == 0;
      }
      if (!last) return;
      if (pending->error) {
        all->set_error(pending->error);
      } else {
        all->mark_completed({std::move(pending->outputs), nullptr});
      }
    });
  }
  return Work::from_future(all, OpType::kCoalesced);
}

void ProcessGroup::shutdown() {
  if (trace_) FlightRecorder::instance().close_group(*trace_);
  std::map<DeviceType, std::shared_ptr<Backend>> backends;
  {
    std::lock_guard lock(mutex_);
    backends = backends_;
  }
  for (auto& [device, backend] : backends) backend->finish_pending(backend->timeout());
  for (auto& [device, backend] : backends) backend->shutdown();
}

}  // namespace c10d::pg
