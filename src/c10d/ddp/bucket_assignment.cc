#include "c10d/ddp/bucket_assignment.h"

#include <algorithm>
#include <utility>

#include "c10d/core/exception.h"

namespace c10d::ddp {
namespace {

struct Open {
  core::DType dtype;
  core::Device device;
  std::vector<size_t> indices;
  size_t bytes = 0;
  size_t limit_index = 0;  // into size_limits; advances as buckets of this key close
};

}  // namespace

BucketAssignment compute_bucket_assignment_by_size(const std::vector<core::Tensor>& tensors,
                                                   const std::vector<size_t>& size_limits,
                                                   const std::vector<bool>& expect_sparse_gradient,
                                                   const std::vector<int64_t>& tensor_indices) {
  C10D_CHECK_ARG(!tensors.empty(), "compute_bucket_assignment_by_size: no tensors");
  C10D_CHECK_ARG(!size_limits.empty(), "compute_bucket_assignment_by_size: no bucket size limits");
  C10D_CHECK_ARG(expect_sparse_gradient.empty() || expect_sparse_gradient.size() == tensors.size(),
                 "compute_bucket_assignment_by_size: expect_sparse_gradient has ",
                 expect_sparse_gradient.size(), " entries for ", tensors.size(), " tensors");
  C10D_CHECK_ARG(tensor_indices.empty() || tensor_indices.size() == tensors.size(),
                 "compute_bucket_assignment_by_size: tensor_indices has ", tensor_indices.size(),
                 " entries for ", tensors.size(), " tensors");
  std::vector<std::pair<std::vector<size_t>, size_t>> closed;
  std::vector<Open> open;  // one per (dtype, device), in order of first appearance
  for (size_t i = 0; i < tensors.size(); ++i) {
    const core::Tensor& t = tensors[i];
    size_t index = i;
    if (!tensor_indices.empty()) {
      C10D_CHECK_ARG(
          tensor_indices[i] >= 0 && static_cast<size_t>(tensor_indices[i]) < tensors.size(),
          "compute_bucket_assignment_by_size: tensor_indices[", i, "] = ", tensor_indices[i],
          " is not in [0, ", tensors.size(), ")");
      index = static_cast<size_t>(tensor_indices[i]);
    }
    if (!expect_sparse_gradient.empty() && expect_sparse_gradient[index]) {
      closed.emplace_back(std::vector<size_t>{index}, 0);
      continue;
    }
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& b) {
      return b.dtype == t.dtype() && b.device == t.device();
    });
    if (it == open.end()) it = open.insert(open.end(), Open{t.dtype(), t.device(), {}});
    it->indices.push_back(index);
    it->bytes += t.nbytes();
    const size_t limit = size_limits[it->limit_index];
    if (it->bytes >= limit) {
      closed.emplace_back(std::move(it->indices), limit);
      it->indices.clear();
      it->bytes = 0;
      it->limit_index = std::min(it->limit_index + 1, size_limits.size() - 1);
    }
  }
  for (Open& b : open) {
    if (!b.indices.empty()) closed.emplace_back(std::move(b.indices), size_limits[b.limit_index]);
  }
  if (tensor_indices.empty()) {
    std::stable_sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) {
      return *std::min_element(a.first.begin(), a.first.end()) <
             *std::min_element(b.first.begin(), b.first.end());
    });
  }
  BucketAssignment out;
  for (auto& [indices, limit] : closed) {
    out.buckets.push_back(std::move(indices));
    out.size_limits.push_back(limit);
  }
  return out;
}

}  // namespace c10d::ddp
