// The MPI backend's datatypes and reductions: MPI's own where they are exact, c10d's kernels
// as MPI user operations for float16, bfloat16, bool and the 8- and 16-bit integers; and how
// a tensor is handed to MPI.
#pragma once

#include <mpi.h>

#include "c10d/core/dtype.h"
#include "c10d/core/reduce_op.h"
#include "c10d/core/tensor.h"

namespace c10d::backends::mpi::detail {

// Creates the datatypes and user operations and reads MPI_TAG_UB: once, on the progress
// thread, after MPI_Init and before any operation is posted.
void set_up_types_and_limits();

// MPI_TAG_UB, as read at initialisation (until then the standard's minimum, 32767).
int tag_upper_bound();

MPI_Datatype datatype(core::DType dtype);

// The MPI operation that combines contributions for `op` on `dtype` (AVG and PREMUL_SUM
// combine as SUM; the ProcessGroup has checked that the pair is valid).
MPI_Op mpi_op(core::DType dtype, const core::ReduceOp& op);

// The element count and type an operation moves `tensor` with: its dtype where MPI knows it,
// else bytes (which needs no arithmetic).
struct Buffer {
  void* data;
  int count;
  MPI_Datatype type;
};

Buffer typed(const core::Tensor& t, const char* what);
Buffer bytes_of(const core::Tensor& t, const char* what);

}  // namespace c10d::backends::mpi::detail
