// The MPI backend's datatypes and reductions (see datatypes.h), set up once on the progress
// thread and read by every operation.
#include "c10d/backends/mpi/datatypes.h"

#include <algorithm>
#include <iterator>

#include "c10d/backends/mpi/internal.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"

namespace c10d::backends::mpi::detail {

using core::DType;
using core::ReduceOp;
using core::Tensor;
using core::detail::str_cat;

namespace {

// Types that c10d reduces get a datatype of their own (so the user operations below can tell
// them apart).
struct Types {
  MPI_Datatype of[core::kNumDTypes] = {};
  // User operations by ReduceOp kind (SUM ... BXOR), for the types MPI cannot reduce.
  MPI_Op user[ReduceOp::BXOR + 1] = {};
};
Types types;          // written once on the progress thread before any operation is posted
int max_tag = 32767;  // MPI_TAG_UB, read at initialisation (the standard's minimum)

// Reduced by c10d's kernels: types MPI has no arithmetic for, and the 8- and 16-bit integers,
// whose SUM Open MPI's vector kernels saturate (100 + 100 gives 127 in int8) where numpy and
// torch wrap.
constexpr DType kOwnTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kBool,
                               DType::kInt8,    DType::kUInt8,    DType::kInt16};

bool reduced_by_c10d(DType dtype) {
  return std::find(std::begin(kOwnTypes), std::end(kOwnTypes), dtype) != std::end(kOwnTypes);
}

DType own_dtype(MPI_Datatype datatype) {
  for (DType d : kOwnTypes) {
    if (types.of[static_cast<int>(d)] == datatype) return d;
  }
  return DType::kUInt8;  // not reached: user operations are used with these types only
}

template <ReduceOp::Kind kKind>
void user_reduce(void* in, void* inout, int* length, MPI_Datatype* datatype) {
  core::reduce(inout, in, static_cast<size_t>(*length), own_dtype(*datatype), ReduceOp(kKind));
}

}  // namespace

void set_up_types_and_limits() {
  auto own = [](DType d, int bytes) {
    MPI_Datatype t;
    check(MPI_Type_contiguous(bytes, MPI_BYTE, &t), "MPI_Type_contiguous");
    check(MPI_Type_commit(&t), "MPI_Type_commit");
    types.of[static_cast<int>(d)] = t;
  };
  int* upper = nullptr;
  int found = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found) == MPI_SUCCESS && found &&
      upper != nullptr) {
    max_tag = *upper;
  }
  types.of[static_cast<int>(DType::kFloat32)] = MPI_FLOAT;
  types.of[static_cast<int>(DType::kFloat64)] = MPI_DOUBLE;
  types.of[static_cast<int>(DType::kInt32)] = MPI_INT32_T;
  types.of[static_cast<int>(DType::kInt64)] = MPI_INT64_T;
  types.of[static_cast<int>(DType::kComplex64)] = MPI_C_FLOAT_COMPLEX;
  types.of[static_cast<int>(DType::kComplex128)] = MPI_C_DOUBLE_COMPLEX;
  for (DType d : kOwnTypes) own(d, static_cast<int>(core::element_size(d)));
  auto user = [](ReduceOp::Kind kind, MPI_User_function* fn) {
    check(MPI_Op_create(fn, 1, &types.user[kind]), "MPI_Op_create");
  };
  user(ReduceOp::SUM, user_reduce<ReduceOp::SUM>);
  user(ReduceOp::PRODUCT, user_reduce<ReduceOp::PRODUCT>);
  user(ReduceOp::MIN, user_reduce<ReduceOp::MIN>);
  user(ReduceOp::MAX, user_reduce<ReduceOp::MAX>);
  user(ReduceOp::BAND, user_reduce<ReduceOp::BAND>);
  user(ReduceOp::BOR, user_reduce<ReduceOp::BOR>);
  user(ReduceOp::BXOR, user_reduce<ReduceOp::BXOR>);
}

int tag_upper_bound() { return max_tag; }

MPI_Datatype datatype(DType dtype) { return types.of[static_cast<int>(dtype)]; }

MPI_Op mpi_op(DType dtype, const ReduceOp& op) {
  ReduceOp::Kind kind = op.kind;
  if (kind == ReduceOp::AVG || kind == ReduceOp::PREMUL_SUM) kind = ReduceOp::SUM;
  if (reduced_by_c10d(dtype)) return types.user[kind];
  switch (kind) {
    case ReduceOp::SUM:
      return MPI_SUM;
    case ReduceOp::PRODUCT:
      return MPI_PROD;
    case ReduceOp::MIN:
      return MPI_MIN;
    case ReduceOp::MAX:
      return MPI_MAX;
    case ReduceOp::BAND:
      return MPI_BAND;
    case ReduceOp::BOR:
      return MPI_BOR;
    case ReduceOp::BXOR:
      return MPI_BXOR;
    default:
      throw core::InvalidArgument(str_cat("MPI backend: unsupported reduction ", kind));
  }
}

Buffer typed(const Tensor& t, const char* what) {
  return Buffer{data_or_dummy(t), count_of(static_cast<size_t>(t.numel()), what),
                datatype(t.dtype())};
}

Buffer bytes_of(const Tensor& t, const char* what) {
  return Buffer{data_or_dummy(t), count_of(t.nbytes(), what), MPI_BYTE};
}

}  // namespace c10d::backends::mpi::detail
