// Element types of tensors that c10d moves and reduces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace c10d::core {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kBool,
  kComplex64,
  kComplex128,
};
inline constexpr int kNumDTypes = 12;

// Size of one element in bytes.
size_t element_size(DType dtype);
// Canonical name, as numpy and torch spell it: "float32", "bfloat16", "complex64", ...
std::string_view dtype_name(DType dtype);
// Parses a canonical name or a common alias ("float", "double", "half", "int", "long").
std::optional<DType> dtype_from_name(std::string_view name);

bool is_floating(DType dtype);  // float16/bfloat16/float32/float64
bool is_complex(DType dtype);
bool is_integral(DType dtype, bool include_bool);

// For a complex dtype, the real dtype of its halves (complex64 -> float32).
DType complex_to_real(DType dtype);

// DLPack type codes (kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBfloat=4, kDLComplex=5, kDLBool=6).
struct DLPackType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
DLPackType to_dlpack_type(DType dtype);
std::optional<DType> from_dlpack_type(DLPackType type);

// Python buffer-protocol format strings ("f", "<d", "e", "Zf", "?", ...). bfloat16 has no
// buffer format; it only travels through DLPack.
std::optional<DType> from_buffer_format(std::string_view format, size_t itemsize);
std::string buffer_format(DType dtype);

}  // namespace c10d::core
