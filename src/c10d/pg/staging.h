// Collectives on tensors laid out other than in C order (a transposed array, a column, every
// other row) run on contiguous stand-ins: Staging copies the inputs before the operation and
// writes the outputs back once it completed, so that backends only ever see contiguous memory.
// torch.distributed accepts such tensors too (its Gloo backend copies them, or reduces a
// transposed tensor's memory as it lies).
#pragma once

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "c10d/pg/backend.h"

namespace c10d::pg {

class Staging {
 public:
  // `op` names the operation in errors.
  explicit Staging(std::string_view op) : op_(op) {}

  // Whether any CPU tensor among these needs a stand-in.
  static bool needed(const Tensor& tensor);
  static bool needed(const std::vector<Tensor>& tensors);
  static bool needed(const std::vector<std::vector<Tensor>>& lists);

  // Stand-ins for tensors the operation reads: contiguous copies (contiguous tensors as they
  // are).
  Tensor inputs(const Tensor& tensor);
  std::vector<Tensor> inputs(const std::vector<Tensor>& tensors);
  std::vector<std::vector<Tensor>> inputs(const std::vector<std::vector<Tensor>>& lists);
  // Stand-ins for tensors the operation writes, copied back into them when it completes.
  // `in_place`: the operation reads them too, so the stand-ins start as copies. A tensor whose
  // elements overlap in memory cannot be written element by element and is refused.
  Tensor outputs(const Tensor& tensor, bool in_place);
  std::vector<Tensor> outputs(const std::vector<Tensor>& tensors, bool in_place);
  std::vector<std::vector<Tensor>> outputs(const std::vector<std::vector<Tensor>>& lists,
                                           bool in_place);

  // The work users get: it completes once `work` has and the outputs were written back, and
  // its result holds the caller's tensors in place of the stand-ins.
  WorkPtr finish(WorkPtr work);

  // Whether memory of some input is memory of some output (all_to_all_single(x, x), an
  // all_gather whose input is a piece of its output): a backend would read bytes it has
  // already overwritten, so the inputs are read from copies.
  static bool overlap(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs);
  template <typename Out, typename In>
  static bool overlap(const Out& outputs, const In& inputs) {
    // Few pairs (every call but large all_to_alls): compared in place, without allocating.
    if (count(outputs) * count(inputs) > kPairwise) return overlap(flat(outputs), flat(inputs));
    bool found = false;
    each(outputs, [&](const Tensor& o) {
      each(inputs, [&](const Tensor& i) { found = found || share_bytes(o, i); });
    });
    return found;
  }

  // When any tensor needs a stand-in, or an input shares memory with an output, runs
  // fn(staged outputs, staged inputs) and returns the finished work; otherwise nothing (the
  // caller goes on with the tensors as they are).
  template <typename Out, typename In, typename Fn>
  static std::optional<WorkPtr> run(std::string_view op, const Out& outputs, const In& inputs,
                                    Fn&& fn) {
    const bool aliased = overlap(outputs, inputs);
    if (!aliased && !needed(outputs) && !needed(inputs)) return std::nullopt;
    Staging staging(op);
    staging.copy_inputs_ = aliased;
    auto staged_out = staging.outputs(outputs, /*in_place=*/false);
    auto staged_in = staging.inputs(inputs);
    return staging.finish(fn(staged_out, staged_in));
  }
  // The same for an operation in place (allreduce, broadcast, reduce): fn(staged tensors).
  template <typename T, typename Fn>
  static std::optional<WorkPtr> run_in_place(std::string_view op, const T& tensors, Fn&& fn) {
    if (!needed(tensors)) return std::nullopt;
    Staging staging(op);
    auto staged = staging.outputs(tensors, /*in_place=*/true);
    return staging.finish(fn(staged));
  }

 private:
  static constexpr size_t kPairwise = 64;
  // Whether the elements of a and b share a byte.
  static bool share_bytes(const Tensor& a, const Tensor& b);
  static size_t count(const Tensor&) { return 1; }
  static size_t count(const std::vector<Tensor>& tensors) { return tensors.size(); }
  static size_t count(const std::vector<std::vector<Tensor>>& lists) {
    size_t n = 0;
    for (const auto& l : lists) n += l.size();
    return n;
  }
  template <typename Fn>
  static void each(const Tensor& tensor, Fn&& fn) {
    fn(tensor);
  }
  template <typename Fn>
  static void each(const std::vector<Tensor>& tensors, Fn&& fn) {
    for (const auto& t : tensors) fn(t);
  }
  template <typename Fn>
  static void each(const std::vector<std::vector<Tensor>>& lists, Fn&& fn) {
    for (const auto& l : lists) each(l, fn);
  }
  static std::vector<Tensor> flat(const Tensor& tensor) { return {tensor}; }
  static const std::vector<Tensor>& flat(const std::vector<Tensor>& tensors) { return tensors; }
  static std::vector<Tensor> flat(const std::vector<std::vector<Tensor>>& lists);

  std::string_view op_;
  bool copy_inputs_ = false;                        // every input gets a copy, contiguous or not
  std::vector<Tensor> inputs_;                      // kept alive until the work completes
  std::vector<std::pair<Tensor, Tensor>> outputs_;  // (caller's tensor, stand-in)
};

}  // namespace c10d::pg
