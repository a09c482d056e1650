#include "c10d/ddp/reducer.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>

#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"

namespace c10d::ddp {
namespace {

using core::DistError;
using core::DType;
using core::FutureValue;

char* element(const Tensor& t, size_t offset) {
  return t.data_as<char>() + offset * t.element_size();
}

// Elements [offset, offset + param.numel()) of a flat buffer, shaped like `param`.
Tensor view_like(const Tensor& buffer, size_t offset, const Tensor& param) {
  return buffer.flat_slice(static_cast<int64_t>(offset), param.numel()).reshape(param.sizes());
}

std::shared_ptr<Future> allreduce_async(pg::ProcessGroup& group, Tensor buffer) {
  std::vector<Tensor> tensors{std::move(buffer)};
  return group.allreduce(tensors)->get_future();
}

}  // namespace

GradBucket::GradBucket(size_t index, size_t bucket_count, Tensor buffer,
                       std::vector<size_t> offsets, std::vector<Tensor> parameters)
    : index_(index), count_(bucket_count), buffer_(std::move(buffer)), offsets_(std::move(offsets)),
      parameters_(std::move(parameters)) {}

void GradBucket::set_buffer(Tensor buffer) {
  C10D_CHECK_ARG(buffer.dtype() == buffer_.dtype() && buffer.numel() == buffer_.numel() &&
                     buffer.is_contiguous(),
                 "GradBucket.set_buffer: bucket ", index_, " holds ", buffer_.str(), "; got ",
                 buffer.str(), buffer.is_contiguous() ? "" : " (not contiguous)");
  buffer_ = std::move(buffer);
}

std::vector<Tensor> GradBucket::gradients() const {
  std::vector<Tensor> out;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    out.push_back(view_like(buffer_, offsets_[i], parameters_[i]));
  }
  return out;
}

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::vector<size_t>> bucket_indices,
                 std::vector<size_t> per_bucket_size_limits,
                 std::shared_ptr<pg::ProcessGroup> group, ReducerOptions options)
    : params_(std::move(params)), bucket_params_(std::move(bucket_indices)),
      size_limits_(std::move(per_bucket_size_limits)), group_(std::move(group)),
      options_(std::move(options)) {
  C10D_CHECK_ARG(group_ != nullptr, "Reducer: no process group");
  const size_t n = params_.size();
  if (size_limits_.empty()) {
    size_limits_.assign(bucket_params_.size(), static_cast<size_t>(options_.bucket_bytes_cap));
  }
  C10D_CHECK_ARG(size_limits_.size() == bucket_params_.size(), "Reducer: ", size_limits_.size(),
                 " bucket size limits for ", bucket_params_.size(), " buckets");
  C10D_CHECK_ARG(options_.param_is_gradient.empty() || options_.param_is_gradient.size() == n,
                 "Reducer: param_is_gradient has ", options_.param_is_gradient.size(),
                 " entries for ", n, " parameters");
  C10D_CHECK_ARG(
      options_.expect_sparse_gradients.empty() || options_.expect_sparse_gradients.size() == n,
      "Reducer: expect_sparse_gradients has ", options_.expect_sparse_gradients.size(),
      " entries for ", n, " parameters");
  for (size_t i = 0; i < n; ++i) {
    C10D_CHECK_ARG(options_.expect_sparse_gradients.empty() || !options_.expect_sparse_gradients[i],
                   "Reducer: parameter ", i,
                   " expects a sparse gradient; only dense gradients "
                   "are supported");
    C10D_CHECK_ARG(params_[i].is_contiguous(), "Reducer: parameter ", i, " (", params_[i].str(),
                   ") is not contiguous");
  }
  init_buckets();
  ready_.assign(n, false);
  used_.assign(n, false);
  used_anywhere_.assign(n, true);
  ready_ns_.assign(n, -1);
}

void Reducer::init_buckets() {
  const size_t n = params_.size();
  buckets_.clear();
  where_.assign(n, {SIZE_MAX, 0});
  for (size_t b = 0; b < bucket_params_.size(); ++b) {
    const std::vector<size_t>& members = bucket_params_[b];
    C10D_CHECK_ARG(!members.empty(), "Reducer: bucket ", b, " is empty");
    Bucket bucket;
    size_t elements = 0;
    for (size_t k = 0; k < members.size(); ++k) {
      const size_t i = members[k];
      C10D_CHECK_ARG(i < n, "Reducer: bucket ", b, " names parameter ", i, " of ", n);
      C10D_CHECK_ARG(where_[i].first == SIZE_MAX, "Reducer: parameter ", i, " is in bucket ",
                     where_[i].first, " and in bucket ", b);
      C10D_CHECK_ARG(params_[i].dtype() == params_[members[0]].dtype(), "Reducer: bucket ", b,
                     " mixes ", core::dtype_name(params_[members[0]].dtype()), " (parameter ",
                     members[0], ") and ", core::dtype_name(params_[i].dtype()), " (parameter ", i,
                     ")");
      where_[i] = {b, k};
      bucket.offsets.push_back(elements);
      elements += static_cast<size_t>(params_[i].numel());
    }
    bucket.params = members;
    // Where the group's collectives reduce it fastest: in the shm backend's shared heap, an
    // allreduce of the bucket reads and writes the peers' buckets directly.
    bucket.buffer = group_->empty_for_collectives({static_cast<int64_t>(elements)},
                                                  params_[members[0]].dtype());
    buckets_.push_back(std::move(bucket));
  }
  for (size_t i = 0; i < n; ++i) {
    C10D_CHECK_ARG(where_[i].first != SIZE_MAX, "Reducer: parameter ", i, " is in no bucket");
  }
}

Tensor Reducer::bucket_view(size_t index) const {
  C10D_CHECK_ARG(index < params_.size(), "Reducer: parameter index ", index, " of ",
                 params_.size());
  const auto [b, k] = where_[index];
  return view_like(buckets_[b].buffer, buckets_[b].offsets[k], params_[index]);
}

bool Reducer::is_gradient(size_t index) const {
  return options_.param_is_gradient.empty() || options_.param_is_gradient[index];
}

std::string Reducer::unready_parameters() const {
  std::ostringstream out;
  size_t listed = 0;
  for (size_t i = 0; i < ready_.size(); ++i) {
    if (ready_[i]) continue;
    if (listed++ == 16) {
      out << ", ...";
      break;
    }
    out << (listed > 1 ? ", " : "") << i;
  }
  return out.str();
}

void Reducer::check_finalized() const {
  C10D_CHECK(!in_backward_ || !any_marked_,
             "Reducer: the previous backward pass was not finished: parameters ",
             unready_parameters(),
             " were never marked ready. If they did not take part in computing the loss, "
             "construct the reducer with find_unused_parameters=True; otherwise call "
             "finalize_backward() (or reset_state()) before the next pass");
}

void Reducer::prepare_for_backward() {
  check_finalized();
  for (Bucket& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.future.reset();
    bucket.view.reset();
  }
  const size_t n = params_.size();
  grads_ = params_;
  has_grad_.assign(n, false);
  for (size_t i = 0; i < n; ++i) has_grad_[i] = is_gradient(i);
  ready_.assign(n, false);
  used_.assign(n, false);
  ready_ns_.assign(n, -1);
  next_bucket_ = 0;
  any_marked_ = false;
  ready_order_.clear();
  pass_start_ = std::chrono::steady_clock::now();
  in_backward_ = true;
}

void Reducer::copy_into_bucket(size_t index, const Tensor& grad) {
  const auto [b, k] = where_[index];
  char* dst = element(buckets_[b].buffer, buckets_[b].offsets[k]);
  if (dst != grad.data()) std::memcpy(dst, grad.data(), grad.nbytes());
}

void Reducer::mark_ready(size_t index, std::optional<Tensor> grad) {
  C10D_CHECK_ARG(index < params_.size(), "Reducer: parameter index ", index, " of ",
                 params_.size());
  if (!in_backward_) return;
  C10D_CHECK(!ready_[index], "Reducer: parameter ", index,
             " was marked ready twice in one backward pass (a parameter used in several "
             "reentrant backward passes, or shared between modules, cannot be reduced this way)");
  Tensor g = grad ? std::move(*grad)
                  : (options_.gradient_as_bucket_view ? bucket_view(index) : params_[index]);
  C10D_CHECK_ARG(g.dtype() == params_[index].dtype() && g.numel() == params_[index].numel() &&
                     g.is_contiguous(),
                 "Reducer: the gradient of parameter ", index, " is ", g.str(),
                 g.is_contiguous() ? "" : " (not contiguous)", "; expected a contiguous ",
                 params_[index].str(), " like the parameter");
  ready_ns_[index] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - pass_start_)
                         .count();
  copy_into_bucket(index, g);
  if (should_rebuild()) ready_order_.push_back(index);
  grads_[index] = std::move(g);
  ready_[index] = used_[index] = has_grad_[index] = any_marked_ = true;
  --buckets_[where_[index].first].pending;
  launch_ready_buckets();
  if (next_bucket_ == buckets_.size() && !options_.find_unused_parameters) finalize_backward();
}

GradBucket Reducer::make_grad_bucket(size_t b, Tensor buffer) const {
  std::vector<Tensor> members;
  for (size_t i : buckets_[b].params) members.push_back(params_[i]);
  return GradBucket(b, buckets_.size(), std::move(buffer), buckets_[b].offsets, std::move(members));
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    const size_t b = next_bucket_;
    Bucket& bucket = buckets_[b];
    bucket.view.emplace(make_grad_bucket(b, bucket.buffer));
    try {
      bucket.future = run_comm_hook(*bucket.view);
      C10D_CHECK(bucket.future != nullptr, "Reducer: the comm hook of bucket ", b,
                 " returned no future");
    } catch (...) {
      // The peers wait in this bucket's collective (or run ahead): this pass cannot finish.
      bucket.future.reset();
      abandon_pass();
      throw;
    }
    ++next_bucket_;
  }
}

void Reducer::abandon_pass() noexcept {
  for (Bucket& bucket : buckets_) {
    if (bucket.future == nullptr) continue;
    try {
      bucket.future->wait(group_->options().timeout, "a gradient bucket's reduction");
    } catch (...) {
      // Abandoned: its error is of no use any more.
    }
    bucket.future.reset();
  }
  in_backward_ = false;
}

void Reducer::finish_bucket(size_t b) {
  Bucket& bucket = buckets_[b];
  const std::string what = "the reduction of gradient bucket " + std::to_string(b) + " of " +
                           std::to_string(buckets_.size()) + " (iteration " +
                           std::to_string(iterations_) + ")";
  C10D_CHECK(bucket.future != nullptr, "Reducer: ", what, " was never launched");
  bucket.future->wait(group_->options().timeout, what);
  const FutureValue& value = bucket.future->value_now();
  const Tensor result = value.tensors.empty() ? bucket.view->buffer() : value.tensors[0];
  C10D_CHECK(result.dtype() == bucket.buffer.dtype() && result.numel() == bucket.buffer.numel() &&
                 result.is_contiguous(),
             "Reducer: the comm hook of bucket ", b, " returned ", result.str(),
             "; expected a contiguous ", bucket.buffer.str(), " like the bucket");
  if (result.data() != bucket.buffer.data()) {
    std::memcpy(bucket.buffer.data(), result.data(), bucket.buffer.nbytes());
  }
}

void Reducer::finalize_backward() {
  if (!in_backward_) return;
  try {
    if (next_bucket_ < buckets_.size()) {
      C10D_CHECK(options_.find_unused_parameters, "Reducer: finalize_backward with parameters ",
                 unready_parameters(),
                 " not marked ready. If they did not take part in computing the loss, "
                 "construct the reducer with find_unused_parameters=True");
      // Unused parameters contribute zeros; every rank then launches the remaining buckets
      // in the same order.
      for (size_t i = 0; i < params_.size(); ++i) {
        if (ready_[i]) continue;
        const auto [b, k] = where_[i];
        std::memset(element(buckets_[b].buffer, buckets_[b].offsets[k]), 0, params_[i].nbytes());
        ready_[i] = true;
        --buckets_[b].pending;
      }
      launch_ready_buckets();
    }
    for (size_t b = 0; b < buckets_.size(); ++b) finish_bucket(b);
    // Which parameters some rank used: the others keep their gradients untouched.
    used_anywhere_.assign(params_.size(), true);
    if (options_.find_unused_parameters) {
      Tensor map = Tensor::empty({static_cast<int64_t>(params_.size())}, DType::kInt32);
      for (size_t i = 0; i < params_.size(); ++i) map.data_as<int32_t>()[i] = used_[i];
      allreduce_async(*group_, map)
          ->wait(group_->options().timeout, "the allreduce of the used-parameter map");
      for (size_t i = 0; i < params_.size(); ++i) used_anywhere_[i] = map.data_as<int32_t>()[i];
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!used_anywhere_[i] || !has_grad_[i]) continue;
      const auto [b, k] = where_[i];
      const char* src = element(buckets_[b].buffer, buckets_[b].offsets[k]);
      if (src != grads_[i].data()) std::memcpy(grads_[i].data(), src, params_[i].nbytes());
    }
  } catch (...) {
    abandon_pass();
    throw;
  }
  in_backward_ = false;
  ++iterations_;
  // A pass in which every gradient was marked ready gives the order to rebuild the buckets in.
  if (should_rebuild() && ready_order_.size() == params_.size()) rebuild_order_ = ready_order_;
}

void Reducer::regroup(std::vector<std::vector<size_t>> bucket_params,
                      std::vector<size_t> size_limits) {
  std::vector<Tensor> old_views;  // the buckets' contents (gradients as bucket views)
  for (size_t i = 0; i < params_.size(); ++i) old_views.push_back(bucket_view(i));
  bucket_params_ = std::move(bucket_params);
  size_limits_ = std::move(size_limits);
  init_buckets();
  for (size_t i = 0; i < params_.size(); ++i) copy_into_bucket(i, old_views[i]);
  for (Bucket& bucket : buckets_) bucket.pending = bucket.params.size();  // a pass prepared
}

void Reducer::update_process_group(std::shared_ptr<pg::ProcessGroup> group) {
  C10D_CHECK_ARG(group != nullptr, "Reducer.update_process_group: no process group");
  check_finalized();  // not during a pass
  group_ = std::move(group);
  regroup(bucket_params_, size_limits_);
  has_rebuilt_ = false;
  rebuild_order_.clear();
}

void Reducer::push_all_rebuilt_params() {
  rebuild_order_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) rebuild_order_[i] = i;
}

bool Reducer::rebuild_buckets() {
  check_finalized();  // no pass with gradients marked is open
  if (!should_rebuild() || rebuild_order_.empty()) return false;
  const size_t n = params_.size();
  // Rank 0's grouping for everyone, as [bucket count, bucket sizes..., parameter indices...]
  // (at most n buckets).
  Tensor plan = Tensor::empty({static_cast<int64_t>(2 * n + 1)}, DType::kInt64);
  int64_t* p = plan.data_as<int64_t>();
  std::fill(p, p + 2 * n + 1, 0);
  if (group_->rank() == 0) {
    std::vector<Tensor> ordered;
    std::vector<int64_t> indices;
    for (size_t i : rebuild_order_) {
      ordered.push_back(params_[i]);
      indices.push_back(static_cast<int64_t>(i));
    }
    const std::vector<size_t> limits{static_cast<size_t>(options_.first_bucket_bytes_cap),
                                     static_cast<size_t>(options_.bucket_bytes_cap)};
    const BucketAssignment a = compute_bucket_assignment_by_size(ordered, limits, {}, indices);
    p[0] = static_cast<int64_t>(a.buckets.size());
    size_t at = 1 + a.buckets.size();
    for (size_t b = 0; b < a.buckets.size(); ++b) {
      p[1 + b] = static_cast<int64_t>(a.buckets[b].size());
      for (size_t i : a.buckets[b]) p[at++] = static_cast<int64_t>(i);
    }
  }
  std::vector<Tensor> tensors{plan};
  group_->broadcast(tensors)->get_future()->wait(
      group_->options().timeout, "the broadcast of rank 0's rebuilt gradient buckets");
  const auto count = static_cast<size_t>(p[0]);
  C10D_CHECK(count >= 1 && count <= n, "Reducer: rank 0 sent ", count, " buckets for ", n,
             " parameters");
  std::vector<std::vector<size_t>> buckets(count);
  size_t at = 1 + count;
  for (size_t b = 0; b < count; ++b) {
    for (int64_t k = 0; k < p[1 + b] && at < 2 * n + 1; ++k) {
      buckets[b].push_back(static_cast<size_t>(p[at++]));
    }
  }
  std::vector<size_t> limits(count, static_cast<size_t>(options_.bucket_bytes_cap));
  limits[0] = static_cast<size_t>(options_.first_bucket_bytes_cap);
  regroup(std::move(buckets), std::move(limits));  // checks rank 0's grouping
  has_rebuilt_ = true;
  rebuild_order_.clear();
  ready_order_.clear();
  return true;
}

void Reducer::reset_state() { abandon_pass(); }

void Reducer::register_comm_hook(CommHook hook) {
  C10D_CHECK_ARG(hook != nullptr, "Reducer.register_comm_hook: no hook");
  C10D_CHECK(!custom_hook_,
             "Reducer: a comm hook is already registered; register_comm_hook "
             "and register_builtin_comm_hook can be called only once");
  C10D_CHECK(iterations_ == 0 && !in_backward_,
             "Reducer: register the comm hook before the first backward pass");
  hook_ = std::move(hook);
  custom_hook_ = true;
}

void Reducer::register_builtin_comm_hook(BuiltinCommHookType type) {
  switch (type) {
    case BuiltinCommHookType::kAllreduce:
      return register_comm_hook([this](GradBucket& b) { return run_allreduce_hook(b); });
    case BuiltinCommHookType::kFp16Compress:
      return register_comm_hook([this](GradBucket& b) { return run_fp16_compress_hook(b); });
  }
  throw core::InvalidArgument("Reducer: unknown builtin comm hook type " +
                              std::to_string(static_cast<int>(type)));
}

std::shared_ptr<Future> Reducer::run_comm_hook(GradBucket& bucket) {
  return custom_hook_ ? hook_(bucket) : run_allreduce_hook(bucket);
}

std::shared_ptr<Future> Reducer::run_allreduce_hook(GradBucket& bucket) {
  const Tensor& buffer = bucket.buffer();
  core::finalize_avg(buffer.data(), static_cast<size_t>(buffer.numel()), buffer.dtype(),
                     group_->size());
  return allreduce_async(*group_, buffer);
}

std::shared_ptr<Future> Reducer::run_fp16_compress_hook(GradBucket& bucket) {
  const Tensor buffer = bucket.buffer();
  const DType dtype = buffer.dtype();
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) return run_allreduce_hook(bucket);
  const size_t n = static_cast<size_t>(buffer.numel());
  Tensor half = Tensor::empty({buffer.numel()}, DType::kFloat16);
  const double scale = 1.0 / group_->size();
  uint16_t* h = half.data_as<uint16_t>();
  for (size_t i = 0; i < n; ++i) {
    const double v =
        dtype == DType::kFloat32 ? buffer.data_as<float>()[i] : buffer.data_as<double>()[i];
    h[i] = core::float_to_half(static_cast<float>(v * scale));
  }
  return allreduce_async(*group_, half)->then([buffer, half, dtype, n](Future&) {
    const uint16_t* h = half.data_as<uint16_t>();
    for (size_t i = 0; i < n; ++i) {
      const float v = core::half_to_float(h[i]);
      if (dtype == DType::kFloat32) {
        buffer.data_as<float>()[i] = v;
      } else {
        buffer.data_as<double>()[i] = v;
      }
    }
    return FutureValue{{buffer}, nullptr};
  });
}

std::vector<GradBucket> Reducer::zeros_like_grad_buckets() const {
  std::vector<GradBucket> out;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Tensor zeros = Tensor::empty(buckets_[b].buffer.sizes(), buckets_[b].buffer.dtype());
    std::memset(zeros.data(), 0, zeros.nbytes());
    out.push_back(make_grad_bucket(b, std::move(zeros)));
  }
  return out;
}

}  // namespace c10d::ddp
