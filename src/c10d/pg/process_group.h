// ProcessGroup: a set of ranks that run collectives together. It owns one Backend per device
// type, validates every call once (so no backend has to), numbers the collectives, and runs
// completion hooks. Thread-safe: collectives may be issued from any thread, but every rank
// must issue them in the same order, as with torch.distributed.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "c10d/pg/backend.h"
#include "c10d/pg/flight_recorder.h"
#include "c10d/store/store.h"

namespace c10d::pg {

// What a completion hook learns about a finished operation.
struct WorkInfo {
  core::OpType op_type = core::OpType::kUnknown;
  uint64_t seq = 0;
  core::Clock::time_point time_started;
  core::Clock::time_point time_finished;
  std::chrono::nanoseconds active_duration{0};
};

struct ProcessGroupOptions {
  std::string backend = "undefined";
  Millis timeout = kDefaultPgTimeout;
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  using Options = ProcessGroupOptions;
  using Hook = std::function<void(std::shared_ptr<WorkInfo>)>;

  ProcessGroup(std::shared_ptr<store::Store> store, int rank, int size, Options options = {});
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Options& options() const { return options_; }
  const std::string& backend_name() const { return options_.backend; }
  const std::shared_ptr<store::Store>& store() const { return store_; }
  std::string group_name() const;
  void set_group_name(const std::string& name);
  std::string group_desc() const;
  void set_group_desc(const std::string& desc);
  // The global rank of each group rank, when the creator knows them (for flight-recorder dumps).
  std::optional<std::vector<int>> global_ranks() const;
  void set_global_ranks(std::vector<int> ranks);

  void register_backend(core::DeviceType device, std::shared_ptr<Backend> backend);
  // Throws InvalidArgument naming the device when no backend serves it.
  std::shared_ptr<Backend> get_backend(core::DeviceType device) const;
  std::vector<core::DeviceType> device_types() const;
  // A zeroed tensor from the CPU backend's Backend::empty_for_collectives, or else of plain
  // memory.
  Tensor empty_for_collectives(const std::vector<int64_t>& sizes, core::DType dtype) const;

  // Number of collectives issued so far on this group.
  uint64_t sequence_number() const { return seq_.load(); }
  // Remembers the Work of an asynchronous operation handed to the caller (the bindings do),
  // for wait_for_pending_works; completed and dropped Works are forgotten on the way.
  void track_pending(const WorkPtr& work);
  // Waits for the remembered Works that have not completed (torch's _wait_for_pending_works).
  void wait_for_pending_works();
  void register_on_completion_hook(Hook hook);
  bool has_hooks() const;
  void enable_collectives_timing() { timing_enabled_ = true; }
  bool collectives_timing_enabled() const { return timing_enabled_; }

  WorkPtr broadcast(std::vector<Tensor>& tensors, const BroadcastOptions& opts = {});
  WorkPtr allreduce(std::vector<Tensor>& tensors, const AllreduceOptions& opts = {});
  WorkPtr allreduce_coalesced(std::vector<Tensor>& tensors,
                              const AllreduceCoalescedOptions& opts = {});
  // A synchronous collective on dense CPU buffers through the backend's inline fast path:
  // numbered and traced like the general path, but without Tensor or Work objects. Returns
  // false, having done nothing, unless the call is the plain well-formed case that path runs
  // (no completion hooks, not coalescing, a backend with an inline path for the kind, and
  // arguments the general path would accept); the caller then uses the general method, which
  // validates and reports errors. Errors of the operation itself are thrown. An asynchronous
  // send or receive (InlineOp::hold) leaves its Work in `work`.
  bool run_inline(const InlineOp& op, WorkPtr* work = nullptr);
  WorkPtr reduce(std::vector<Tensor>& tensors, const ReduceOptions& opts = {});
  WorkPtr allgather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                    const AllgatherOptions& opts = {});
  WorkPtr allgather_base(Tensor& output, Tensor& input, const AllgatherOptions& opts = {});
  WorkPtr allgather_coalesced(std::vector<std::vector<Tensor>>& outputs,
                              std::vector<Tensor>& inputs, const AllgatherOptions& opts = {});
  WorkPtr allgather_into_tensor_coalesced(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                                          const AllgatherOptions& opts = {});
  WorkPtr gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                 const GatherOptions& opts = {});
  WorkPtr scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                  const ScatterOptions& opts = {});
  WorkPtr reduce_scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                         const ReduceScatterOptions& opts = {});
  WorkPtr reduce_scatter_base(Tensor& output, Tensor& input, const ReduceScatterOptions& opts = {});
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                                          const ReduceScatterOptions& opts = {});
  WorkPtr alltoall_base(Tensor& output, Tensor& input, std::vector<int64_t>& output_split_sizes,
                        std::vector<int64_t>& input_split_sizes, const AllToAllOptions& opts = {});
  WorkPtr alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                   const AllToAllOptions& opts = {});
  WorkPtr send(std::vector<Tensor>& tensors, int dst_rank, int tag = 0);
  WorkPtr recv(std::vector<Tensor>& tensors, int src_rank, int tag = 0);
  WorkPtr recv_anysource(std::vector<Tensor>& tensors, int tag = 0);
  WorkPtr barrier(const BarrierOptions& opts = {});
  void monitored_barrier(const BarrierOptions& opts = {}, bool wait_all_ranks = false);

  // Between start_coalescing and end_coalescing, operations run as usual; end_coalescing
  // returns one Work that completes when all of them have (with the first error, if any).
  void start_coalescing();
  WorkPtr end_coalescing();

  // Stops every backend; never blocks on peers.
  void shutdown();

 private:
  std::mutex pending_mutex_;
  std::vector<std::weak_ptr<Work>> pending_;  // guarded by pending_mutex_
  // Numbers the operation, records it in the flight recorder, dispatches it to the backend for
  // `device`, and arranges for the completion hooks (and the recorder) to see it finish.
  template <typename Fn>
  WorkPtr dispatch(TraceOp trace, core::DeviceType device, Fn&& fn);
  // Records the end of a traced operation: now if `work` is null or complete, else when it is.
  void finish_trace(TraceHandle traced, const WorkPtr& work);
  core::DeviceType device_of(const std::vector<Tensor>& tensors) const;
  // allgather of one tensor into outputs of different sizes (torch's "uneven" all_gather).
  WorkPtr allgather_uneven(std::vector<Tensor>& outputs, const Tensor& input,
                           const AllgatherOptions& opts);

  const std::shared_ptr<store::Store> store_;
  const int rank_;
  const int size_;
  const Options options_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> timing_enabled_{false};
  // This group in the flight recorder; null when the recorder is off.
  const std::shared_ptr<TraceGroup> trace_;

  mutable std::mutex mutex_;
  std::map<core::DeviceType, std::shared_ptr<Backend>> backends_;  // guarded by mutex_
  // The CPU backend, read without the lock by run_inline. A CPU backend that another one
  // replaces stays alive in replaced_ as long as the group, so the pointer never dangles.
  std::atomic<Backend*> cpu_backend_{nullptr};
  std::vector<std::shared_ptr<Backend>> replaced_;  // guarded by mutex_
  std::vector<Hook> hooks_;                         // guarded by mutex_
  // Mirrors of "hooks_ non-empty" and coalescing_, read without the lock on every operation
  // so the common case (no hooks, not coalescing) takes no lock.
  std::atomic<bool> any_hooks_{false};
  std::atomic<bool> any_coalescing_{false};
  std::string group_name_;                        // guarded by mutex_
  std::string group_desc_;                        // guarded by mutex_
  std::optional<std::vector<int>> global_ranks_;  // guarded by mutex_
  bool coalescing_ = false;                       // guarded by mutex_
  std::vector<WorkPtr> coalesced_;                // guarded by mutex_
};

}  // namespace c10d::pg
