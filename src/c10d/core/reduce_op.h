// ReduceOp: which operation a reducing collective (all_reduce, reduce, reduce_scatter) applies
// when it combines the contributions of the ranks. A plain value type; safe to copy and share
// between threads.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string_view>

#include "c10d/core/dtype.h"

namespace c10d::core {

struct ReduceOp {
  // Numbered as torch.distributed.ReduceOp.RedOpType, so the integer value of an op means the
  // same thing on both sides (pickles, wire messages, debug output).
  enum Kind : uint8_t {
    SUM = 0,
    AVG = 1,
    PRODUCT = 2,
    MIN = 3,
    MAX = 4,
    BAND = 5,
    BOR = 6,
    BXOR = 7,
    PREMUL_SUM = 8,
    UNUSED = 9,
  };
  static constexpr int kNumKinds = 10;

  Kind kind = SUM;
  // Scale applied to every input before summing; meaningful only when kind == PREMUL_SUM.
  double premul_factor = 1.0;
  // Whether premul_sum() set the factor. A bare PREMUL_SUM kind has none, and collectives
  // refuse it (pg::check_reduce) rather than sum unscaled.
  bool has_factor = false;

  ReduceOp() = default;
  // Implicit on purpose, so a Kind can be passed wherever a ReduceOp is expected.
  ReduceOp(Kind k) : kind(k) {}

  // SUM of the inputs each multiplied by `factor` (torch's _make_nccl_premul_sum).
  static ReduceOp premul_sum(double factor) {
    ReduceOp op(PREMUL_SUM);
    op.premul_factor = factor;
    op.has_factor = true;
    return op;
  }

  // Compares the kind only, as torch does: two PREMUL_SUMs with different factors are equal.
  bool operator==(const ReduceOp& other) const { return kind == other.kind; }

  // "SUM", "AVG", ..., "UNUSED".
  std::string_view name() const;
};

std::ostream& operator<<(std::ostream& out, const ReduceOp& op);

// Throws InvalidArgument ("ReduceOp BAND is not supported for float32") unless `op` can reduce
// elements of `dtype`:
//   - SUM, AVG, PREMUL_SUM, PRODUCT, MIN, MAX: every integer and floating dtype;
//   - SUM, AVG, PREMUL_SUM: complex64 and complex128;
//   - BAND, BOR, BXOR: integer dtypes and bool;
//   - bool also takes SUM (logical or), PRODUCT and MIN (and), MAX (or), but not AVG or
//     PREMUL_SUM, which have no meaning for truth values;
//   - UNUSED: nothing.
void check_reduce_op(DType dtype, const ReduceOp& op);

// The same test without throwing.
bool is_valid_reduce_op(DType dtype, const ReduceOp& op);

}  // namespace c10d::core
