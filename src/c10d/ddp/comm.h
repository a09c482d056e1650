// Collectives data-parallel training runs at start-up: making every rank's model state equal
// to one rank's, and checking that every rank holds the same model.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "c10d/core/tensor.h"
#include "c10d/pg/process_group.h"

namespace c10d::ddp {

// Overwrites `tensors` on every rank with their values on `src`, packing consecutive tensors
// of one dtype into flat buffers of up to `buffer_size` bytes (a tensor larger than that goes
// alone), one broadcast per buffer. Every rank passes tensors of the same dtypes and sizes in
// the same order. Tensors must be contiguous (InvalidArgument otherwise).
void broadcast_coalesced(const std::shared_ptr<pg::ProcessGroup>& group,
                         const std::vector<core::Tensor>& tensors, size_t buffer_size, int src = 0);

// Checks that every rank passes as many parameters as the others, and the same dtype, sizes
// and strides per parameter as rank 0. If any rank differs every rank throws DistError: the
// one that differs names the parameter and both shapes, the others name that rank.
void verify_params_across_processes(const std::shared_ptr<pg::ProcessGroup>& group,
                                    const std::vector<core::Tensor>& params);

}  // namespace c10d::ddp
