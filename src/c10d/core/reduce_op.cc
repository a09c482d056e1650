#include "c10d/core/reduce_op.h"

#include <array>
#include <ostream>

#include "c10d/core/exception.h"

namespace c10d::core {
namespace {

constexpr std::array<std::string_view, ReduceOp::kNumKinds> kNames = {
    "SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED",
};

}  // namespace

std::string_view ReduceOp::name() const {
  auto index = static_cast<size_t>(kind);
  return index < kNames.size() ? kNames[index] : std::string_view("INVALID");
}

std::ostream& operator<<(std::ostream& out, const ReduceOp& op) {
  out << op.name();
  if (op.kind == ReduceOp::PREMUL_SUM) out << '(' << op.premul_factor << ')';
  return out;
}

bool is_valid_reduce_op(DType dtype, const ReduceOp& op) {
  switch (op.kind) {
    case ReduceOp::SUM:
      return true;
    case ReduceOp::AVG:
      return dtype != DType::kBool;
    case ReduceOp::PREMUL_SUM:
      // As in torch (NCCL), floating types only: a scaled integer would need rounding and
      // clamping, and every order of those gives another answer.
      return is_floating(dtype) || is_complex(dtype);
    case ReduceOp::PRODUCT:
    case ReduceOp::MIN:
    case ReduceOp::MAX:
      return !is_complex(dtype);
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      return is_integral(dtype, /*include_bool=*/true);
    case ReduceOp::UNUSED:
      return false;
  }
  return false;  // a Kind value outside the enum
}

void check_reduce_op(DType dtype, const ReduceOp& op) {
  C10D_CHECK_ARG(static_cast<int>(op.kind) < ReduceOp::kNumKinds, "invalid ReduceOp code ",
                 static_cast<int>(op.kind));
  C10D_CHECK_ARG(is_valid_reduce_op(dtype, op), "ReduceOp ", op.name(), " is not supported for ",
                 dtype_name(dtype));
}

}  // namespace c10d::core
