// MpiBackend: the collectives of a process group carried by MPI (Open MPI or any MPI-3
// library), for programs launched with mpirun. Ranks and world size come from MPI, so no store
// is needed; each group gets its own communicator, duplicated from MPI_COMM_WORLD or created
// among the group's members.
//
// Threads. One progress thread per process makes every MPI call (MPI is initialised there with
// MPI_THREAD_SERIALIZED, or used as it is when the application initialised it, e.g. through
// mpi4py). Operations are posted as non-blocking MPI calls in the order they were submitted,
// which every rank must keep (the usual process-group contract). A group's collectives run one
// at a time on the shared operation queue (pg::OpQueue: numbering, the caller's thread when
// idle, order, finish_pending, shutdown), whose body hands each to the progress thread, or runs
// it on the calling thread while the progress thread is idle; sends and receives go to the
// progress thread directly, matched by tag. Because nothing blocks inside MPI, every
// operation has a deadline: an operation that does not complete within its timeout fails with
// DistTimeoutError naming it, its sequence number and this rank. A collective cannot be
// withdrawn from MPI once posted, so its communicator is then broken and later operations on
// the group fail at once, naming the one that timed out. A rank that dies is mpirun's to
// report: it ends the whole job.
//
// Every dtype is supported: MPI's own types and reductions where they are exact, c10d's
// reduction kernels (as MPI user operations) for float16, bfloat16, bool and the 8- and 16-bit
// integers. AVG and PREMUL_SUM reduce as SUM with the scaling done locally.
//
// Every collective first gathers every rank's call (pg::Signature: kind, dtype, count, op,
// root, and the sizes of all_to_all) on the group's control communicator and compares them;
// only then does its data go to MPI, in submission order. Ranks that called different things
// (another dtype, a larger broadcast buffer, threads that issued collectives in another order)
// all fail naming both calls, and the group stays usable.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "c10d/pg/backend.h"
#include "c10d/pg/op_queue.h"

namespace c10d::backends::mpi {

namespace detail {
struct Op;
}

using pg::WorkPtr;

class MpiBackend : public pg::Backend {
 public:
  // A backend for the group of the given world ranks (all of them if empty); null when this
  // process is not one of them. Initialises MPI the first time. Every member must call it,
  // with the same ranks, in the same order relative to its other group creations.
  static std::shared_ptr<MpiBackend> create(std::vector<int> ranks,
                                            pg::Millis timeout = pg::kDefaultPgTimeout);
  // This process's rank in MPI_COMM_WORLD and the world's size (initialising MPI).
  static std::pair<int, int> world();
  // Lets the progress thread finish what was submitted (at most `grace`), then finalises MPI
  // if c10d initialised it. Later operations fail. Called at interpreter exit; idempotent.
  static void finalize(pg::Millis grace);

  ~MpiBackend() override;

  std::string name() const override { return "mpi"; }

  WorkPtr broadcast(std::vector<pg::Tensor>& tensors, const pg::BroadcastOptions& opts) override;
  WorkPtr allreduce(std::vector<pg::Tensor>& tensors, const pg::AllreduceOptions& opts) override;
  WorkPtr reduce(std::vector<pg::Tensor>& tensors, const pg::ReduceOptions& opts) override;
  WorkPtr allgather_base(pg::Tensor& output, pg::Tensor& input,
                         const pg::AllgatherOptions& opts) override;
  WorkPtr allgather_into_tensor_coalesced(std::vector<pg::Tensor>& outputs,
                                          std::vector<pg::Tensor>& inputs,
                                          const pg::AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<std::vector<pg::Tensor>>& outputs, std::vector<pg::Tensor>& inputs,
                 const pg::GatherOptions& opts) override;
  WorkPtr scatter(std::vector<pg::Tensor>& outputs, std::vector<std::vector<pg::Tensor>>& inputs,
                  const pg::ScatterOptions& opts) override;
  WorkPtr reduce_scatter(std::vector<pg::Tensor>& outputs,
                         std::vector<std::vector<pg::Tensor>>& inputs,
                         const pg::ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_base(pg::Tensor& output, pg::Tensor& input,
                              const pg::ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<pg::Tensor>& outputs,
                                          std::vector<pg::Tensor>& inputs,
                                          const pg::ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(pg::Tensor& output, pg::Tensor& input,
                        std::vector<int64_t>& output_split_sizes,
                        std::vector<int64_t>& input_split_sizes,
                        const pg::AllToAllOptions& opts) override;
  WorkPtr alltoall(std::vector<pg::Tensor>& outputs, std::vector<pg::Tensor>& inputs,
                   const pg::AllToAllOptions& opts) override;
  WorkPtr send(std::vector<pg::Tensor>& tensors, int dst_rank, int tag) override;
  WorkPtr recv(std::vector<pg::Tensor>& tensors, int src_rank, int tag) override;
  WorkPtr recv_anysource(std::vector<pg::Tensor>& tensors, int tag) override;
  WorkPtr barrier(const pg::BarrierOptions& opts) override;
  void monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) override;

  void finish_pending(pg::Millis timeout) override;
  void shutdown() override;

  // The group's communicators and state, shared with operations in flight. Defined in
  // progress_thread.h.
  struct Group;

  MpiBackend(std::shared_ptr<Group> group, int rank, int size, pg::Millis timeout);

 private:
  // Runs collective `op` in its turn on the group's queue.
  WorkPtr submit(std::shared_ptr<detail::Op> op, pg::Millis timeout, bool async);
  void run_monitored_barrier(pg::Millis limit, bool wait_all_ranks);

  std::shared_ptr<Group> group_;
  std::shared_ptr<pg::OpQueue> queue_;
  std::mutex shutdown_mutex_;
};

}  // namespace c10d::backends::mpi
