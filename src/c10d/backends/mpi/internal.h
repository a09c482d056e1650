// What every file of the MPI backend uses: checking MPI's return codes, its int counts, and the
// one-tensor argument rule. Private to the backend.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include "c10d/core/tensor.h"

namespace c10d::backends::mpi::detail {

std::string mpi_error_text(int code);

// The error paths of check() and count_of(), out of line: every MPI call site inlines only
// the comparison.
[[noreturn]] void throw_mpi_error(int code, const char* call);
[[noreturn]] void throw_count_too_large(size_t n, const char* what);

// Throws DistBackendError naming the MPI call when it failed (our communicators return errors
// instead of aborting: MPI_ERRORS_RETURN).
inline void check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw_mpi_error(code, call);
}

// MPI counts are ints.
inline int count_of(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX)) throw_count_too_large(n, what);
  return static_cast<int>(n);
}

const core::Tensor& single(const std::vector<core::Tensor>& tensors, const char* op);

}  // namespace c10d::backends::mpi::detail
