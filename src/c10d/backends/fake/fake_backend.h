// FakeBackend ("fake"): completes every operation at once without communicating. For tests
// of code that issues collectives (argument handling, hooks, tracing) without peers.
// Thread-safe (it has no state).
#pragma once

#include "c10d/pg/backend.h"

namespace c10d::backends::fake {

using pg::AllgatherOptions;
using pg::AllreduceCoalescedOptions;
using pg::AllreduceOptions;
using pg::AllToAllOptions;
using pg::Backend;
using pg::BarrierOptions;
using pg::BroadcastOptions;
using pg::GatherOptions;
using pg::ReduceOptions;
using pg::ReduceScatterOptions;
using pg::ScatterOptions;
using pg::Tensor;
using pg::Work;
using pg::WorkPtr;

class FakeBackend : public Backend {
 public:
  FakeBackend(int rank, int size) : Backend(rank, size) {}
  std::string name() const override { return "fake"; }

  WorkPtr broadcast(std::vector<Tensor>& t, const BroadcastOptions&) override { return done(t); }
  WorkPtr allreduce(std::vector<Tensor>& t, const AllreduceOptions&) override { return done(t); }
  WorkPtr allreduce_coalesced(std::vector<Tensor>& t, const AllreduceCoalescedOptions&) override {
    return done(t);
  }
  WorkPtr reduce(std::vector<Tensor>& t, const ReduceOptions&) override { return done(t); }
  WorkPtr allgather(std::vector<std::vector<Tensor>>&, std::vector<Tensor>& in,
                    const AllgatherOptions&) override {
    return done(in);
  }
  WorkPtr allgather_base(Tensor& out, Tensor&, const AllgatherOptions&) override {
    return done({out});
  }
  WorkPtr allgather_coalesced(std::vector<std::vector<Tensor>>&, std::vector<Tensor>& in,
                              const AllgatherOptions&) override {
    return done(in);
  }
  WorkPtr allgather_into_tensor_coalesced(std::vector<Tensor>& out, std::vector<Tensor>&,
                                          const AllgatherOptions&) override {
    return done(out);
  }
  WorkPtr gather(std::vector<std::vector<Tensor>>&, std::vector<Tensor>& in,
                 const GatherOptions&) override {
    return done(in);
  }
  WorkPtr scatter(std::vector<Tensor>& out, std::vector<std::vector<Tensor>>&,
                  const ScatterOptions&) override {
    return done(out);
  }
  WorkPtr reduce_scatter(std::vector<Tensor>& out, std::vector<std::vector<Tensor>>&,
                         const ReduceScatterOptions&) override {
    return done(out);
  }
  WorkPtr reduce_scatter_base(Tensor& out, Tensor&, const ReduceScatterOptions&) override {
    return done({out});
  }
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<Tensor>& out, std::vector<Tensor>&,
                                          const ReduceScatterOptions&) override {
    return done(out);
  }
  WorkPtr alltoall_base(Tensor& out, Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
                        const AllToAllOptions&) override {
    return done({out});
  }
  WorkPtr alltoall(std::vector<Tensor>& out, std::vector<Tensor>&,
                   const AllToAllOptions&) override {
    return done(out);
  }
  WorkPtr send(std::vector<Tensor>& t, int, int) override { return done(t); }
  WorkPtr recv(std::vector<Tensor>& t, int src, int) override {
    auto work = done(t);
    work->set_source_rank(src);
    return work;
  }
  WorkPtr recv_anysource(std::vector<Tensor>& t, int) override {
    auto work = done(t);
    work->set_source_rank(rank() == 0 ? (size() > 1 ? 1 : 0) : 0);
    return work;
  }
  WorkPtr barrier(const BarrierOptions&) override { return done({}); }
  void monitored_barrier(const BarrierOptions&, bool) override {}

 private:
  static WorkPtr done(std::vector<Tensor> outputs) {
    auto work = std::make_shared<Work>();
    work->finish(std::move(outputs));
    return work;
  }
};

}  // namespace c10d::backends::fake
