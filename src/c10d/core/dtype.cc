#include "c10d/core/dtype.h"

#include <array>

#include "c10d/core/exception.h"

namespace c10d::core {
namespace {

struct DTypeInfo {
  std::string_view name;
  size_t size;
  DLPackType dlpack;
  const char* format;  // buffer-protocol format, "" when none exists
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {"float32", 4, {2, 32, 1}, "f"},
    {"float64", 8, {2, 64, 1}, "d"},
    {"float16", 2, {2, 16, 1}, "e"},
    {"bfloat16", 2, {4, 16, 1}, ""},
    {"int8", 1, {0, 8, 1}, "b"},
    {"int16", 2, {0, 16, 1}, "h"},
    {"int32", 4, {0, 32, 1}, "i"},
    {"int64", 8, {0, 64, 1}, "q"},
    {"uint8", 1, {1, 8, 1}, "B"},
    {"bool", 1, {6, 8, 1}, "?"},
    {"complex64", 8, {5, 64, 1}, "Zf"},
    {"complex128", 16, {5, 128, 1}, "Zd"},
}};

const DTypeInfo& info(DType dtype) {
  auto index = static_cast<size_t>(dtype);
  C10D_CHECK_ARG(index < kInfo.size(), "invalid dtype code ", index);
  return kInfo[index];
}

}  // namespace

size_t element_size(DType dtype) { return info(dtype).size; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (kInfo[i].name == name) return static_cast<DType>(i);
  }
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float", DType::kFloat32},    {"double", DType::kFloat64},     {"half", DType::kFloat16},
      {"short", DType::kInt16},      {"int", DType::kInt32},          {"long", DType::kInt64},
      {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128}, {"bool_", DType::kBool},
  };
  for (const auto& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  return std::nullopt;
}

bool is_floating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 ||
         d == DType::kBFloat16;
}
bool is_complex(DType d) { return d == DType::kComplex64 || d == DType::kComplex128; }
bool is_integral(DType d, bool include_bool) {
  switch (d) {
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt8:
      return true;
    case DType::kBool:
      return include_bool;
    default:
      return false;
  }
}

DType complex_to_real(DType d) {
  C10D_CHECK_ARG(is_complex(d), "complex_to_real: ", dtype_name(d), " is not complex");
  return d == DType::kComplex64 ? DType::kFloat32 : DType::kFloat64;
}

DLPackType to_dlpack_type(DType dtype) { return info(dtype).dlpack; }

std::optional<DType> from_dlpack_type(DLPackType type) {
  if (type.lanes != 1) return std::nullopt;
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (kInfo[i].dlpack.code == type.code && kInfo[i].dlpack.bits == type.bits) {
      return static_cast<DType>(i);
    }
  }
  return std::nullopt;
}

std::optional<DType> from_buffer_format(std::string_view format, size_t itemsize) {
  // Strip byte-order / alignment prefixes; only native little-endian data is supported.
  if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<')) {
    format.remove_prefix(1);
  }
  if (format.empty()) return std::nullopt;
  if (format == "Zf") return DType::kComplex64;
  if (format == "Zd") return DType::kComplex128;
  if (format.size() != 1) return std::nullopt;
  // Integer codes whose width depends on the platform are resolved by itemsize.
  auto signed_int = [&]() -> std::optional<DType> {
    switch (itemsize) {
      case 1:
        return DType::kInt8;
      case 2:
        return DType::kInt16;
      case 4:
        return DType::kInt32;
      case 8:
        return DType::kInt64;
      default:
        return std::nullopt;
    }
  };
  switch (format[0]) {
    case 'f':
      return DType::kFloat32;
    case 'd':
      return DType::kFloat64;
    case 'e':
      return DType::kFloat16;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      return signed_int();
    case 'B':
    case 'c':
      return itemsize == 1 ? std::optional(DType::kUInt8) : std::nullopt;
    case '?':
      return DType::kBool;
    default:
      return std::nullopt;
  }
}

std::string buffer_format(DType dtype) { return info(dtype).format; }

}  // namespace c10d::core
