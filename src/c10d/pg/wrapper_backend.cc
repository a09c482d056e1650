#include "c10d/pg/wrapper_backend.h"

#include <cstring>
#include <sstream>

#include "c10d/core/exception.h"

namespace c10d::pg {

using core::DType;

WrapperBackend::WrapperBackend(std::shared_ptr<Backend> wrapped, std::shared_ptr<Backend> checker)
    : Backend(wrapped ? wrapped->rank() : 0, wrapped ? wrapped->size() : 1,
              wrapped ? wrapped->timeout() : kDefaultPgTimeout),
      wrapped_(std::move(wrapped)), checker_(std::move(checker)) {
  C10D_CHECK_ARG(wrapped_ != nullptr && checker_ != nullptr,
                 "WrapperBackend needs a backend to wrap and one to check with");
  C10D_CHECK_ARG(wrapped_->size() == checker_->size() && wrapped_->rank() == checker_->rank(),
                 "WrapperBackend: the checking backend must span the same ranks");
}

std::string WrapperBackend::describe_call(std::string_view op, const std::vector<Tensor>& tensors,
                                          std::string_view extra) {
  std::ostringstream out;
  out << op << "(";
  for (size_t i = 0; i < tensors.size(); ++i) out << (i ? ", " : "") << tensors[i].str();
  if (!extra.empty()) out << (tensors.empty() ? "" : ", ") << extra;
  out << ")";
  return out.str();
}

void WrapperBackend::check(const std::string& call) {
  const uint64_t seq = ++seq_;
  const std::string mine = call + " seq " + std::to_string(seq);
  const int n = size();
  // 0) every rank arrived (as torch's wrapper does first): a rank that never calls is named
  // ("Rank 1 failed to pass monitoredBarrier in ...") instead of an exchange timing out.
  checker_->monitored_barrier(BarrierOptions{}, /*wait_all_ranks=*/true);
  // 1) everyone's description length, 2) the descriptions padded to the longest.
  Tensor length = Tensor::empty({1}, DType::kInt64);
  *length.data_as<int64_t>() = static_cast<int64_t>(mine.size());
  Tensor lengths = Tensor::empty({n}, DType::kInt64);
  AllgatherOptions sync;
  sync.async_op = false;
  checker_->allgather_base(lengths, length, sync)->wait();
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lengths.data_as<int64_t>()[r]);
  Tensor text = Tensor::empty({longest}, DType::kUInt8);
  std::memset(text.data(), 0, static_cast<size_t>(longest));
  std::memcpy(text.data(), mine.data(), mine.size());
  Tensor texts = Tensor::empty({longest * n}, DType::kUInt8);
  checker_->allgather_base(texts, text, sync)->wait();
  for (int r = 0; r < n; ++r) {
    const char* p = texts.data_as<char>() + r * longest;
    std::string theirs(p, static_cast<size_t>(lengths.data_as<int64_t>()[r]));
    if (theirs != mine) {
      throw core::DistBackendError(
          "Detected mismatch between collectives on ranks: rank " + std::to_string(rank()) +
          " called " + mine + ", but rank " + std::to_string(r) + " called " + theirs +
          ". Every rank must issue the same collectives, in the same order, on tensors of the "
          "same dtype and shape.");
    }
  }
}

namespace {
std::string op_name(const core::ReduceOp& op) { return "op=" + std::string(op.name()); }
}  // namespace

WorkPtr WrapperBackend::broadcast(std::vector<Tensor>& t, const BroadcastOptions& o) {
  check(describe_call("broadcast", t, "root=" + std::to_string(o.root_rank)));
  return wrapped_->broadcast(t, o);
}
WorkPtr WrapperBackend::allreduce(std::vector<Tensor>& t, const AllreduceOptions& o) {
  check(describe_call("all_reduce", t, op_name(o.reduce_op)));
  return wrapped_->allreduce(t, o);
}
WorkPtr WrapperBackend::allreduce_coalesced(std::vector<Tensor>& t,
                                            const AllreduceCoalescedOptions& o) {
  check(describe_call("all_reduce_coalesced", t, op_name(o.reduce_op)));
  return wrapped_->allreduce_coalesced(t, o);
}
WorkPtr WrapperBackend::reduce(std::vector<Tensor>& t, const ReduceOptions& o) {
  check(describe_call("reduce", t, op_name(o.reduce_op) + ", root=" + std::to_string(o.root_rank)));
  return wrapped_->reduce(t, o);
}
WorkPtr WrapperBackend::allgather(std::vector<std::vector<Tensor>>& out, std::vector<Tensor>& in,
                                  const AllgatherOptions& o) {
  check(describe_call("all_gather", in));
  return wrapped_->allgather(out, in, o);
}
WorkPtr WrapperBackend::allgather_base(Tensor& out, Tensor& in, const AllgatherOptions& o) {
  check(describe_call("all_gather_into_tensor", {in}));
  return wrapped_->allgather_base(out, in, o);
}
WorkPtr WrapperBackend::allgather_coalesced(std::vector<std::vector<Tensor>>& out,
                                            std::vector<Tensor>& in, const AllgatherOptions& o) {
  check(describe_call("all_gather_coalesced", in));
  return wrapped_->allgather_coalesced(out, in, o);
}
WorkPtr WrapperBackend::allgather_into_tensor_coalesced(std::vector<Tensor>& out,
                                                        std::vector<Tensor>& in,
                                                        const AllgatherOptions& o) {
  check(describe_call("all_gather_into_tensor_coalesced", in));
  return wrapped_->allgather_into_tensor_coalesced(out, in, o);
}
WorkPtr WrapperBackend::gather(std::vector<std::vector<Tensor>>& out, std::vector<Tensor>& in,
                               const GatherOptions& o) {
  check(describe_call("gather", in, "root=" + std::to_string(o.root_rank)));
  return wrapped_->gather(out, in, o);
}
WorkPtr WrapperBackend::scatter(std::vector<Tensor>& out, std::vector<std::vector<Tensor>>& in,
                                const ScatterOptions& o) {
  check(describe_call("scatter", out, "root=" + std::to_string(o.root_rank)));
  return wrapped_->scatter(out, in, o);
}
WorkPtr WrapperBackend::reduce_scatter(std::vector<Tensor>& out,
                                       std::vector<std::vector<Tensor>>& in,
                                       const ReduceScatterOptions& o) {
  check(describe_call("reduce_scatter", out, op_name(o.reduce_op)));
  return wrapped_->reduce_scatter(out, in, o);
}
WorkPtr WrapperBackend::reduce_scatter_base(Tensor& out, Tensor& in,
                                            const ReduceScatterOptions& o) {
  check(describe_call("reduce_scatter_tensor", {in}, op_name(o.reduce_op)));
  return wrapped_->reduce_scatter_base(out, in, o);
}
WorkPtr WrapperBackend::reduce_scatter_tensor_coalesced(std::vector<Tensor>& out,
                                                        std::vector<Tensor>& in,
                                                        const ReduceScatterOptions& o) {
  check(describe_call("reduce_scatter_tensor_coalesced", in, op_name(o.reduce_op)));
  return wrapped_->reduce_scatter_tensor_coalesced(out, in, o);
}
WorkPtr WrapperBackend::alltoall_base(Tensor& out, Tensor& in, std::vector<int64_t>& out_splits,
                                      std::vector<int64_t>& in_splits, const AllToAllOptions& o) {
  // Split sizes legitimately differ between ranks; the dtype must not.
  check("all_to_all_single(" + std::string(core::dtype_name(in.dtype())) + ")");
  return wrapped_->alltoall_base(out, in, out_splits, in_splits, o);
}
WorkPtr WrapperBackend::alltoall(std::vector<Tensor>& out, std::vector<Tensor>& in,
                                 const AllToAllOptions& o) {
  check("all_to_all(" + std::to_string(in.size()) + " tensors of " +
        std::string(core::dtype_name(in.front().dtype())) + ")");
  return wrapped_->alltoall(out, in, o);
}
WorkPtr WrapperBackend::send(std::vector<Tensor>& t, int dst, int tag) {
  return wrapped_->send(t, dst, tag);
}
WorkPtr WrapperBackend::recv(std::vector<Tensor>& t, int src, int tag) {
  return wrapped_->recv(t, src, tag);
}
WorkPtr WrapperBackend::recv_anysource(std::vector<Tensor>& t, int tag) {
  return wrapped_->recv_anysource(t, tag);
}
WorkPtr WrapperBackend::barrier(const BarrierOptions& o) {
  check("barrier()");
  return wrapped_->barrier(o);
}
void WrapperBackend::monitored_barrier(const BarrierOptions& o, bool wait_all_ranks) {
  // Checking first would block on the missing rank, hiding what monitored_barrier reports.
  wrapped_->monitored_barrier(o, wait_all_ranks);
}
void WrapperBackend::finish_pending(Millis timeout) { wrapped_->finish_pending(timeout); }

void WrapperBackend::shutdown() {
  wrapped_->shutdown();
  checker_->shutdown();
}

}  // namespace c10d::pg
