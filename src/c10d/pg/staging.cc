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

Tensor Staging::inputs(const Tensor& tensor) {
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
