#include "c10d/pg/profiler.h"

#include <atomic>
#include <string_view>

namespace c10d::pg {

namespace {

std::atomic<const ProfilerBridge*>& installed() {
  static std::atomic<const ProfilerBridge*> bridge{nullptr};
  return bridge;
}

// The operation's name in torch's backends' event titles.
std::string_view title(core::OpType op) {
  using core::OpType;
  switch (op) {
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kAllreduce:
      return "all_reduce";
    case OpType::kAllreduceCoalesced:
      return "all_reduce_coalesced";
    case OpType::kReduce:
      return "reduce";
    case OpType::kAllgather:
      return "all_gather";
    case OpType::kAllgatherBase:
      return "all_gather_into_tensor";
    case OpType::kAllgatherCoalesced:
      return "all_gather_coalesced";
    case OpType::kGather:
      return "gather";
    case OpType::kScatter:
      return "scatter";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kReduceScatterBase:
      return "reduce_scatter_tensor";
    case OpType::kAlltoallBase:
    case OpType::kAlltoall:
      return "all_to_all";
    case OpType::kSend:
      return "send";
    case OpType::kRecv:
      return "recv";
    case OpType::kRecvAnySource:
      return "recvAnySource";
    case OpType::kBarrier:
      return "barrier";
    default:
      return "operation";
  }
}

}  // namespace

void set_profiler_bridge(ProfilerBridge bridge) {
  // Never freed: an operation in flight may still read the one it was dispatched with.
  installed().store(new ProfilerBridge(std::move(bridge)), std::memory_order_release);
}

const ProfilerBridge* profiling() {
  const ProfilerBridge* bridge = installed().load(std::memory_order_acquire);
  if (bridge == nullptr || bridge->recording == nullptr || !bridge->recording()) return nullptr;
  return bridge;
}

std::function<void()> open_profiler_event(const ProfilerBridge& bridge, const std::string& backend,
                                          core::OpType op, const TensorRefs& inputs) {
  std::vector<std::vector<int64_t>> shapes;
  inputs.for_each_shape([&](int ndim, const int64_t* sizes, core::DType dtype) {
    std::vector<int64_t>& shape = shapes.emplace_back(sizes, sizes + ndim);
    if (core::is_complex(dtype)) shape.push_back(2);
  });
  std::string name = backend;
  name += ':';
  name += title(op);
  return bridge.open(name, shapes);
}

}  // namespace c10d::pg
