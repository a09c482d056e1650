#include "c10d/core/tensor.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "c10d/core/exception.h"

namespace c10d::core {
namespace {

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

}  // namespace

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return "cuda:" + std::to_string(index);
    default:
      return "device(" + std::to_string(index) + ")";
  }
}

Tensor::Tensor(void* data, DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides,
               std::shared_ptr<void> owner, Device device)
    : data_(data), dtype_(dtype), sizes_(std::move(sizes)), strides_(std::move(strides)),
      owner_(std::move(owner)), device_(device) {
  for (int64_t s : sizes_) C10D_CHECK_ARG(s >= 0, "tensor sizes must be non-negative, got ", s);
  if (strides_.empty()) strides_ = contiguous_strides(sizes_);
  C10D_CHECK_ARG_EQ(strides_.size(), sizes_.size(), "tensor strides and sizes differ in rank");
  numel_ = product(sizes_);
}

Tensor Tensor::empty(std::vector<int64_t> sizes, DType dtype) {
  const int64_t n = product(sizes);
  C10D_CHECK_ARG(n >= 0, "tensor sizes must be non-negative");
  // Round up to the alignment, and never ask aligned_alloc for 0 bytes.
  size_t bytes = std::max<size_t>(static_cast<size_t>(n) * core::element_size(dtype), 1);
  bytes = (bytes + 63) / 64 * 64;
  void* data = std::aligned_alloc(64, bytes);
  if (data == nullptr) throw std::bad_alloc();
  std::shared_ptr<void> owner(data, [](void* p) { std::free(p); });
  return Tensor(data, dtype, std::move(sizes), {}, std::move(owner));
}

Tensor Tensor::contiguous_copy() const {
  Tensor out = empty(sizes_, dtype_);
  if (is_contiguous()) {
    if (nbytes() > 0) std::memcpy(out.data(), data_, nbytes());
  } else {
    copy_elements(out, *this);
  }
  return out;
}

bool Tensor::elements_overlap() const {
  // Walk the dimensions from the smallest stride up: each must step past everything the
  // smaller ones span, or two indices reach the same element.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size), sizes > 1 only
  for (size_t i = 0; i < sizes_.size(); ++i) {
    if (sizes_[i] == 0) return false;
    if (sizes_[i] > 1) dims.emplace_back(std::abs(strides_[i]), sizes_[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dimensions so far
  for (const auto& [stride, size] : dims) {
    if (stride < span) return true;
    span = stride * size;
  }
  return false;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (strides_[i] != expected) return numel_ == 0;
    expected *= sizes_[i];
  }
  return true;
}

Tensor Tensor::flat_slice(int64_t offset, int64_t count) const {
  C10D_CHECK_ARG(is_contiguous(), "flat_slice needs a contiguous tensor, got ", str());
  C10D_CHECK_ARG(offset >= 0 && count >= 0 && offset + count <= numel_, "flat_slice [", offset,
                 ", ", offset + count, ") is outside a tensor of ", numel_, " elements");
  char* base = static_cast<char*>(data_) + offset * static_cast<int64_t>(element_size());
  return Tensor(base, dtype_, {count}, {1}, owner_, device_);
}

Tensor Tensor::view_as_real() const {
  C10D_CHECK_ARG(is_complex(dtype_), "view_as_real needs a complex tensor, got ", str());
  std::vector<int64_t> sizes = sizes_;
  std::vector<int64_t> strides;
  for (int64_t s : strides_) strides.push_back(s * 2);
  sizes.push_back(2);
  strides.push_back(1);
  return Tensor(data_, complex_to_real(dtype_), sizes, strides, owner_, device_);
}

Tensor Tensor::reshape(std::vector<int64_t> sizes) const {
  C10D_CHECK_ARG(is_contiguous(), "reshape needs a contiguous tensor, got ", str());
  C10D_CHECK_ARG_EQ(product(sizes), numel_, "reshape must keep the number of elements");
  return Tensor(data_, dtype_, std::move(sizes), {}, owner_, device_);
}

std::string Tensor::str() const {
  std::ostringstream out;
  out << dtype_name(dtype_) << "[";
  for (size_t i = 0; i < sizes_.size(); ++i) out << (i ? ", " : "") << sizes_[i];
  out << "]";
  if (device_.type != DeviceType::kCPU) out << " on " << device_.str();
  return out.str();
}

Tensor Tensor::from_dlpack(DLManagedTensor* managed) {
  C10D_CHECK_ARG(managed != nullptr, "from_dlpack: null DLManagedTensor");
  std::shared_ptr<void> owner(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  const DLTensor& t = managed->dl_tensor;
  auto dtype = from_dlpack_type({t.dtype.code, t.dtype.bits, t.dtype.lanes});
  C10D_CHECK_ARG(dtype.has_value(), "from_dlpack: unsupported DLPack dtype (code ",
                 int(t.dtype.code), ", bits ", int(t.dtype.bits), ", lanes ", t.dtype.lanes, ")");
  Device device;
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      device = {DeviceType::kCPU, 0};
      break;
    case kDLCUDA:
      device = {DeviceType::kCUDA, t.device.device_id};
      break;
    default:
      device = {DeviceType::kOther, t.device.device_id};
  }
  std::vector<int64_t> sizes(t.shape, t.shape + t.ndim);
  std::vector<int64_t> strides;
  if (t.strides != nullptr) strides.assign(t.strides, t.strides + t.ndim);
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return Tensor(data, *dtype, std::move(sizes), std::move(strides), std::move(owner), device);
}

namespace {
// What a DLManagedTensor we export carries: the shape arrays and a reference to the memory.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
};
}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  auto* ctx = new ExportContext{*this, sizes_, strides_, {}};
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = data_;
  t.device = {device_.type == DeviceType::kCUDA ? kDLCUDA : kDLCPU, device_.index};
  t.ndim = static_cast<int32_t>(sizes_.size());
  auto type = to_dlpack_type(dtype_);
  t.dtype = {type.code, type.bits, type.lanes};
  t.shape = ctx->sizes.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  return &ctx->managed;
}

void copy_elements(const Tensor& dst, const Tensor& src) {
  C10D_CHECK_ARG(dst.dtype() == src.dtype() && dst.sizes() == src.sizes(),
                 "copy_elements: ", src.str(), " into ", dst.str());
  if (dst.numel() == 0) return;
  const int64_t elem = static_cast<int64_t>(src.element_size());
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  // Rows along the last dimension (a 0-d tensor is one row of one element).
  const auto& sizes = src.sizes();
  const size_t dims = sizes.size();
  const int64_t row = dims == 0 ? 1 : sizes.back();
  const int64_t ds = dims == 0 ? 1 : dst.strides().back() * elem;
  const int64_t ss = dims == 0 ? 1 : src.strides().back() * elem;
  std::vector<int64_t> index(dims, 0);
  for (int64_t done = 0; done < src.numel(); done += row) {
    int64_t doff = 0, soff = 0;
    for (size_t d = 0; d + 1 < dims; ++d) {
      doff += index[d] * dst.strides()[d];
      soff += index[d] * src.strides()[d];
    }
    char* to = static_cast<char*>(dst.data()) + doff * elem;
    const char* from = static_cast<const char*>(src.data()) + soff * elem;
    if (ds == elem && ss == elem) {
      std::memcpy(to, from, static_cast<size_t>(row * elem));
    } else {
      for (int64_t i = 0; i < row; ++i) {
        std::memcpy(to + i * ds, from + i * ss, static_cast<size_t>(elem));
      }
    }
    for (size_t d = dims > 0 ? dims - 1 : 0; d-- > 0;) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

void check_dense_cpu(const Tensor& tensor, std::string_view what) {
  C10D_CHECK_ARG(tensor.device().type == DeviceType::kCPU, what,
                 ": tensors must be on the CPU, got ", tensor.str());
  // Collectives stage other layouts before this check; sends and receives (as in torch, whose
  // wording this is) and direct C++ callers reach it.
  C10D_CHECK_ARG(tensor.is_contiguous(), what,
                 ": input tensor has to be contiguous (dense, C order); got ", tensor.str(),
                 " with non-contiguous strides. Pass a contiguous copy "
                 "(numpy.ascontiguousarray / tensor.contiguous()).");
  C10D_CHECK_ARG(tensor.data() != nullptr || tensor.numel() == 0, what, ": tensor has no data");
}

void check_same_dtype(const std::vector<Tensor>& tensors, std::string_view what) {
  for (size_t i = 1; i < tensors.size(); ++i) {
    C10D_CHECK_ARG(tensors[i].dtype() == tensors[0].dtype(), what, ": ", kDifferentDtypes,
                   ": tensor ", i, " is ", dtype_name(tensors[i].dtype()), " but tensor 0 is ",
                   dtype_name(tensors[0].dtype()), "; all tensors must share one dtype");
  }
}

void check_same_sizes(const std::vector<Tensor>& tensors, std::string_view what) {
  for (size_t i = 1; i < tensors.size(); ++i) {
    C10D_CHECK_ARG(tensors[i].sizes() == tensors[0].sizes(), what, ": invalid tensor size: tensor ",
                   i, " is ", tensors[i].str(), " but tensor 0 is ", tensors[0].str(),
                   "; all tensors must have the same shape");
  }
}

}  // namespace c10d::core
