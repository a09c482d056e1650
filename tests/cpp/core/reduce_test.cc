// Tests of ReduceOp and the reduction kernels. Every valid (dtype, op) pair is checked against a
// plain scalar reference, on both kernel sets (portable and AVX2, when the CPU has it), over
// lengths that hit every vector/tail split and over unaligned pointers. One file because every
// test shares the reference and the dtype tables.
#include "c10d/core/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "c10d/core/exception.h"
#include "c10d/core/reduce_op.h"

namespace c10d::core {
namespace {

using detail::KernelIsa;

constexpr DType kAllDTypes[] = {
    DType::kFloat32, DType::kFloat64, DType::kFloat16,   DType::kBFloat16,
    DType::kInt8,    DType::kInt16,   DType::kInt32,     DType::kInt64,
    DType::kUInt8,   DType::kBool,    DType::kComplex64, DType::kComplex128,
};

constexpr ReduceOp::Kind kAllKinds[] = {
    ReduceOp::SUM,  ReduceOp::AVG, ReduceOp::PRODUCT, ReduceOp::MIN,        ReduceOp::MAX,
    ReduceOp::BAND, ReduceOp::BOR, ReduceOp::BXOR,    ReduceOp::PREMUL_SUM, ReduceOp::UNUSED,
};

constexpr size_t kLengths[] = {0, 1, 7, 8, 15, 16, 17, 33, 1031};

// The validity table, written out independently of check_reduce_op.
bool expected_valid(DType dtype, ReduceOp::Kind kind) {
  const bool integer = dtype == DType::kInt8 || dtype == DType::kInt16 || dtype == DType::kInt32 ||
                       dtype == DType::kInt64 || dtype == DType::kUInt8;
  const bool floating = dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
                        dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  const bool complex = dtype == DType::kComplex64 || dtype == DType::kComplex128;
  const bool boolean = dtype == DType::kBool;
  switch (kind) {
    case ReduceOp::SUM:
      return true;
    case ReduceOp::AVG:
      return integer || floating || complex;
    case ReduceOp::PREMUL_SUM:
      return floating || complex;
    case ReduceOp::PRODUCT:
    case ReduceOp::MIN:
    case ReduceOp::MAX:
      return integer || floating || boolean;
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      return integer || boolean;
    default:
      return false;
  }
}

// Runs `body` once per kernel set this machine can run, restoring the default afterwards.
template <typename Body>
void for_each_isa(Body body) {
  const KernelIsa saved = detail::kernel_isa();
  std::vector<KernelIsa> isas = {KernelIsa::kPortable};
  if (detail::cpu_supports_avx2()) isas.push_back(KernelIsa::kAvx2);
  for (KernelIsa isa : isas) {
    detail::set_kernel_isa(isa);
    SCOPED_TRACE(isa == KernelIsa::kAvx2 ? "isa=avx2" : "isa=portable");
    body();
  }
  detail::set_kernel_isa(saved);
}

// ---------------------------------------------------------------------------------------------
// Reference arithmetic, one element at a time.

// float -> bfloat16 by comparing the two neighbouring candidates in double precision; a
// different method from the library's add-and-shift, so the two check each other.
double bf16_value(uint32_t upper_bits) {
  const uint32_t bits = upper_bits << 16;
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) == 0) {
    return std::copysign(std::ldexp(1.0, 128), std::bit_cast<float>(bits));  // inf as 2^128
  }
  return std::bit_cast<float>(bits);
}

uint16_t ref_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t down = bits >> 16;
  const uint32_t up = down + 1;
  const double below = std::fabs(static_cast<double>(f) - bf16_value(down));
  const double above = std::fabs(bf16_value(up) - static_cast<double>(f));
  if (below < above) return static_cast<uint16_t>(down);
  if (above < below) return static_cast<uint16_t>(up);
  return static_cast<uint16_t>((down & 1) == 0 ? down : up);
}

float ref_from_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// float16 reference through the compiler's own _Float16 conversions.
uint16_t ref_to_half(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
float ref_from_half(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }

template <typename T>
T ref_float_op(ReduceOp::Kind kind, T a, T b) {
  switch (kind) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
    case ReduceOp::PREMUL_SUM:
      return a + b;
    case ReduceOp::PRODUCT:
      return a * b;
    case ReduceOp::MIN:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return std::min(a, b);
    case ReduceOp::MAX:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      return std::max(a, b);
    default:
      ADD_FAILURE() << "no float reference for kind " << int(kind);
      return 0;
  }
}

template <typename T>
T ref_int_op(ReduceOp::Kind kind, T a, T b) {
  // Exact arithmetic in 128 bits, then wrapped to the width of T.
  const __int128 x = a, y = b;
  __int128 r = 0;
  switch (kind) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
    case ReduceOp::PREMUL_SUM:
      r = x + y;
      break;
    case ReduceOp::PRODUCT:
      r = x * y;
      break;
    case ReduceOp::MIN:
      r = std::min(x, y);
      break;
    case ReduceOp::MAX:
      r = std::max(x, y);
      break;
    case ReduceOp::BAND:
      r = x & y;
      break;
    case ReduceOp::BOR:
      r = x | y;
      break;
    case ReduceOp::BXOR:
      r = x ^ y;
      break;
    default:
      ADD_FAILURE() << "no int reference for kind " << int(kind);
  }
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(static_cast<unsigned __int128>(r)));
}

uint8_t ref_bool_op(ReduceOp::Kind kind, uint8_t a, uint8_t b) {
  const bool x = a != 0, y = b != 0;
  switch (kind) {
    case ReduceOp::SUM:
    case ReduceOp::MAX:
    case ReduceOp::BOR:
      return x || y;
    case ReduceOp::PRODUCT:
    case ReduceOp::MIN:
    case ReduceOp::BAND:
      return x && y;
    case ReduceOp::BXOR:
      return x != y;
    default:
      ADD_FAILURE() << "no bool reference for kind " << int(kind);
      return 0;
  }
}

template <typename T>
T load(const unsigned char* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store(unsigned char* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// out = a (op) b, element by element, for any valid pair.
void reference(DType dtype, ReduceOp::Kind kind, const unsigned char* a, const unsigned char* b,
               unsigned char* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat32:
        store(out, i, ref_float_op(kind, load<float>(a, i), load<float>(b, i)));
        break;
      case DType::kFloat64:
        store(out, i, ref_float_op(kind, load<double>(a, i), load<double>(b, i)));
        break;
      case DType::kFloat16:
        store(out, i,
              ref_to_half(ref_float_op(kind, ref_from_half(load<uint16_t>(a, i)),
                                       ref_from_half(load<uint16_t>(b, i)))));
        break;
      case DType::kBFloat16:
        store(out, i,
              ref_to_bf16(ref_float_op(kind, ref_from_bf16(load<uint16_t>(a, i)),
                                       ref_from_bf16(load<uint16_t>(b, i)))));
        break;
      case DType::kInt8:
        store(out, i, ref_int_op(kind, load<int8_t>(a, i), load<int8_t>(b, i)));
        break;
      case DType::kInt16:
        store(out, i, ref_int_op(kind, load<int16_t>(a, i), load<int16_t>(b, i)));
        break;
      case DType::kInt32:
        store(out, i, ref_int_op(kind, load<int32_t>(a, i), load<int32_t>(b, i)));
        break;
      case DType::kInt64:
        store(out, i, ref_int_op(kind, load<int64_t>(a, i), load<int64_t>(b, i)));
        break;
      case DType::kUInt8:
        store(out, i, ref_int_op(kind, load<uint8_t>(a, i), load<uint8_t>(b, i)));
        break;
      case DType::kBool:
        store(out, i, ref_bool_op(kind, load<uint8_t>(a, i), load<uint8_t>(b, i)));
        break;
      case DType::kComplex64: {
        auto x = load<std::complex<float>>(a, i), y = load<std::complex<float>>(b, i);
        store(out, i, std::complex<float>(x.real() + y.real(), x.imag() + y.imag()));
        break;
      }
      case DType::kComplex128: {
        auto x = load<std::complex<double>>(a, i), y = load<std::complex<double>>(b, i);
        store(out, i, std::complex<double>(x.real() + y.real(), x.imag() + y.imag()));
        break;
      }
    }
  }
}

// Element equality: floating values compare by value (so -0 == +0), any NaN equals any NaN;
// everything else compares bit for bit.
bool same_element(DType dtype, const unsigned char* x, const unsigned char* y, size_t i) {
  auto same_float = [](double p, double q) {
    return (std::isnan(p) && std::isnan(q)) || p == q;
  };
  switch (dtype) {
    case DType::kFloat32:
      return same_float(load<float>(x, i), load<float>(y, i));
    case DType::kFloat64:
      return same_float(load<double>(x, i), load<double>(y, i));
    case DType::kFloat16:
      return same_float(ref_from_half(load<uint16_t>(x, i)), ref_from_half(load<uint16_t>(y, i)));
    case DType::kBFloat16:
      return same_float(ref_from_bf16(load<uint16_t>(x, i)), ref_from_bf16(load<uint16_t>(y, i)));
    case DType::kComplex64:
      return same_float(load<float>(x, 2 * i), load<float>(y, 2 * i)) &&
             same_float(load<float>(x, 2 * i + 1), load<float>(y, 2 * i + 1));
    case DType::kComplex128:
      return same_float(load<double>(x, 2 * i), load<double>(y, 2 * i)) &&
             same_float(load<double>(x, 2 * i + 1), load<double>(y, 2 * i + 1));
    default: {
      const size_t e = element_size(dtype);
      return std::memcmp(x + i * e, y + i * e, e) == 0;
    }
  }
}

std::string describe(DType dtype, const unsigned char* p, size_t i) {
  std::ostringstream out;
  switch (dtype) {
    case DType::kFloat32:
      out << load<float>(p, i);
      break;
    case DType::kFloat64:
      out << load<double>(p, i);
      break;
    case DType::kFloat16:
      out << ref_from_half(load<uint16_t>(p, i)) << " (0x" << std::hex << load<uint16_t>(p, i)
          << ")";
      break;
    case DType::kBFloat16:
      out << ref_from_bf16(load<uint16_t>(p, i)) << " (0x" << std::hex << load<uint16_t>(p, i)
          << ")";
      break;
    case DType::kInt8:
      out << int(load<int8_t>(p, i));
      break;
    case DType::kInt16:
      out << load<int16_t>(p, i);
      break;
    case DType::kInt32:
      out << load<int32_t>(p, i);
      break;
    case DType::kInt64:
      out << load<int64_t>(p, i);
      break;
    case DType::kUInt8:
    case DType::kBool:
      out << int(load<uint8_t>(p, i));
      break;
    case DType::kComplex64:
      out << load<std::complex<float>>(p, i);
      break;
    case DType::kComplex128:
      out << load<std::complex<double>>(p, i);
      break;
  }
  return out.str();
}

// Random contents for one buffer of `dtype`, chosen so that every op is exercised: integers
// across their full range (overflow must wrap), floats of mixed signs and magnitudes, halves
// from random finite bit patterns (sums of two often land exactly halfway: rounding ties).
void fill_random(DType dtype, unsigned char* p, size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> real(-100.0, 100.0);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bits = rng();
    switch (dtype) {
      case DType::kFloat32:
        store(p, i, static_cast<float>(real(rng)));
        break;
      case DType::kFloat64:
        store(p, i, real(rng));
        break;
      case DType::kComplex64:
        store(p, i, std::complex<float>(real(rng), real(rng)));
        break;
      case DType::kComplex128:
        store(p, i, std::complex<double>(real(rng), real(rng)));
        break;
      case DType::kFloat16: {
        auto h = static_cast<uint16_t>(bits);
        if ((h & 0x7C00) == 0x7C00) h &= 0xBFFF;  // keep it finite
        store(p, i, h);
        break;
      }
      case DType::kBFloat16: {
        // Exponents near 1.0 so products and sums stay finite; full mantissa and sign.
        const auto h = static_cast<uint16_t>((bits & 0x807F) | ((0x78 + (bits >> 16) % 16) << 7));
        store(p, i, h);
        break;
      }
      case DType::kBool:
        store(p, i, static_cast<uint8_t>(bits & 1));
        break;
      default:
        std::memcpy(p + i * element_size(dtype), &bits, element_size(dtype));
        break;
    }
  }
}

// A buffer with room to place the data at any byte offset.
struct Buffer {
  explicit Buffer(size_t bytes) : storage(bytes + 64, 0xCD) {}
  unsigned char* at(size_t byte_offset) { return storage.data() + 16 + byte_offset; }
  std::vector<unsigned char> storage;
};

void check_pair(DType dtype, ReduceOp::Kind kind, size_t n, size_t off_dst, size_t off_src,
                std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message()
               << "dtype=" << dtype_name(dtype) << " op=" << ReduceOp(kind).name() << " n=" << n
               << " dst_off=" << off_dst << " src_off=" << off_src);
  const size_t e = element_size(dtype);
  Buffer dst(n * e), src(n * e), expected(n * e);
  unsigned char* d = dst.at(off_dst);
  unsigned char* s = src.at(off_src);
  fill_random(dtype, d, n, rng);
  fill_random(dtype, s, n, rng);
  reference(dtype, kind, d, s, expected.at(0), n);
  const std::vector<unsigned char> src_before(s, s + n * e);

  reduce(d, s, n, dtype, ReduceOp(kind));

  for (size_t i = 0; i < n; ++i) {
    if (!same_element(dtype, d, expected.at(0), i)) {
      ADD_FAILURE() << "element " << i << ": got " << describe(dtype, d, i) << ", expected "
                    << describe(dtype, expected.at(0), i);
      return;
    }
  }
  EXPECT_TRUE(n == 0 || std::memcmp(s, src_before.data(), n * e) == 0) << "src was modified";
  // Bytes around the output are untouched.
  EXPECT_EQ(dst.storage[15], 0xCD);
  EXPECT_EQ(*(d + n * e), 0xCD);
}

// ---------------------------------------------------------------------------------------------
// ReduceOp itself.

TEST(ReduceOpTest, NumberingMatchesTorch) {
  EXPECT_EQ(ReduceOp::SUM, 0);
  EXPECT_EQ(ReduceOp::AVG, 1);
  EXPECT_EQ(ReduceOp::PRODUCT, 2);
  EXPECT_EQ(ReduceOp::MIN, 3);
  EXPECT_EQ(ReduceOp::MAX, 4);
  EXPECT_EQ(ReduceOp::BAND, 5);
  EXPECT_EQ(ReduceOp::BOR, 6);
  EXPECT_EQ(ReduceOp::BXOR, 7);
  EXPECT_EQ(ReduceOp::PREMUL_SUM, 8);
  EXPECT_EQ(ReduceOp::UNUSED, 9);
}

TEST(ReduceOpTest, DefaultsNamesAndEquality) {
  ReduceOp op;
  EXPECT_EQ(op.kind, ReduceOp::SUM);
  EXPECT_EQ(op.premul_factor, 1.0);
  EXPECT_EQ(op.name(), "SUM");
  EXPECT_EQ(ReduceOp(ReduceOp::BXOR).name(), "BXOR");
  EXPECT_EQ(ReduceOp(ReduceOp::PREMUL_SUM).name(), "PREMUL_SUM");
  EXPECT_EQ(ReduceOp(ReduceOp::UNUSED).name(), "UNUSED");

  EXPECT_TRUE(ReduceOp(ReduceOp::MAX) == ReduceOp::MAX);
  EXPECT_TRUE(ReduceOp::MAX == ReduceOp(ReduceOp::MAX));
  EXPECT_FALSE(ReduceOp(ReduceOp::MAX) == ReduceOp::MIN);
  EXPECT_TRUE(ReduceOp(ReduceOp::MAX) != ReduceOp::MIN);

  ReduceOp premul = ReduceOp::premul_sum(0.25);
  EXPECT_EQ(premul.kind, ReduceOp::PREMUL_SUM);
  EXPECT_EQ(premul.premul_factor, 0.25);
  // Like torch, equality looks at the kind only.
  EXPECT_TRUE(premul == ReduceOp::premul_sum(4.0));

  std::ostringstream out;
  out << premul << " " << ReduceOp(ReduceOp::AVG);
  EXPECT_EQ(out.str(), "PREMUL_SUM(0.25) AVG");
}

TEST(ReduceOpTest, ValidityTable) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp::Kind kind : kAllKinds) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << ReduceOp(kind).name());
      EXPECT_EQ(is_valid_reduce_op(dtype, kind), expected_valid(dtype, kind));
      if (expected_valid(dtype, kind)) {
        EXPECT_NO_THROW(check_reduce_op(dtype, kind));
      } else {
        EXPECT_THROW(check_reduce_op(dtype, kind), InvalidArgument);
      }
    }
  }
}

TEST(ReduceOpTest, InvalidPairsThrowNamingOpAndDType) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp::Kind kind : kAllKinds) {
      if (expected_valid(dtype, kind)) continue;
      const std::string want = std::string("ReduceOp ") + std::string(ReduceOp(kind).name()) +
                               " is not supported for " + std::string(dtype_name(dtype));
      unsigned char a[16] = {}, b[16] = {};
      try {
        reduce(a, b, 1, dtype, kind);
        ADD_FAILURE() << want << ": reduce did not throw";
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(std::string(e.what()), want);
      }
      // Even with nothing to do the pair is rejected, so misuse is caught on empty tensors.
      EXPECT_THROW(reduce(a, b, 0, dtype, kind), InvalidArgument);
      EXPECT_THROW(reduce_into(a, a, b, 1, dtype, kind), InvalidArgument);
    }
  }
  EXPECT_THROW(check_reduce_op(DType::kFloat32, ReduceOp(static_cast<ReduceOp::Kind>(42))),
               InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// The kernels against the reference.

TEST(ReduceKernelTest, EveryValidPairMatchesReference) {
  for_each_isa([] {
    std::mt19937_64 rng(1234);
    for (DType dtype : kAllDTypes) {
      for (ReduceOp::Kind kind : kAllKinds) {
        if (!expected_valid(dtype, kind)) continue;
        for (size_t n : kLengths) check_pair(dtype, kind, n, 0, 0, rng);
      }
    }
  });
}

TEST(ReduceKernelTest, UnalignedPointers) {
  for_each_isa([] {
    std::mt19937_64 rng(99);
    for (DType dtype : kAllDTypes) {
      const size_t e = element_size(dtype);
      for (ReduceOp::Kind kind : kAllKinds) {
        if (!expected_valid(dtype, kind)) continue;
        for (size_t n : {size_t{7}, size_t{33}, size_t{1031}, size_t{3000}}) {
          // Element-aligned but off any vector boundary, in different ways for dst and src.
          check_pair(dtype, kind, n, e, 3 * e, rng);
          // Not even aligned to the element size (a slice at an odd byte offset).
          check_pair(dtype, kind, n, 1, 3, rng);
        }
      }
    }
  });
}

TEST(ReduceKernelTest, BoolTreatsNonzeroBytesAsTrue) {
  for_each_isa([] {
    const uint8_t a[] = {0, 0, 2, 255, 7, 0, 1, 128, 3};
    const uint8_t b[] = {0, 5, 0, 1, 64, 0, 1, 128, 0};
    for (ReduceOp::Kind kind : {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX,
                                ReduceOp::BAND, ReduceOp::BOR, ReduceOp::BXOR}) {
      uint8_t out[9];
      reduce_into(out, a, b, 9, DType::kBool, kind);
      for (size_t i = 0; i < 9; ++i) {
        EXPECT_EQ(out[i], ref_bool_op(kind, a[i], b[i]))
            << ReduceOp(kind).name() << " element " << i;
      }
    }
  });
}

TEST(ReduceKernelTest, MinMaxPropagateNaN) {
  for_each_isa([] {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> a = {nan, 1.0f, nan, 2.0f, -0.5f, 3.0f, 4.0f, 5.0f, nan, 1.0f};
    const std::vector<float> b = {1.0f, nan, nan, 1.0f, 0.5f, 3.0f, 8.0f, 5.0f, 0.0f, nan};
    std::vector<float> mn(a.size()), mx(a.size());
    reduce_into(mn.data(), a.data(), b.data(), a.size(), DType::kFloat32, ReduceOp::MIN);
    reduce_into(mx.data(), a.data(), b.data(), a.size(), DType::kFloat32, ReduceOp::MAX);
    for (size_t i = 0; i < a.size(); ++i) {
      const bool any_nan = std::isnan(a[i]) || std::isnan(b[i]);
      EXPECT_EQ(std::isnan(mn[i]), any_nan) << i;
      EXPECT_EQ(std::isnan(mx[i]), any_nan) << i;
      if (!any_nan) {
        EXPECT_EQ(mn[i], std::min(a[i], b[i])) << i;
        EXPECT_EQ(mx[i], std::max(a[i], b[i])) << i;
      }
    }
    // The same through the half-precision paths.
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      auto to = dtype == DType::kFloat16 ? float_to_half : float_to_bfloat16;
      auto from = dtype == DType::kFloat16 ? half_to_float : bfloat16_to_float;
      std::vector<uint16_t> ha, hb, out(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ha.push_back(to(a[i]));
        hb.push_back(to(b[i]));
      }
      reduce_into(out.data(), ha.data(), hb.data(), a.size(), dtype, ReduceOp::MAX);
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(std::isnan(from(out[i])), std::isnan(a[i]) || std::isnan(b[i]))
            << dtype_name(dtype) << " " << i;
      }
    }
  });
}

TEST(ReduceKernelTest, HalfPrecisionNaNAndInfSurvive) {
  // NaN and inf inputs, inf - inf, and 0 * inf through every op and both kernel sets, at a
  // length with a full vector step and a padded remainder.
  for_each_isa([] {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const bool is_half = dtype == DType::kFloat16;
      auto to = is_half ? float_to_half : float_to_bfloat16;
      auto from = is_half ? half_to_float : bfloat16_to_float;
      const float inf = std::numeric_limits<float>::infinity();
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> x = {nan, inf,  -inf, inf,  0.0f, 1.0f, -nan, 2.0f, inf, 3.0f,
                              nan, 1.0f, 0.5f, -inf, 7.0f, nan,  inf,  1.0f, nan};
      std::vector<float> y = {1.0f, -inf, -inf, 0.0f, inf,  nan,  2.0f, -nan, 1.0f, -3.0f,
                              nan,  1.0f, 0.5f, 2.0f, 7.0f, 0.0f, inf,  inf,  2.0f};
      std::vector<uint16_t> hx, hy;
      for (size_t i = 0; i < x.size(); ++i) {
        hx.push_back(to(x[i]));
        hy.push_back(to(y[i]));
      }
      for (ReduceOp::Kind kind : {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX}) {
        std::vector<uint16_t> out(x.size());
        reduce_into(out.data(), hx.data(), hy.data(), x.size(), dtype, kind);
        for (size_t i = 0; i < x.size(); ++i) {
          const float want = ref_float_op(kind, from(hx[i]), from(hy[i]));
          const float got = from(out[i]);
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got))
                << dtype_name(dtype) << " " << ReduceOp(kind).name() << " " << i;
          } else {
            EXPECT_EQ(got, want) << dtype_name(dtype) << " " << ReduceOp(kind).name() << " " << i;
          }
        }
      }
      std::vector<uint16_t> s = hx;
      scale(s.data(), s.size(), dtype, 0.5);
      finalize_avg(s.data(), s.size(), dtype, 3);
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(std::isnan(from(s[i])), std::isnan(from(hx[i]))) << dtype_name(dtype) << " " << i;
      }
    }
  });
}

TEST(ReduceKernelTest, IntegerOverflowWraps) {
  for_each_isa([] {
    std::vector<int32_t> a = {std::numeric_limits<int32_t>::max(),
                              std::numeric_limits<int32_t>::min(), 65536};
    std::vector<int32_t> b = {1, -1, 65536};
    reduce(a.data(), b.data(), 2, DType::kInt32, ReduceOp::SUM);
    EXPECT_EQ(a[0], std::numeric_limits<int32_t>::min());
    EXPECT_EQ(a[1], std::numeric_limits<int32_t>::max());
    std::vector<int16_t> c = {-32768, 300}, d = {-1, 300};
    reduce(c.data(), d.data(), 2, DType::kInt16, ReduceOp::PRODUCT);
    EXPECT_EQ(c[0], -32768);  // 32768 wraps back to -32768
    EXPECT_EQ(c[1], static_cast<int16_t>(90000 - 65536));
  });
}

// ---------------------------------------------------------------------------------------------
// Half precision: combining happens in float32 with one rounding at the end.

TEST(HalfPrecisionTest, HalfConversionsMatchCompiler) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float mine = half_to_float(static_cast<uint16_t>(h));
    const float ref = ref_from_half(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(mine)) << std::hex << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(mine), std::bit_cast<uint32_t>(ref)) << std::hex << h;
    }
  }
  // float -> half on a sweep of the whole float range plus the tricky boundaries.
  std::vector<uint32_t> samples;
  for (uint64_t x = 0; x <= 0xFFFFFFFFull; x += 65521) samples.push_back(static_cast<uint32_t>(x));
  for (uint32_t edge : {0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x38800000u,
                        0x387FFFFFu, 0x387FC000u, 0x33000000u, 0x33000001u, 0x32FFFFFFu,
                        0x33800000u, 0x3F801000u, 0x3F803000u, 0x7F800000u, 0x00000001u}) {
    samples.push_back(edge);
    samples.push_back(edge | 0x80000000u);
  }
  for (uint32_t bits : samples) {
    const float f = std::bit_cast<float>(bits);
    const uint16_t mine = float_to_half(f);
    if (std::isnan(f)) {
      ASSERT_EQ(mine & 0x7E00, 0x7E00) << std::hex << bits;  // quiet NaN
    } else {
      ASSERT_EQ(mine, ref_to_half(f)) << std::hex << bits;
    }
  }
}

TEST(HalfPrecisionTest, BFloat16ConversionsMatchReference) {
  for (uint64_t x = 0; x <= 0xFFFFFFFFull; x += 65519) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(x));
    const uint16_t mine = float_to_bfloat16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bfloat16_to_float(mine))) << std::hex << x;
    } else {
      ASSERT_EQ(mine, ref_to_bf16(f)) << std::hex << x;
    }
  }
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);  // rounds to inf
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, even above
}

TEST(HalfPrecisionTest, RoundingTiesToEven) {
  for_each_isa([] {
    // float16 around 1.0: ulp 2^-10, so adding 2^-11 is an exact tie.
    std::vector<uint16_t> a = {float_to_half(1.0f),    float_to_half(1.0f + 0x1p-10f),
                               float_to_half(1.0f),    float_to_half(65504.0f),
                               float_to_half(2048.0f), float_to_half(2050.0f)};
    std::vector<uint16_t> b = {
        float_to_half(0x1p-11f), float_to_half(0x1p-11f), float_to_half(0x1p-11f + 0x1p-20f),
        float_to_half(65504.0f), float_to_half(1.0f),     float_to_half(1.0f)};
    ASSERT_EQ(half_to_float(b[2]), 0x1p-11f + 0x1p-20f);
    reduce(a.data(), b.data(), a.size(), DType::kFloat16, ReduceOp::SUM);
    EXPECT_EQ(half_to_float(a[0]), 1.0f);             // tie -> even (down)
    EXPECT_EQ(half_to_float(a[1]), 1.0f + 0x1p-9f);   // tie -> even (up)
    EXPECT_EQ(half_to_float(a[2]), 1.0f + 0x1p-10f);  // just above the tie: up
    EXPECT_TRUE(std::isinf(half_to_float(a[3])));     // overflow -> inf
    EXPECT_EQ(half_to_float(a[4]), 2048.0f);          // 2049: tie -> 2048
    EXPECT_EQ(half_to_float(a[5]), 2052.0f);          // 2051: tie -> 2052

    // bfloat16 around 1.0: ulp 2^-7, tie at 2^-8.
    std::vector<uint16_t> c = {float_to_bfloat16(1.0f), float_to_bfloat16(1.0f + 0x1p-7f)};
    std::vector<uint16_t> d = {float_to_bfloat16(0x1p-8f), float_to_bfloat16(0x1p-8f)};
    reduce(c.data(), d.data(), c.size(), DType::kBFloat16, ReduceOp::SUM);
    EXPECT_EQ(bfloat16_to_float(c[0]), 1.0f);
    EXPECT_EQ(bfloat16_to_float(c[1]), 1.0f + 0x1p-6f);
  });
}

TEST(HalfPrecisionTest, AccumulatingManyRanksMatchesFloatThenRound) {
  // Eight ranks' contributions folded one after another, as a ring or tree would: each step
  // is one float32 combine and one rounding, which is what the reference does too.
  for_each_isa([] {
    constexpr size_t kN = 1000;
    constexpr int kRanks = 8;
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const bool is_half = dtype == DType::kFloat16;
      auto to = is_half ? ref_to_half : ref_to_bf16;
      auto from = is_half ? ref_from_half : ref_from_bf16;
      std::vector<uint16_t> acc(kN), expected(kN);
      for (size_t i = 0; i < kN; ++i) acc[i] = expected[i] = to(dist(rng));
      for (int r = 1; r < kRanks; ++r) {
        std::vector<uint16_t> contribution(kN);
        for (size_t i = 0; i < kN; ++i) {
          contribution[i] = to(dist(rng));
          expected[i] = to(from(expected[i]) + from(contribution[i]));
        }
        reduce(acc.data(), contribution.data(), kN, dtype, ReduceOp::SUM);
      }
      EXPECT_EQ(acc, expected) << dtype_name(dtype);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// reduce_into and aliasing.

TEST(ReduceIntoTest, AllAliasingPatterns) {
  for_each_isa([] {
    std::mt19937_64 rng(5);
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64,
                        DType::kUInt8, DType::kComplex128}) {
      for (size_t n : {size_t{1}, size_t{17}, size_t{1031}}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << n);
        const size_t e = element_size(dtype);
        std::vector<unsigned char> a(n * e), b(n * e), expected(n * e), out(n * e);
        fill_random(dtype, a.data(), n, rng);
        fill_random(dtype, b.data(), n, rng);
        auto check = [&](const std::vector<unsigned char>& got, const char* what) {
          for (size_t i = 0; i < n; ++i) {
            ASSERT_TRUE(same_element(dtype, got.data(), expected.data(), i)) << what << " " << i;
          }
        };
        // Separate output; inputs untouched.
        reference(dtype, ReduceOp::SUM, a.data(), b.data(), expected.data(), n);
        auto a0 = a, b0 = b;
        reduce_into(out.data(), a.data(), b.data(), n, dtype, ReduceOp::SUM);
        check(out, "out separate");
        EXPECT_EQ(a, a0);
        EXPECT_EQ(b, b0);
        // out == a
        auto x = a;
        reduce_into(x.data(), x.data(), b.data(), n, dtype, ReduceOp::SUM);
        check(x, "out == a");
        // out == b
        auto y = b;
        reduce_into(y.data(), a.data(), y.data(), n, dtype, ReduceOp::SUM);
        check(y, "out == b");
        // out == a == b: doubling.
        reference(dtype, ReduceOp::SUM, a.data(), a.data(), expected.data(), n);
        auto z = a;
        reduce_into(z.data(), z.data(), z.data(), n, dtype, ReduceOp::SUM);
        check(z, "out == a == b");
        auto w = a;
        reduce(w.data(), w.data(), n, dtype, ReduceOp::SUM);
        check(w, "reduce(x, x)");
      }
    }
  });
}

// reduce_many folds its sources left to right: the same bits as a chain of reduce_into, which
// matters where rounding makes the order visible (float16, float32 sums of mixed magnitudes).
TEST(ReduceManyTest, FoldsLeftToRightLikeAChainOfReduceInto) {
  for_each_isa([] {
    std::mt19937_64 rng(17);
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8,
                        DType::kComplex64, DType::kBool}) {
      for (size_t sources = 1; sources <= 5; ++sources) {
        for (size_t offset : {size_t{0}, size_t{1}}) {  // 1: not even element-aligned
          // Several of reduce_many's 8 KiB fold blocks for every dtype, and a partial one.
          const size_t n = 20011;
          const size_t e = element_size(dtype);
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << " sources=" << sources << " offset=" << offset);
          std::vector<std::vector<unsigned char>> src(sources,
                                                      std::vector<unsigned char>(n * e + 1));
          std::vector<const void*> ptrs;
          for (auto& v : src) {
            fill_random(dtype, v.data() + offset, n, rng);
            ptrs.push_back(v.data() + offset);
          }
          std::vector<unsigned char> expected(src[0].begin() + offset,
                                              src[0].begin() + offset + n * e);
          for (size_t j = 1; j < sources; ++j) {
            reduce_into(expected.data(), expected.data(), ptrs[j], n, dtype, ReduceOp::SUM);
          }
          std::vector<unsigned char> out(n * e + 1);
          reduce_many(out.data() + offset, ptrs.data(), sources, n, dtype, ReduceOp::SUM);
          EXPECT_EQ(0, std::memcmp(out.data() + offset, expected.data(), n * e));
          // In place into the first source.
          reduce_many(src[0].data() + offset, ptrs.data(), sources, n, dtype, ReduceOp::SUM);
          EXPECT_EQ(0, std::memcmp(src[0].data() + offset, expected.data(), n * e));
        }
      }
    }
  });
  unsigned char a[4] = {};
  EXPECT_THROW(reduce_many(a, nullptr, 0, 1, DType::kFloat32, ReduceOp::SUM), InvalidArgument);
  const void* one[] = {a};
  EXPECT_THROW(reduce_many(a, one, 1, 1, DType::kBool, ReduceOp::AVG), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Pre- and post-steps.

TEST(ScaleTest, FloatingTypes) {
  for_each_isa([] {
    std::vector<float> f(1031);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.37f - 100.0f;
    auto g = f;
    scale(g.data(), g.size(), DType::kFloat32, 0.1);
    for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(g[i], f[i] * 0.1f) << i;

    std::vector<double> d = {1.5, -2.0, 1e300};
    scale(d.data(), d.size(), DType::kFloat64, 3.0);
    EXPECT_EQ(d, (std::vector<double>{4.5, -6.0, 3e300}));

    std::vector<std::complex<float>> c = {{1.0f, -2.0f}, {0.5f, 4.0f}};
    scale(c.data(), c.size(), DType::kComplex64, 2.0);
    EXPECT_EQ(c[0], std::complex<float>(2.0f, -4.0f));
    EXPECT_EQ(c[1], std::complex<float>(1.0f, 8.0f));

    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const bool is_half = dtype == DType::kFloat16;
      auto to = is_half ? ref_to_half : ref_to_bf16;
      auto from = is_half ? ref_from_half : ref_from_bf16;
      std::vector<uint16_t> h(37), expected(37);
      for (size_t i = 0; i < h.size(); ++i) {
        h[i] = to(static_cast<float>(i) * 1.7f - 20.0f);
        expected[i] = to(from(h[i]) * 0.3f);
      }
      scale(h.data(), h.size(), dtype, 0.3);
      EXPECT_EQ(h, expected) << dtype_name(dtype);
    }
  });
}

TEST(ScaleTest, Integers) {
  std::vector<int32_t> a = {1, -7, 1000000, std::numeric_limits<int32_t>::max()};
  scale(a.data(), a.size(), DType::kInt32, 3.0);  // integral: exact, wrapping
  EXPECT_EQ(a, (std::vector<int32_t>{3, -21, 3000000, static_cast<int32_t>(3u * 0x7FFFFFFFu)}));
  std::vector<int32_t> b = {5, -5, 7};
  scale(b.data(), b.size(), DType::kInt32, 2.5);  // truncates toward zero
  EXPECT_EQ(b, (std::vector<int32_t>{12, -12, 17}));
  std::vector<int8_t> c = {100, -100, 3};
  scale(c.data(), c.size(), DType::kInt8, 2.5);  // saturates
  EXPECT_EQ(c, (std::vector<int8_t>{127, -128, 7}));
  std::vector<uint8_t> d = {200, 1};
  scale(d.data(), d.size(), DType::kUInt8, -0.5);
  EXPECT_EQ(d, (std::vector<uint8_t>{0, 0}));
  std::vector<int64_t> e = {std::numeric_limits<int64_t>::max(), 4};
  scale(e.data(), e.size(), DType::kInt64, 1.5);
  EXPECT_EQ(e, (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 6}));
  std::vector<int16_t> f = {10};
  scale(f.data(), f.size(), DType::kInt16, std::nan(""));
  EXPECT_EQ(f[0], 0);

  uint8_t flags[2] = {1, 0};
  EXPECT_THROW(scale(flags, 2, DType::kBool, 2.0), InvalidArgument);
}

TEST(FinalizeAvgTest, FloatingTypes) {
  for_each_isa([] {
    for (int world : {1, 2, 3, 4, 7, 8}) {
      SCOPED_TRACE(::testing::Message() << "world=" << world);
      std::vector<float> f(77);
      for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 1.1f - 30.0f;
      auto g = f;
      finalize_avg(g.data(), g.size(), DType::kFloat32, world);
      for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(g[i], f[i] / static_cast<float>(world)) << i;

      std::vector<double> d = {1.0, -3.0, 1e-310};
      auto d0 = d;
      finalize_avg(d.data(), d.size(), DType::kFloat64, world);
      for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], d0[i] / world);

      std::vector<std::complex<double>> c = {{3.0, -6.0}};
      finalize_avg(c.data(), c.size(), DType::kComplex128, world);
      EXPECT_EQ(c[0], std::complex<double>(3.0 / world, -6.0 / world));

      for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
        const bool is_half = dtype == DType::kFloat16;
        auto to = is_half ? ref_to_half : ref_to_bf16;
        auto from = is_half ? ref_from_half : ref_from_bf16;
        std::vector<uint16_t> h(29), expected(29);
        for (size_t i = 0; i < h.size(); ++i) {
          h[i] = to(static_cast<float>(i) * 3.3f - 40.0f);
          expected[i] = to(from(h[i]) / static_cast<float>(world));
        }
        finalize_avg(h.data(), h.size(), dtype, world);
        EXPECT_EQ(h, expected) << dtype_name(dtype);
      }
    }
  });
}

TEST(FinalizeAvgTest, IntegersTruncate) {
  std::vector<int32_t> a = {
      7, -7, 6, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  finalize_avg(a.data(), a.size(), DType::kInt32, 2);
  EXPECT_EQ(a, (std::vector<int32_t>{3, -3, 3, 0, std::numeric_limits<int32_t>::min() / 2,
                                     std::numeric_limits<int32_t>::max() / 2}));
  // Exhaustive over int16 numerators for a few world sizes: the float64 route must agree
  // with integer division everywhere.
  for (int world : {3, 7, 1000, 32767, 65536, std::numeric_limits<int>::max()}) {
    std::vector<int16_t> all(65536);
    for (int i = 0; i < 65536; ++i) all[i] = static_cast<int16_t>(i - 32768);
    finalize_avg(all.data(), all.size(), DType::kInt16, world);
    for (int i = 0; i < 65536; ++i) {
      ASSERT_EQ(all[i], static_cast<int16_t>((i - 32768) / world)) << i << " / " << world;
    }
  }
  std::mt19937_64 rng(11);
  std::vector<int32_t> r(10000), r0;
  for (auto& v : r) v = static_cast<int32_t>(rng());
  r0 = r;
  for (int world : {3, 12345, std::numeric_limits<int>::max()}) {
    auto x = r0;
    finalize_avg(x.data(), x.size(), DType::kInt32, world);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], r0[i] / world) << r0[i] << " / " << world;
  }
  std::vector<int64_t> big = {std::numeric_limits<int64_t>::max(), -9, 9};
  finalize_avg(big.data(), big.size(), DType::kInt64, 3);
  EXPECT_EQ(big, (std::vector<int64_t>{std::numeric_limits<int64_t>::max() / 3, -3, 3}));
  std::vector<uint8_t> u = {255, 5};
  finalize_avg(u.data(), u.size(), DType::kUInt8, 4);
  EXPECT_EQ(u, (std::vector<uint8_t>{63, 1}));
}

TEST(FinalizeAvgTest, RejectsBoolAndBadWorldSize) {
  uint8_t flags[2] = {1, 0};
  EXPECT_THROW(finalize_avg(flags, 2, DType::kBool, 2), InvalidArgument);
  float f[1] = {1.0f};
  EXPECT_THROW(finalize_avg(f, 1, DType::kFloat32, 0), InvalidArgument);
  EXPECT_THROW(finalize_avg(f, 1, DType::kFloat32, -2), InvalidArgument);
}

TEST(PrePostStepTest, ApplyOnlyForTheirOps) {
  std::vector<float> v = {2.0f, 4.0f};
  EXPECT_FALSE(apply_premul(v.data(), v.size(), DType::kFloat32, ReduceOp::SUM));
  EXPECT_TRUE(apply_premul(v.data(), v.size(), DType::kFloat32, ReduceOp::premul_sum(0.5)));
  EXPECT_EQ(v, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_FALSE(apply_postdiv(v.data(), v.size(), DType::kFloat32, ReduceOp::SUM, 2));
  EXPECT_TRUE(apply_postdiv(v.data(), v.size(), DType::kFloat32, ReduceOp::AVG, 2));
  EXPECT_EQ(v, (std::vector<float>{0.5f, 1.0f}));
}

TEST(PrePostStepTest, UnalignedBuffers) {
  for_each_isa([] {
    // float32 data at an odd byte offset goes through the aligned-scratch path.
    std::vector<unsigned char> raw(4 * 5000 + 1);
    std::vector<float> values(5000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) - 17.5f;
    std::memcpy(raw.data() + 1, values.data(), 4 * values.size());
    scale(raw.data() + 1, values.size(), DType::kFloat32, 2.0);
    finalize_avg(raw.data() + 1, values.size(), DType::kFloat32, 3);
    for (size_t i = 0; i < values.size(); ++i) {
      float got;
      std::memcpy(&got, raw.data() + 1 + 4 * i, 4);
      ASSERT_EQ(got, (values[i] * 2.0f) / 3.0f) << i;
    }
  });
}

}  // namespace
}  // namespace c10d::core
