// Reducer: averages gradients across the ranks of a process group during the backward pass,
// as data-parallel training needs. Gradients are grouped into buckets (see
// bucket_assignment.h); the caller says when each gradient is final (mark_ready, what an
// autograd hook does in PyTorch), a bucket is reduced asynchronously as soon as all of its
// gradients are, in bucket order on every rank, and finalize_backward() waits for the
// reductions and writes the averages back into the gradients.
//
// Without autograd, a "parameter" here is the tensor its gradient is written to, unless
// mark_ready names another one. Not thread-safe: one thread drives a backward pass (comm
// hooks and reductions may complete on others).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "c10d/core/tensor.h"
#include "c10d/core/work.h"
#include "c10d/ddp/bucket_assignment.h"
#include "c10d/pg/process_group.h"

namespace c10d::ddp {

using core::Future;
using core::Tensor;

// One bucket as a comm hook sees it: a flat buffer holding its gradients one after another.
class GradBucket {
 public:
  GradBucket(size_t index, size_t bucket_count, Tensor buffer, std::vector<size_t> offsets,
             std::vector<Tensor> parameters);

  size_t index() const { return index_; }
  // Whether this is the last bucket reduced in a backward pass.
  bool is_last() const { return index_ + 1 == count_; }
  const Tensor& buffer() const { return buffer_; }
  // Replaces the buffer (same dtype and element count; InvalidArgument otherwise).
  void set_buffer(Tensor buffer);
  // The buffer's piece holding each parameter's gradient, shaped like the parameter.
  std::vector<Tensor> gradients() const;
  const std::vector<Tensor>& parameters() const { return parameters_; }

 private:
  size_t index_;
  size_t count_;
  Tensor buffer_;
  std::vector<size_t> offsets_;  // element offset of each parameter in the buffer
  std::vector<Tensor> parameters_;
};

// A comm hook reduces a bucket: it returns a future whose first tensor is the reduced buffer
// (or no tensor: then the bucket's buffer holds the result).
using CommHook = std::function<std::shared_ptr<Future>(GradBucket&)>;

enum class BuiltinCommHookType : uint8_t {
  kAllreduce = 1,     // divide by the world size, then allreduce (the default)
  kFp16Compress = 2,  // the same in float16, for float32 buckets
};

struct ReducerOptions {
  std::vector<bool> expect_sparse_gradients;  // accepted for API parity; no sparse gradients
  int64_t bucket_bytes_cap = static_cast<int64_t>(kDefaultBucketBytes);
  // Parameters not marked ready by finalize_backward count as unused: their piece of the
  // bucket is zero, and a parameter no rank used keeps its gradient untouched. Without it,
  // finalize_backward with unready parameters throws.
  bool find_unused_parameters = false;
  // The gradients live in the buckets (bucket_view): mark_ready without `grad` reads the
  // parameter's gradient from its view, which receives the average, instead of from the
  // parameter tensor.
  bool gradient_as_bucket_view = false;
  // Per parameter (empty: all): whether it is its own gradient buffer (numpy arrays). One
  // that is not (a torch parameter, whose gradient is its .grad) and that this rank did not
  // mark ready in a pass has no gradient here to receive the average: global_used_map() says
  // whether some rank used it, and bucket_view() holds the average.
  std::vector<bool> param_is_gradient;
  // The first bucket's limit when rebuild_buckets regroups them (torch: 1 MiB).
  int64_t first_bucket_bytes_cap = static_cast<int64_t>(kDefaultFirstBucketBytes);
};

class Reducer {
 public:
  // bucket_indices: the parameter indices of each bucket, every index exactly once; a
  // bucket's parameters share a dtype. InvalidArgument otherwise.
  Reducer(std::vector<Tensor> params, std::vector<std::vector<size_t>> bucket_indices,
          std::vector<size_t> per_bucket_size_limits, std::shared_ptr<pg::ProcessGroup> group,
          ReducerOptions options = {});

  // Starts a backward pass. A pass in progress in which no gradient was marked ready (a
  // forward pass without backward) is dropped; one with gradients marked throws DistError.
  void prepare_for_backward();
  // The gradient of params[index] is final for this pass. `grad`, when given, is where it is
  // (it also receives the average); by default the parameter itself. Ignored outside a pass
  // (gradients then stay local, as under DDP's no_sync). The call that completes the last
  // bucket waits for every reduction, as finalize_backward does, unless
  // find_unused_parameters (then call finalize_backward).
  void mark_ready(size_t index, std::optional<Tensor> grad = std::nullopt);
  // Reduces what is still pending, waits for every bucket and writes the averages into the
  // gradients. Does nothing outside a pass. After an error the pass is over (its reductions
  // in flight waited for).
  void finalize_backward();
  // Whether a backward pass is in progress.
  bool in_backward() const { return in_backward_; }
  // Throws DistError naming the unready parameters if a pass with gradients marked is open.
  void check_finalized() const;
  // Abandons a pass in progress, after waiting for its reductions in flight.
  void reset_state();

  // A hook replaces the default allreduce. Only one hook, registered before the first pass
  // (DistError otherwise).
  void register_comm_hook(CommHook hook);
  void register_builtin_comm_hook(BuiltinCommHookType type);
  // Runs the registered hook (the default if none) or the default on `bucket`.
  std::shared_ptr<Future> run_comm_hook(GradBucket& bucket);
  std::shared_ptr<Future> run_allreduce_hook(GradBucket& bucket);
  std::shared_ptr<Future> run_fp16_compress_hook(GradBucket& bucket);

  // The piece of its bucket's buffer that holds parameter `index`'s gradient, shaped like it.
  Tensor bucket_view(size_t index) const;
  // Buckets like this reducer's, with zeroed buffers of their own.
  std::vector<GradBucket> zeros_like_grad_buckets() const;
  const std::vector<std::vector<size_t>>& bucket_indices() const { return bucket_params_; }
  const std::vector<size_t>& per_bucket_size_limits() const { return size_limits_; }
  // Nanoseconds from prepare_for_backward to each parameter's mark_ready in the last pass
  // (-1 for parameters not marked).
  std::vector<int64_t> backward_stats() const { return ready_ns_; }
  // Per parameter: whether this rank used it in the last finalized pass (marked it ready).
  std::vector<bool> local_used_map() const { return used_; }
  // Per parameter: whether any rank used it in the last finalized pass (all true unless
  // find_unused_parameters).
  std::vector<bool> global_used_map() const { return used_anywhere_; }
  // Regroups the buckets in the order in which the gradients were marked ready in the last
  // finished pass (or push_all_rebuilt_params' order), as torch's DDP does before its second
  // iteration so that the buckets fill, and are reduced, in the order the backward pass
  // produces them. The buckets close at first_bucket_bytes_cap, then bucket_bytes_cap; rank
  // 0's grouping is broadcast so every rank uses the same. Only once per reducer, not during a
  // pass, and not with find_unused_parameters outside a static graph (unused parameters leave
  // no complete order); returns whether it rebuilt. Bucket views change: the current ones keep
  // their values but are no longer the buckets.
  bool rebuild_buckets();
  // Takes every parameter, in index order, as the order for rebuild_buckets.
  void push_all_rebuilt_params();
  bool has_rebuilt_buckets() const { return has_rebuilt_; }
  // Reduces over `group` from now on (torch: after replacing a failed group). Not during a
  // pass. The buckets move to memory of the new group's backend (contents kept), and may be
  // rebuilt again after the next full pass, as torch's reducer allows.
  void update_process_group(std::shared_ptr<pg::ProcessGroup> group);
  void set_static_graph() { static_graph_ = true; }
  bool static_graph() const { return static_graph_; }
  const std::shared_ptr<pg::ProcessGroup>& process_group() const { return group_; }
  int64_t num_iterations() const { return iterations_; }

 private:
  struct Bucket {
    Tensor buffer;                   // flat, the bucket's parameters one after another
    std::vector<size_t> params;      // parameter indices
    std::vector<size_t> offsets;     // element offset of each in `buffer`
    size_t pending = 0;              // parameters not yet marked ready in this pass
    std::shared_ptr<Future> future;  // the launched reduction
    std::optional<GradBucket> view;  // what the hook saw (its buffer may be replaced)
  };

  // Builds buckets_ and where_ from bucket_params_ (checked).
  void init_buckets();
  // New buckets (from the group's memory) holding what the current ones hold.
  void regroup(std::vector<std::vector<size_t>> bucket_params, std::vector<size_t> size_limits);
  bool should_rebuild() const {
    return !has_rebuilt_ && (static_graph_ || !options_.find_unused_parameters);
  }
  GradBucket make_grad_bucket(size_t b, Tensor buffer) const;
  bool is_gradient(size_t index) const;
  // Waits for the launched reductions (ignoring their errors) and ends the pass.
  void abandon_pass() noexcept;
  void copy_into_bucket(size_t index, const Tensor& grad);
  void launch_ready_buckets();
  void finish_bucket(size_t b);
  std::string unready_parameters() const;

  std::vector<Tensor> params_;
  std::vector<Tensor> grads_;   // where each gradient is read from and written to
  std::vector<bool> has_grad_;  // whether grads_[i] is known in this pass
  std::vector<std::vector<size_t>> bucket_params_;
  std::vector<size_t> size_limits_;
  std::shared_ptr<pg::ProcessGroup> group_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // per parameter: bucket, position in it
  CommHook hook_;
  bool custom_hook_ = false;

  bool in_backward_ = false;
  bool any_marked_ = false;  // a gradient was marked ready in this pass
  size_t next_bucket_ = 0;   // the first bucket not launched yet in this pass
  std::vector<bool> ready_;
  std::vector<bool> used_;
  std::vector<bool> used_anywhere_;
  std::vector<int64_t> ready_ns_;
  std::chrono::steady_clock::time_point pass_start_;
  bool static_graph_ = false;
  int64_t iterations_ = 0;
  std::vector<size_t> ready_order_;    // parameters in the order marked ready in this pass
  std::vector<size_t> rebuild_order_;  // the order rebuild_buckets uses (empty: none yet)
  bool has_rebuilt_ = false;
};

}  // namespace c10d::ddp
