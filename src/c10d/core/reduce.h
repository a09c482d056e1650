// The element-wise reduction kernels every CPU backend runs in its inner loop.
//
// Contracts shared by all functions here:
//   - Buffers hold `count` elements of `dtype`, need no particular alignment, and must not
//     partially overlap; the same pointer passed twice (exact aliasing) is allowed.
//   - The (dtype, op) pair is checked with check_reduce_op; an invalid pair throws
//     InvalidArgument before any element is touched.
//   - Integer arithmetic wraps modulo 2^bits (no undefined behaviour on overflow).
//   - float16 and bfloat16 are widened to float32, combined, and rounded back to nearest-even.
//   - MIN and MAX propagate NaN, like torch.minimum / numpy.minimum, and order -0 below +0.
//   - bool is treated as truth values: SUM and MAX are logical or, PRODUCT and MIN logical and;
//     any nonzero byte reads as true and results are always 0 or 1.
// The functions keep no state and are safe to call from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "c10d/core/dtype.h"
#include "c10d/core/reduce_op.h"

namespace c10d::core {

// dst[i] = dst[i] (op) src[i] for i < count. AVG and PREMUL_SUM combine like SUM: their extra
// steps (scale before, finalize_avg after) are the caller's, done once per collective rather
// than once per combine.
void reduce(void* dst, const void* src, size_t count, DType dtype, const ReduceOp& op);

// out[i] = a[i] (op) b[i]. `out` may be `a` or `b`, which saves a backend a copy when it
// combines a received buffer with its own input into a third buffer.
void reduce_into(void* out, const void* a, const void* b, size_t count, DType dtype,
                 const ReduceOp& op);

// out[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[n - 1][i], combined left to right (so
// every caller that passes the same sources in the same order gets identical bits), for
// n >= 1. `out` may be srcs[0] (or srcs[1] when n == 2), but no later source. Checks the
// arguments and picks the kernel once.
void reduce_many(void* out, const void* const* srcs, size_t n, size_t count, DType dtype,
                 const ReduceOp& op);

// data[i] *= factor: the pre-step of PREMUL_SUM. Floating types multiply in their compute
// type (float32 for float16/bfloat16/float32, float64 for float64; complex scales both
// halves). Integers: an integral factor multiplies exactly (wrapping); any other factor
// multiplies in float64 and truncates toward zero, saturating at the type's range (NaN -> 0).
// Throws InvalidArgument for bool.
void scale(void* data, size_t count, DType dtype, double factor);

// data[i] /= world_size: the post-step of AVG. Floating types divide in their compute type;
// integers use truncating division, as torch's integer AVG does. Throws InvalidArgument for
// bool or world_size < 1.
void finalize_avg(void* data, size_t count, DType dtype, int world_size);

// Applies op's pre-step to a rank's input before it is combined: scale(premul_factor) for
// PREMUL_SUM, nothing otherwise. Returns whether it changed the data.
bool apply_premul(void* data, size_t count, DType dtype, const ReduceOp& op);

// Applies op's post-step to a fully reduced result: finalize_avg for AVG, nothing otherwise.
// Returns whether it changed the data.
bool apply_postdiv(void* data, size_t count, DType dtype, const ReduceOp& op, int world_size);

// Scalar conversions used by the kernels, exposed for tests and for code that needs to
// inspect half-precision payloads. Rounding is to nearest, ties to even; NaN stays NaN.
float half_to_float(uint16_t bits);
uint16_t float_to_half(float value);
float bfloat16_to_float(uint16_t bits);
uint16_t float_to_bfloat16(float value);

}  // namespace c10d::core

namespace c10d::core::detail {

// Which instruction set the kernels use. Chosen once from the CPU (AVX2 + F16C when present);
// tests switch it to run the portable kernels too. Switching is atomic but meant for tests only.
enum class KernelIsa : uint8_t { kPortable, kAvx2 };
KernelIsa kernel_isa();
bool cpu_supports_avx2();
void set_kernel_isa(KernelIsa isa);  // kAvx2 on a CPU without it falls back to kPortable

}  // namespace c10d::core::detail
