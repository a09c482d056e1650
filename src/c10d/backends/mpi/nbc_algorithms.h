// Which algorithm Open MPI's libnbc runs for each non-blocking allreduce and reduce, chosen per
// call through MPI_T control variables: libnbc's own choices are slow for large messages.
#pragma once

#include <mpi.h>

#include <cstddef>

namespace c10d::backends::mpi::detail {

// Open MPI's libnbc runs an in-place MPI_Iallreduce on fewer than 4 ranks as a binomial
// reduce and broadcast, whatever its size, and MPI_Ireduce as a chain; both are several times
// slower than the blocking calls for large messages (see
// docs/design/mpi.md#non-blocking-collective-algorithms). libnbc reads its algorithm from
// control variables at every call, and MPI_T may change them between calls, so each call sets
// the one that suits it, unless the user chose one (a variable that is not 0, "ignore", when
// MPI starts: OMPI_MCA_..., mpirun --mca, a parameter file). Nothing happens where the
// variables do not exist (another MPI). The choice is global, so the application's own
// non-blocking calls run with the last one set.
class NbcAlgorithms {
 public:
  // Once MPI is initialised (on the thread that makes the MPI calls).
  void set_up();
  void tear_down();

  // Before an MPI_Iallreduce of `bytes` on `ranks` ranks. The fastest where timed: recursive
  // doubling for small messages, Rabenseifner at 2 ranks and ring at more for large ones.
  void allreduce(size_t bytes, int ranks) {
    if (bytes < kLargeBytes) return allreduce_.set(kRecursiveDoubling);
    allreduce_.set(ranks == 2 ? kRabenseifner : kRing);
  }

  // Before an MPI_Ireduce. Binomial beat libnbc's own choice at every size timed.
  void reduce() { reduce_.set(kBinomialReduce); }

 private:
  // libnbc's numbers for its algorithms.
  static constexpr int kRing = 1;
  static constexpr int kRabenseifner = 3;
  static constexpr int kRecursiveDoubling = 4;
  static constexpr int kBinomialReduce = 2;
  // From this size on an allreduce splits the message among the ranks.
  static constexpr size_t kLargeBytes = size_t{64} << 10;

  struct Variable {
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    int value = 0;

    void set(int wanted) {
      if (handle == MPI_T_CVAR_HANDLE_NULL || wanted == value) return;
      if (MPI_T_cvar_write(handle, &wanted) == MPI_SUCCESS) value = wanted;
    }
  };

  // A handle on the integer variable `name` if it exists and is still libnbc's default.
  static Variable bind(const char* name);

  bool started_ = false;
  Variable allreduce_;
  Variable reduce_;
};

extern NbcAlgorithms nbc_algorithms;  // used on the thread that makes the MPI calls only

}  // namespace c10d::backends::mpi::detail
