// How data-parallel training groups gradients into buckets: each bucket is reduced by one
// collective, launched as soon as all of its gradients are ready, so communication overlaps
// the rest of the backward pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "c10d/core/tensor.h"

namespace c10d::ddp {

// Bytes of the first bucket DistributedDataParallel forms (small, so that its reduction
// starts early), and of the others.
inline constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;
inline constexpr size_t kDefaultBucketBytes = size_t{25} << 20;

struct BucketAssignment {
  std::vector<std::vector<size_t>> buckets;  // tensor indices per bucket
  std::vector<size_t> size_limits;           // the limit each bucket was filled up to
};

// Groups `tensors` into buckets of one dtype and device each. Per (dtype, device), a bucket
// closes once it holds at least the current limit; the first uses size_limits[0], the next
// size_limits[1], ... and the last limit repeats. A tensor expecting a sparse gradient gets a
// bucket of its own (limit 0). Without `tensor_indices` the buckets are ordered by the
// smallest tensor index they hold; with it, tensors[i] counts as tensor tensor_indices[i]
// (the order in which gradients became ready) and buckets keep the order they closed in.
// Throws InvalidArgument for empty inputs or lists of the wrong length.
BucketAssignment compute_bucket_assignment_by_size(
    const std::vector<core::Tensor>& tensors, const std::vector<size_t>& size_limits,
    const std::vector<bool>& expect_sparse_gradient = {},
    const std::vector<int64_t>& tensor_indices = {});

}  // namespace c10d::ddp
