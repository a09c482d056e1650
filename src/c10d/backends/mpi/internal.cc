// The out-of-line helpers of internal.h: MPI's error text and the argument errors every file of
// the MPI backend raises.
#include "c10d/backends/mpi/internal.h"

#include "c10d/core/exception.h"

namespace c10d::backends::mpi::detail {

using core::DistBackendError;
using core::Tensor;
using core::detail::str_cat;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return str_cat("error ", code);
  return std::string(text, static_cast<size_t>(length));
}

void throw_mpi_error(int code, const char* call) {
  throw DistBackendError(str_cat(call, " failed: ", mpi_error_text(code)));
}

void throw_count_too_large(size_t n, const char* what) {
  throw core::InvalidArgument(str_cat("MPI backend: ", what, " of ", n,
                                      " elements exceeds "
                                      "MPI's limit of ",
                                      INT_MAX, " per call"));
}

const Tensor& single(const std::vector<Tensor>& tensors, const char* op) {
  if (tensors.size() != 1) {
    throw core::InvalidArgument(str_cat("MPI backend: ", op,
                                        " takes exactly one tensor per "
                                        "rank, got ",
                                        tensors.size()));
  }
  return tensors.front();
}

}  // namespace c10d::backends::mpi::detail
