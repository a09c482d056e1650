// Binding and releasing the MPI_T control variables behind NbcAlgorithms (see
// nbc_algorithms.h); the per-call choices are inline in the header.
#include "c10d/backends/mpi/nbc_algorithms.h"

#include <initializer_list>

namespace c10d::backends::mpi::detail {

NbcAlgorithms nbc_algorithms;

void NbcAlgorithms::set_up() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return;
  started_ = true;
  allreduce_ = bind("coll_libnbc_iallreduce_algorithm");
  reduce_ = bind("coll_libnbc_ireduce_algorithm");
}

void NbcAlgorithms::tear_down() {
  for (Variable* v : {&allreduce_, &reduce_}) {
    if (v->handle != MPI_T_CVAR_HANDLE_NULL) MPI_T_cvar_handle_free(&v->handle);
  }
  if (started_) MPI_T_finalize();
  started_ = false;
}

NbcAlgorithms::Variable NbcAlgorithms::bind(const char* name) {
  Variable v;
  int index = 0, verbosity = 0, binding = 0, scope = 0, count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_T_enum values;
  if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS ||
      MPI_T_cvar_get_info(index, nullptr, nullptr, &verbosity, &type, &values, nullptr, nullptr,
                          &binding, &scope) != MPI_SUCCESS ||
      type != MPI_INT || binding != MPI_T_BIND_NO_OBJECT ||
      MPI_T_cvar_handle_alloc(index, nullptr, &v.handle, &count) != MPI_SUCCESS) {
    v.handle = MPI_T_CVAR_HANDLE_NULL;
    return v;
  }
  if (count != 1 || MPI_T_cvar_read(v.handle, &v.value) != MPI_SUCCESS || v.value != 0) {
    MPI_T_cvar_handle_free(&v.handle);  // the user's choice stands
    v.handle = MPI_T_CVAR_HANDLE_NULL;
  }
  return v;
}

}  // namespace c10d::backends::mpi::detail
