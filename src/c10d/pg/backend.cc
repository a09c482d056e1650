#include "c10d/pg/backend.h"

#include <cstring>

#include "c10d/core/exception.h"

namespace c10d::pg {

void Backend::throw_not_supported(const char* op) const {
  throw core::NotSupported("Backend " + name() + " does not support " + op);
}

WorkPtr Backend::broadcast(std::vector<Tensor>&, const BroadcastOptions&) {
  throw_not_supported("broadcast");
}
WorkPtr Backend::allreduce(std::vector<Tensor>&, const AllreduceOptions&) {
  throw_not_supported("allreduce");
}
WorkPtr Backend::allreduce_coalesced(std::vector<Tensor>&, const AllreduceCoalescedOptions&) {
  throw_not_supported("allreduce_coalesced");
}
WorkPtr Backend::reduce(std::vector<Tensor>&, const ReduceOptions&) {
  throw_not_supported("reduce");
}
WorkPtr Backend::allgather(std::vector<std::vector<Tensor>>&, std::vector<Tensor>&,
                           const AllgatherOptions&) {
  throw_not_supported("allgather");
}
WorkPtr Backend::allgather_base(Tensor&, Tensor&, const AllgatherOptions&) {
  throw_not_supported("_allgather_base");
}
WorkPtr Backend::allgather_coalesced(std::vector<std::vector<Tensor>>& outputs,
                                     std::vector<Tensor>& inputs, const AllgatherOptions& opts) {
  // Pack every input's bytes into one buffer, gather it once, and unpack each rank's part.
  size_t total = 0;
  for (const auto& t : inputs) total += t.nbytes();
  Tensor packed = Tensor::empty({static_cast<int64_t>(total)}, core::DType::kUInt8);
  size_t offset = 0;
  for (const auto& t : inputs) {
    if (t.nbytes() > 0) std::memcpy(packed.data_as<char>() + offset, t.data(), t.nbytes());
    offset += t.nbytes();
  }
  Tensor gathered =
      Tensor::empty({static_cast<int64_t>(total) * size_}, core::DType::kUInt8);
  WorkPtr packed_work = allgather_base(gathered, packed, opts);
  auto unpacked = packed_work->get_future()->then(
      [outputs, gathered, total](core::Future&) {
        core::FutureValue value;
        for (size_t r = 0; r < outputs.size(); ++r) {
          const char* src = gathered.data_as<char>() + r * total;
          for (const auto& out : outputs[r]) {
            if (out.nbytes() > 0) std::memcpy(out.data(), src, out.nbytes());
            src += out.nbytes();
            value.tensors.push_back(out);
          }
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
void Backend::monitored_barrier(const BarrierOptions&, bool) {
  throw_not_supported("monitored_barrier");
}

}  // namespace c10d::pg
