// WrapperBackend: a debugging backend (used at debug level DETAIL) that checks, before every
// collective, that every rank arrived (a monitored barrier, which names the missing ones) and
// that all ranks are calling the same collective with the same sequence number, dtypes and
// shapes, and only then runs it on the wrapped backend. The check travels over a
// separate backend (a side Gloo group), so a mismatch is reported on every rank instead of
// hanging or corrupting data. Point-to-point operations are not collective and pass straight
// through. Thread-safe to the same degree as the wrapped backend; collectives must be issued
// in the same order on every rank (as always).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "c10d/pg/backend.h"

namespace c10d::pg {

class WrapperBackend : public Backend {
 public:
  WrapperBackend(std::shared_ptr<Backend> wrapped, std::shared_ptr<Backend> checker);

  std::string name() const override { return wrapped_->name(); }
  const std::shared_ptr<Backend>& wrapped() const { return wrapped_; }

  WorkPtr broadcast(std::vector<Tensor>& tensors, const BroadcastOptions& opts) override;
  WorkPtr allreduce(std::vector<Tensor>& tensors, const AllreduceOptions& opts) override;
  WorkPtr allreduce_coalesced(std::vector<Tensor>& tensors,
                              const AllreduceCoalescedOptions& opts) override;
  WorkPtr reduce(std::vector<Tensor>& tensors, const ReduceOptions& opts) override;
  WorkPtr allgather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                    const AllgatherOptions& opts) override;
  WorkPtr allgather_base(Tensor& output, Tensor& input, const AllgatherOptions& opts) override;
  WorkPtr allgather_coalesced(std::vector<std::vector<Tensor>>& outputs,
                              std::vector<Tensor>& inputs, const AllgatherOptions& opts) override;
  WorkPtr allgather_into_tensor_coalesced(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                                          const AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                 const GatherOptions& opts) override;
  WorkPtr scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                  const ScatterOptions& opts) override;
  WorkPtr reduce_scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                         const ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_base(Tensor& output, Tensor& input,
                              const ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                                          const ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(Tensor& output, Tensor& input, std::vector<int64_t>& output_split_sizes,
                        std::vector<int64_t>& input_split_sizes,
                        const AllToAllOptions& opts) override;
  WorkPtr alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                   const AllToAllOptions& opts) override;
  WorkPtr send(std::vector<Tensor>& tensors, int dst_rank, int tag) override;
  WorkPtr recv(std::vector<Tensor>& tensors, int src_rank, int tag) override;
  WorkPtr recv_anysource(std::vector<Tensor>& tensors, int tag) override;
  WorkPtr barrier(const BarrierOptions& opts) override;
  void monitored_barrier(const BarrierOptions& opts, bool wait_all_ranks) override;
  void finish_pending(Millis timeout) override;
  void shutdown() override;
  void set_timeout(Millis timeout) override {
    Backend::set_timeout(timeout);
    wrapped_->set_timeout(timeout);
    checker_->set_timeout(timeout);  // its checks run with the group's timeout too
  }

  // "all_reduce(float32[4], op=SUM)": how a call is named in mismatch reports.
  static std::string describe_call(std::string_view op, const std::vector<Tensor>& tensors,
                                   std::string_view extra = {});

 private:
  // Exchanges this rank's description of the call with every rank and throws
  // DistBackendError on every rank if any differs.
  void check(const std::string& call);

  std::shared_ptr<Backend> wrapped_;
  std::shared_ptr<Backend> checker_;
  std::atomic<uint64_t> seq_{0};
};

}  // namespace c10d::pg
