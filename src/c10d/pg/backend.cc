#include "c10d/pg/backend.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "c10d/core/exception.h"

namespace c10d::pg {
namespace {

// Copies the bytes of `tensors`, back to back, into `dst`.
void pack(const std::vector<Tensor>& tensors, const Tensor& dst) {
  char* cursor = dst.data_as<char>();
  for (const auto& t : tensors) {
    if (t.nbytes() > 0) std::memcpy(cursor, t.data(), t.nbytes());
    cursor += t.nbytes();
  }
}

// The inverse of pack: fills `tensors` from consecutive bytes at `src`.
void unpack(const char* src, const std::vector<Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.nbytes() > 0) std::memcpy(t.data(), src, t.nbytes());
    src += t.nbytes();
  }
}

}  // namespace

void Backend::throw_not_supported(const char* op) const {
  throw core::NotSupported("Backend " + name() + " does not support " + op);
}

WorkPtr Backend::broadcast(std::vector<Tensor>&, const BroadcastOptions&) {
  throw_not_supported("broadcast");
}
WorkPtr Backend::allreduce(std::vector<Tensor>&, const AllreduceOptions&) {
  throw_not_supported("allreduce");
}
WorkPtr Backend::run_inline(const InlineOp&) { throw_not_supported("inline operations"); }

WorkPtr Backend::allreduce_coalesced(std::vector<Tensor>& tensors,
                                     const AllreduceCoalescedOptions& opts) {
  // One allreduce of every tensor packed together (they share a dtype), then unpacked.
  int64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  std::vector<Tensor> packed = {Tensor::empty({total}, tensors.front().dtype())};
  pack(tensors, packed.front());
  WorkPtr work = allreduce(packed, opts);
  auto unpacked = work->get_future()->then([tensors, packed](core::Future&) {
    unpack(packed.front().data_as<char>(), tensors);
    return core::FutureValue{tensors, nullptr};
  });
  return Work::from_future(std::move(unpacked), core::OpType::kAllreduceCoalesced);
}
WorkPtr Backend::reduce(std::vector<Tensor>&, const ReduceOptions&) {
  throw_not_supported("reduce");
}
WorkPtr Backend::allgather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                           const AllgatherOptions& opts) {
  // allgather_coalesced with the output lists indexed [rank][input] instead of [input][rank].
  std::vector<std::vector<Tensor>> by_rank(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    for (const auto& list : outputs) by_rank[r].push_back(list[r]);
  }
  WorkPtr work = allgather_coalesced(by_rank, inputs, opts);
  // Reported as the allgather it is (Work.op_type, completion hooks), as torch's is.
  return Work::from_future(work->get_future(), core::OpType::kAllgather, work->description());
}
WorkPtr Backend::allgather_base(Tensor&, Tensor&, const AllgatherOptions&) {
  throw_not_supported("_allgather_base");
}
WorkPtr Backend::allgather_coalesced(std::vector<std::vector<Tensor>>& outputs,
                                     std::vector<Tensor>& inputs, const AllgatherOptions& opts) {
  // One allgather_base of every input packed one after another, then each rank's part
  // unpacked. Inputs of one dtype travel as that dtype, so that a backend comparing the ranks'
  // calls sees it; mixed ones as bytes.
  size_t total = 0;
  bool one_dtype = true;
  for (const auto& t : inputs) {
    total += t.nbytes();
    one_dtype = one_dtype && t.dtype() == inputs.front().dtype();
  }
  const core::DType dtype = one_dtype ? inputs.front().dtype() : core::DType::kUInt8;
  const auto elements = static_cast<int64_t>(total / core::element_size(dtype));
  // One input is sent as it is (which keeps a backend's zero-copy path for it); several are
  // packed first.
  Tensor packed = inputs.size() == 1 ? Tensor(inputs[0].data(), dtype, {elements}, {},
                                              inputs[0].owner(), inputs[0].device())
                                     : Tensor::empty({elements}, dtype);
  if (inputs.size() != 1) pack(inputs, packed);
  Tensor gathered = Tensor::empty({elements * size_}, dtype);
  WorkPtr work = allgather_base(gathered, packed, opts);
  auto unpacked = work->get_future()->then([outputs, gathered, total](core::Future&) {
    core::FutureValue value;
    for (size_t r = 0; r < outputs.size(); ++r) {
      unpack(gathered.data_as<char>() + r * total, outputs[r]);
      value.tensors.insert(value.tensors.end(), outputs[r].begin(), outputs[r].end());
    }
    return value;
  });
  return Work::from_future(std::move(unpacked), core::OpType::kAllgatherCoalesced);
}

WorkPtr Backend::allgather_into_tensor_coalesced(std::vector<Tensor>&, std::vector<Tensor>&,
                                                 const AllgatherOptions&) {
  throw_not_supported("allgather_into_tensor_coalesced");
}
WorkPtr Backend::gather(std::vector<std::vector<Tensor>>&, std::vector<Tensor>&,
                        const GatherOptions&) {
  throw_not_supported("gather");
}
WorkPtr Backend::scatter(std::vector<Tensor>&, std::vector<std::vector<Tensor>>&,
                         const ScatterOptions&) {
  throw_not_supported("scatter");
}
WorkPtr Backend::reduce_scatter(std::vector<Tensor>&, std::vector<std::vector<Tensor>>&,
                                const ReduceScatterOptions&) {
  throw_not_supported("reduce_scatter");
}
WorkPtr Backend::reduce_scatter_base(Tensor&, Tensor&, const ReduceScatterOptions&) {
  throw_not_supported("_reduce_scatter_base");
}
WorkPtr Backend::reduce_scatter_tensor_coalesced(std::vector<Tensor>&, std::vector<Tensor>&,
                                                 const ReduceScatterOptions&) {
  throw_not_supported("reduce_scatter_tensor_coalesced");
}
WorkPtr Backend::alltoall_base(Tensor&, Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
                               const AllToAllOptions&) {
  throw_not_supported("alltoall_base");
}
WorkPtr Backend::alltoall(std::vector<Tensor>&, std::vector<Tensor>&, const AllToAllOptions&) {
  throw_not_supported("alltoall");
}
WorkPtr Backend::send(std::vector<Tensor>&, int, int) { throw_not_supported("send"); }
WorkPtr Backend::recv(std::vector<Tensor>&, int, int) { throw_not_supported("recv"); }
WorkPtr Backend::recv_anysource(std::vector<Tensor>&, int) {
  throw_not_supported("recv_anysource");
}
WorkPtr Backend::barrier(const BarrierOptions&) { throw_not_supported("barrier"); }

uint64_t Backend::group_sequence_number() const {
  std::function<std::optional<uint64_t>()> source;
  {
    std::lock_guard<std::mutex> lock(group_mutex_);
    source = group_sequence_;
  }
  return source ? source().value_or(0) : 0;
}

void Backend::set_group_sequence(std::function<std::optional<uint64_t>()> source) {
  std::function<std::optional<uint64_t>()> current;
  {
    std::lock_guard<std::mutex> lock(group_mutex_);
    current = group_sequence_;
  }
  // Asked outside the lock, as any callback.
  if (current && current().has_value()) return;
  std::lock_guard<std::mutex> lock(group_mutex_);
  group_sequence_ = std::move(source);
}

namespace {
struct AdoptedMemoryRegistry {
  std::mutex mutex;
  std::vector<AdoptedMemoryHandlers> handlers;
};
// Never destroyed: owners release memory from callbacks that may run while the process exits.
AdoptedMemoryRegistry& adopted_memory_registry() {
  static auto* registry = new AdoptedMemoryRegistry;
  return *registry;
}

template <typename Pick>
void each_adopted_memory_handler(Pick pick, const void* data, size_t bytes) {
  AdoptedMemoryRegistry& r = adopted_memory_registry();
  std::vector<AdoptedMemoryHandlers> handlers;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    handlers = r.handlers;
  }
  for (const AdoptedMemoryHandlers& h : handlers) {
    if (auto fn = pick(h)) fn(data, bytes);
  }
}
}  // namespace

void register_adopted_memory_handlers(AdoptedMemoryHandlers handlers) {
  AdoptedMemoryRegistry& r = adopted_memory_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const AdoptedMemoryHandlers& h : r.handlers) {
    if (h.release == handlers.release && h.forget == handlers.forget) return;
  }
  r.handlers.push_back(handlers);
}

void release_adopted_memory(const void* data, size_t bytes) {
  each_adopted_memory_handler([](const AdoptedMemoryHandlers& h) { return h.release; }, data,
                              bytes);
}

void forget_adopted_memory(const void* data, size_t bytes) {
  each_adopted_memory_handler([](const AdoptedMemoryHandlers& h) { return h.forget; }, data, bytes);
}

std::string monitored_barrier_failure_on(int rank) {
  return core::detail::str_cat("Rank ", rank,
                               " successfully reached monitoredBarrier, but "
                               "received errors while waiting for send/recv from rank 0. Please "
                               "check rank 0 logs for faulty rank.");
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string monitored_barrier_unreleased(int rank, Millis timeout) {
  return core::detail::str_cat(monitored_barrier_failure_on(rank),
                               " (rank 0 did not release it within ", timeout.count(), " ms)");
}

std::string monitored_barrier_others_failed(int rank, Millis timeout) {
  return core::detail::str_cat(monitored_barrier_failure_on(rank),
                               " (other ranks failed to pass it in ", timeout.count(),
                               " ms; rank 0 names them)");
}

Millis monitored_barrier_release_wait(Millis group, Millis monitored) {
  return std::max(group, Millis(1)) + std::max(monitored, Millis(1));
}

std::string monitored_barrier_missing(const std::vector<int>& ranks, Millis timeout) {
  return core::detail::str_cat(ranks.size() == 1 ? "Rank " : "Ranks ", join_ranks(ranks),
                               " failed to pass monitoredBarrier in ", timeout.count(), " ms");
}

void Backend::monitored_barrier(const BarrierOptions&, bool) {
  throw_not_supported("monitored_barrier");
}

}  // namespace c10d::pg
