#include "c10d/pg/validate.h"

#include <numeric>

#include "c10d/core/exception.h"
#include "c10d/pg/backend.h"

namespace c10d::pg {

using core::detail::str_cat;

void check_rank(std::string_view op, std::string_view what, int64_t rank, int size) {
  C10D_CHECK_ARG(valid_rank(rank, size), op, ": invalid ", what, " ", rank,
                 " (the group has ranks 0..", size - 1, ")");
}

void check_tensor(std::string_view op, const Tensor& tensor) { core::check_dense_cpu(tensor, op); }

void check_tensor_list(std::string_view op, const std::vector<Tensor>& tensors, bool same_shape) {
  C10D_CHECK_ARG(!tensors.empty(), op, ": requires non-empty tensor list");
  for (const auto& t : tensors) check_tensor(op, t);
  core::check_same_dtype(tensors, op);
  if (same_shape) core::check_same_sizes(tensors, op);
}

void check_single_tensor(std::string_view op, const std::vector<Tensor>& tensors) {
  C10D_CHECK_ARG(tensors.size() == 1, op, ": takes a single tensor, got a list of ",
                 tensors.size());
  check_tensor(op, tensors[0]);
}

namespace {

// A bare PREMUL_SUM kind, without the factor _make_nccl_premul_sum gives it.
bool lacks_factor(const core::ReduceOp& reduce_op) {
  return reduce_op.kind == core::ReduceOp::PREMUL_SUM && !reduce_op.has_factor;
}

}  // namespace

bool usable_reduce(core::DType dtype, const core::ReduceOp& reduce_op) {
  return !lacks_factor(reduce_op) && core::is_valid_reduce_op(dtype, reduce_op);
}

void check_reduce(std::string_view op, core::DType dtype, const core::ReduceOp& reduce_op) {
  C10D_CHECK_ARG(!lacks_factor(reduce_op), op,
                 ": ReduceOp.PREMUL_SUM needs its factor: pass _make_nccl_premul_sum(factor)");
  try {
    core::check_reduce_op(dtype, reduce_op);
  } catch (const core::InvalidArgument& e) {
    // With torch's phrases where torch has one (its users match on them).
    const std::string name(reduce_op.name());
    std::string torch_words;
    if (core::is_complex(dtype)) {  // torch checks this first, for every reduction
      const std::string_view api = op.starts_with("allreduce") ? "all_reduce" : op;
      torch_words = str_cat(api, " does not support ", name, " on complex tensors; ");
    } else if (reduce_op.kind == core::ReduceOp::BAND || reduce_op.kind == core::ReduceOp::BOR ||
               reduce_op.kind == core::ReduceOp::BXOR) {
      torch_words = str_cat("Cannot use ReduceOp.", name, " with non-integral dtype; ");
    }
    throw core::InvalidArgument(str_cat(op, ": ", torch_words, e.what()));
  }
}

void check_list_length(std::string_view op, std::string_view what, size_t actual, size_t expected) {
  if (expected == 1) {
    C10D_CHECK_ARG(actual == 1, op, ": requires a single-element ", what, ", got ", actual,
                   " entries");
  }
  C10D_CHECK_ARG(actual == expected, op, ": invalid ", what, ": it must hold ", expected,
                 " entries, got ", actual);
}

void check_same_dtype(std::string_view op, const Tensor& output, const Tensor& input) {
  C10D_CHECK_ARG(output.dtype() == input.dtype(), op, ": ", core::kDifferentDtypes, ": output is ",
                 core::dtype_name(output.dtype()), " but input is ",
                 core::dtype_name(input.dtype()), "; they must match");
}

void check_numel_ratio(std::string_view op, const Tensor& big, const Tensor& small,
                       int64_t factor) {
  C10D_CHECK_ARG(valid_numel_ratio(big.numel(), small.numel(), factor), op,
                 ": invalid tensor size: ", big.str(), " must hold exactly ", factor,
                 " x the elements of ", small.str());
}

void check_splits(std::string_view op, std::string_view what, const Tensor& tensor,
                  const std::vector<int64_t>& splits, int size) {
  const int64_t dim0 = tensor.dim() == 0 ? 1 : tensor.sizes()[0];
  if (splits.empty()) {
    C10D_CHECK_ARG(valid_even_split(dim0, size), op, ": ", what, " dimension 0 (", dim0,
                   ") does not divide evenly among ", size, " ranks; pass split sizes");
    return;
  }
  C10D_CHECK_ARG(splits.size() == static_cast<size_t>(size), op,
                 ": Number of tensor splits not equal to group size: ", what, " hold ",
                 splits.size(), " entries for ", size, " ranks");
  int64_t total = 0;
  for (int64_t s : splits) {
    C10D_CHECK_ARG(s >= 0, op, ": ", what, " has a negative split size ", s);
    total += s;
  }
  C10D_CHECK_ARG(total == dim0, op, ": Split sizes doesn't match total dim 0 size: ", what,
                 " sum to ", total, " but the tensor's dimension 0 is ", dim0);
}

namespace {

bool same_dtype_and_numel(const DenseView& a, const DenseView& b) {
  return a.dtype == b.dtype && a.numel == b.numel;
}

bool share_bytes(const DenseView& a, const DenseView& b) {
  return a.nbytes() != 0 && b.nbytes() != 0 && a.bytes() < b.bytes() + b.nbytes() &&
         b.bytes() < a.bytes() + a.nbytes();
}

// Whether an input shares memory with an output: the general path stages such calls.
bool aliased(const InlineOp& op) {
  switch (op.type) {
    case core::OpType::kAllgatherBase:
    case core::OpType::kReduceScatterBase:
    case core::OpType::kAlltoallBase:
      return share_bytes(op.output, op.input);
    case core::OpType::kGather:
    case core::OpType::kScatter:
    case core::OpType::kAllgather:
    case core::OpType::kReduceScatter: {
      const bool list_written =
          op.type == core::OpType::kGather || op.type == core::OpType::kAllgather;
      const DenseView& other = list_written ? op.input : op.output;
      for (size_t i = 0; i < op.list_size; ++i) {
        if (share_bytes(op.list[i], other)) return true;
        // Outputs that overlap each other: which write lands is the general path's to order.
        for (size_t j = 0; list_written && j < i; ++j) {
          if (share_bytes(op.list[i], op.list[j])) return true;
        }
      }
      return false;
    }
    default:
      return false;  // in place, or no tensors
  }
}

int64_t dim0(const DenseView& v) { return v.ndim == 0 ? 1 : v.sizes[0]; }

}  // namespace

bool inline_well_formed(const InlineOp& op, int rank, int size) {
  using core::OpType;
  const bool root_ok = valid_rank(op.root, size);
  const auto n = static_cast<size_t>(size);
  if (aliased(op)) return false;
  switch (op.type) {
    case OpType::kAllreduce:
      return usable_reduce(op.input.dtype, op.reduce_op);
    case OpType::kBroadcast:
      return root_ok;
    case OpType::kReduce:
      return root_ok && usable_reduce(op.input.dtype, op.reduce_op);
    case OpType::kAllgatherBase:
      return op.output.dtype == op.input.dtype &&
             valid_numel_ratio(static_cast<int64_t>(op.output.numel),
                               static_cast<int64_t>(op.input.numel), size);
    case OpType::kReduceScatterBase:
      return op.output.dtype == op.input.dtype &&
             valid_numel_ratio(static_cast<int64_t>(op.input.numel),
                               static_cast<int64_t>(op.output.numel), size) &&
             usable_reduce(op.input.dtype, op.reduce_op);
    case OpType::kAlltoallBase:
      // Equal splits of dimension 0 on both sides.
      return same_dtype_and_numel(op.output, op.input) && valid_even_split(dim0(op.input), size) &&
             valid_even_split(dim0(op.output), size);
    case OpType::kGather:
    case OpType::kScatter: {
      if (!root_ok) return false;
      // A non-root's list is the general path's to judge.
      if (rank != op.root) return op.list_size == 0;
      const DenseView& mine = op.type == OpType::kGather ? op.input : op.output;
      if (op.list_size != n) return false;
      for (size_t i = 0; i < n; ++i) {
        if (!same_dtype_and_numel(op.list[i], mine)) return false;
      }
      return true;
    }
    case OpType::kAllgather:
    case OpType::kReduceScatter: {
      const bool gather = op.type == OpType::kAllgather;
      const DenseView& mine = gather ? op.input : op.output;
      if (op.list_size != n) return false;
      for (size_t i = 0; i < n; ++i) {
        if (!same_dtype_and_numel(op.list[i], mine)) return false;
      }
      return gather || usable_reduce(mine.dtype, op.reduce_op);
    }
    case OpType::kBarrier:
      return true;
    case OpType::kSend:
    case OpType::kRecv:
      return root_ok && op.root != rank;
    default:
      return false;
  }
}

}  // namespace c10d::pg
