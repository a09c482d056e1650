// Argument checks shared by every backend: the ProcessGroup runs them once before dispatch,
// so backends can assume well-formed input. Each throws core::InvalidArgument with a message
// naming the operation and the offending argument. The rules themselves are the predicates at
// the end, which the inline fast path asks too: a call that breaks one goes to the general
// path, whose check then throws.
#pragma once

#include <string_view>
#include <vector>

#include "c10d/core/reduce_op.h"
#include "c10d/core/tensor.h"

namespace c10d::pg {

using core::Tensor;
struct InlineOp;

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

// The rules, without the throw.
inline bool valid_rank(int64_t rank, int size) { return rank >= 0 && rank < size; }
inline bool valid_numel_ratio(int64_t big, int64_t small, int64_t factor) {
  return big == small * factor;
}
// Equal splits: dimension 0 (1 for a 0-d tensor) divides among `size` ranks.
inline bool valid_even_split(int64_t dim0, int size) { return dim0 % size == 0; }
// Whether the inline fast path's `op`, on `rank` of `size` ranks, is a call the general path
// would accept and run as it is (not staged: no input shares memory with an output).
bool inline_well_formed(const InlineOp& op, int rank, int size);

}  // namespace c10d::pg
