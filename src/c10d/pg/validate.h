// Argument checks shared by every backend: the ProcessGroup runs them once before dispatch,
// so backends can assume well-formed input. Each throws core::InvalidArgument with a message
// naming the operation and the offending argument.
#pragma once

#include <string_view>
#include <vector>

#include "c10d/core/reduce_op.h"
#include "c10d/core/tensor.h"

namespace c10d::pg {

using core::Tensor;

// A rank argument (root, peer) must lie in [0, size).
void check_rank(std::string_view op, std::string_view what, int64_t rank, int size);
// One dense CPU tensor.
void check_tensor(std::string_view op, const Tensor& tensor);
// A non-empty list of dense CPU tensors sharing dtype and shape.
void check_tensor_list(std::string_view op, const std::vector<Tensor>& tensors,
                       bool same_shape = true);
// A list of exactly one dense CPU tensor (sends and receives).
void check_single_tensor(std::string_view op, const std::vector<Tensor>& tensors);
// Whether a collective accepts `reduce_op` on `dtype` (check_reduce's verdict, without the throw).
bool usable_reduce(core::DType dtype, const core::ReduceOp& reduce_op);
// The op is valid for the dtype (and complex tensors are allowed for it), and a PREMUL_SUM
// has its factor.
void check_reduce(std::string_view op, core::DType dtype, const core::ReduceOp& reduce_op);
inline void check_reduce(std::string_view op, const Tensor& tensor,
                         const core::ReduceOp& reduce_op) {
  check_reduce(op, tensor.dtype(), reduce_op);
}
// A list (named `what`, e.g. "output tensor list (one tensor per rank)") must hold exactly
// `expected` entries.
void check_list_length(std::string_view op, std::string_view what, size_t actual, size_t expected);
// output and input share a dtype.
void check_same_dtype(std::string_view op, const Tensor& output, const Tensor& input);
// output.numel() == input.numel() * factor (allgather_base: factor = size; reduce_scatter_base:
// input = output * size).
void check_numel_ratio(std::string_view op, const Tensor& big, const Tensor& small, int64_t factor);
// Split sizes for alltoall_base: empty (even split of dim 0, which must divide by size) or
// `size` non-negative entries summing to dim 0.
void check_splits(std::string_view op, std::string_view what, const Tensor& tensor,
                  const std::vector<int64_t>& splits, int size);

}  // namespace c10d::pg
