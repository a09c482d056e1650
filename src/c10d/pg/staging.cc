#include "c10d/pg/staging.h"

#include <algorithm>

#include "c10d/core/exception.h"

namespace c10d::pg {

bool Staging::needed(const Tensor& tensor) {
  return tensor.device().type == core::DeviceType::kCPU && !tensor.is_contiguous();
}

bool Staging::needed(const std::vector<Tensor>& tensors) {
  return std::any_of(tensors.begin(), tensors.end(), [](const Tensor& t) { return needed(t); });
}

bool Staging::needed(const std::vector<std::vector<Tensor>>& lists) {
  return std::any_of(lists.begin(), lists.end(),
                     [](const std::vector<Tensor>& l) { return needed(l); });
}

namespace {

// The bytes a CPU tensor's elements lie in, [first, last); empty for no elements.
std::pair<uintptr_t, uintptr_t> byte_range(const Tensor& t) {
  if (t.numel() == 0 || t.device().type != core::DeviceType::kCPU) return {0, 0};
  int64_t low = 0, high = 0;  // element offsets of the first and last element
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.sizes()[d] - 1) * t.strides()[d];
    (reach < 0 ? low : high) += reach;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data());
  const auto size = static_cast<int64_t>(t.element_size());
  return {base + low * size, base + (high + 1) * size};
}

}  // namespace

bool Staging::share_bytes(const Tensor& a, const Tensor& b) {
  const auto [a_first, a_last] = byte_range(a);
  const auto [b_first, b_last] = byte_range(b);
  return a_first != a_last && b_first != b_last && a_first < b_last && b_first < a_last;
}

std::vector<Tensor> Staging::flat(const std::vector<std::vector<Tensor>>& lists) {
  std::vector<Tensor> all;
  for (const auto& l : lists) all.insert(all.end(), l.begin(), l.end());
  return all;
}

bool Staging::overlap(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) {
  if (outputs.empty() || inputs.empty()) return false;
  std::vector<std::pair<uintptr_t, uintptr_t>> written;
  written.reserve(outputs.size());
  for (const auto& t : outputs) {
    if (auto r = byte_range(t); r.first != r.second) written.push_back(r);
  }
  if (written.empty()) return false;
  std::sort(written.begin(), written.end());
  // Each range's end, raised to the largest end before it, so one search answers for all.
  for (size_t i = 1; i < written.size(); ++i) {
    written[i].second = std::max(written[i].second, written[i - 1].second);
  }
  for (const auto& t : inputs) {
    const auto [first, last] = byte_range(t);
    if (first == last) continue;
    // The last output starting before this input ends; it (or one before) reaches into it.
    auto it = std::lower_bound(written.begin(), written.end(), std::make_pair(last, uintptr_t{0}));
    if (it != written.begin() && std::prev(it)->second > first) return true;
  }
  return false;
}

Tensor Staging::inputs(const Tensor& tensor) {
  if (copy_inputs_) return inputs_.emplace_back(tensor.contiguous_copy());
  if (!needed(tensor)) return tensor;
  return inputs_.emplace_back(tensor.contiguous_copy());
}

std::vector<Tensor> Staging::inputs(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(inputs(t));
  return out;
}

std::vector<std::vector<Tensor>> Staging::inputs(const std::vector<std::vector<Tensor>>& lists) {
  std::vector<std::vector<Tensor>> out;
  out.reserve(lists.size());
  for (const auto& l : lists) out.push_back(inputs(l));
  return out;
}

Tensor Staging::outputs(const Tensor& tensor, bool in_place) {
  if (!needed(tensor)) return tensor;
  C10D_CHECK_ARG(!tensor.elements_overlap(), op_, ": the output tensor ", tensor.str(),
                 " has elements that share memory (a stride of 0?), so it cannot hold a result");
  Tensor stand_in =
      in_place ? tensor.contiguous_copy() : Tensor::empty(tensor.sizes(), tensor.dtype());
  outputs_.emplace_back(tensor, stand_in);
  return stand_in;
}

std::vector<Tensor> Staging::outputs(const std::vector<Tensor>& tensors, bool in_place) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(outputs(t, in_place));
  return out;
}

std::vector<std::vector<Tensor>> Staging::outputs(const std::vector<std::vector<Tensor>>& lists,
                                                  bool in_place) {
  std::vector<std::vector<Tensor>> out;
  out.reserve(lists.size());
  for (const auto& l : lists) out.push_back(outputs(l, in_place));
  return out;
}

WorkPtr Staging::finish(WorkPtr work) {
  if (!work || (outputs_.empty() && inputs_.empty())) return work;
  const core::OpType op = work->op_type();
  std::string description = work->description();
  auto written = work->get_future()->then(
      [outputs = std::move(outputs_), inputs = std::move(inputs_)](core::Future& done) {
        for (const auto& [mine, stand_in] : outputs) core::copy_elements(mine, stand_in);
        core::FutureValue value = done.value_now();
        for (auto& t : value.tensors) {
          for (const auto& [mine, stand_in] : outputs) {
            if (t.data() == stand_in.data() && t.sizes() == stand_in.sizes()) t = mine;
          }
        }
        return value;
      });
  return Work::from_future(std::move(written), op, std::move(description));
}

}  // namespace c10d::pg
