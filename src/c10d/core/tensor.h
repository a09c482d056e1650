// Tensor: a typed, shaped view of memory that c10d reads and writes, with a keep-alive owner.
// It never copies on construction: numpy arrays, DLPack capsules and PyTorch tensors are
// wrapped in place. Not thread-safe for concurrent mutation of the same object; sharing the
// underlying memory across threads is the caller's business, as with any buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "c10d/core/dtype.h"

struct DLManagedTensor;  // <dlpack/dlpack.h>

namespace c10d::core {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1, kOther = 2 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

class Tensor {
 public:
  Tensor() = default;
  // Wraps memory. Strides are in elements; empty strides mean C-contiguous. `owner` keeps the
  // memory alive for as long as any copy of this Tensor exists.
  Tensor(void* data, DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides = {},
         std::shared_ptr<void> owner = nullptr, Device device = {});

  // Fresh C-contiguous storage, 64-byte aligned, uninitialised.
  static Tensor empty(std::vector<int64_t> sizes, DType dtype);
  // Fresh storage holding a copy of this tensor's elements (any strides) in C order.
  Tensor contiguous_copy() const;

  // Takes ownership of a DLPack tensor: its deleter runs when the last copy is destroyed.
  static Tensor from_dlpack(DLManagedTensor* managed);
  // A new DLPack tensor sharing this memory (no copy); the consumer must call its deleter.
  DLManagedTensor* to_dlpack() const;

  bool defined() const { return data_ != nullptr || numel() == 0; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t numel() const { return numel_; }
  size_t element_size() const { return core::element_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * element_size(); }
  const Device& device() const { return device_; }
  const std::shared_ptr<void>& owner() const { return owner_; }

  // C-contiguous (size-1 dimensions may have any stride).
  bool is_contiguous() const;
  // Whether two different indices address the same element (a stride of 0, say): such a
  // tensor cannot receive a result element by element.
  bool elements_overlap() const;
  // Elements [offset, offset + count) of a contiguous tensor, as a 1-D view.
  Tensor flat_slice(int64_t offset, int64_t count) const;
  // 1-D view of all elements of a contiguous tensor.
  Tensor flatten() const { return flat_slice(0, numel_); }
  // A complex tensor seen as real pairs: complex64[n...] -> float32[n..., 2].
  Tensor view_as_real() const;
  // Same memory, another shape with the same number of elements (contiguous only).
  Tensor reshape(std::vector<int64_t> sizes) const;

  // "float32[4, 2]"
  std::string str() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;
  int64_t numel_ = 0;
  std::shared_ptr<void> owner_;
  Device device_;
};

// Copies the elements of `src` into `dst` (same dtype and sizes, any strides), in C order.
void copy_elements(const Tensor& dst, const Tensor& src);

// The tensor's data, or a few static bytes when it has none: zero-element tensors may have no
// storage, and transports (Gloo, MPI) want a valid pointer all the same.
inline void* data_or_dummy(const Tensor& tensor) {
  static unsigned char dummy[16];
  return tensor.data() != nullptr ? tensor.data() : dummy;
}

// The one check every collective runs on its tensors: on the CPU, dense and C-contiguous.
// Throws InvalidArgument naming `what` (e.g. "all_reduce: input tensor 2").
void check_dense_cpu(const Tensor& tensor, std::string_view what);
// The words every dtype-mismatch error starts with (torch's checks' wording, which its users
// match on).
inline constexpr const char* kDifferentDtypes =
    "invalid tensor type (tensors with different dtypes; tensors must all have the same type)";
// Throws InvalidArgument unless every tensor has the dtype of the first.
void check_same_dtype(const std::vector<Tensor>& tensors, std::string_view what);
// Throws InvalidArgument unless every tensor has the sizes of the first.
void check_same_sizes(const std::vector<Tensor>& tensors, std::string_view what);

}  // namespace c10d::core
