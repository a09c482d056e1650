#include "c10d/pg/signature.h"

#include <cstring>

#include "c10d/core/exception.h"
#include "c10d/pg/flight_recorder.h"

namespace c10d::pg {

using core::detail::str_cat;

namespace {

constexpr size_t kSignatureWords = sizeof(Signature) / sizeof(int64_t);
static_assert(sizeof(Signature) % sizeof(int64_t) == 0);

Signature signature_in(const int64_t* record) {
  Signature sig;
  std::memcpy(static_cast<void*>(&sig), record, sizeof sig);
  return sig;
}

}  // namespace

Signature& Signature::of(const core::Tensor& t) {
  return of(t.dtype(), static_cast<uint64_t>(t.numel()));
}

Signature& Signature::of(core::DType d, uint64_t elements) {
  dtype = static_cast<uint8_t>(d);
  count = elements;
  return *this;
}

Signature& Signature::of(const std::vector<core::Tensor>& tensors) {
  uint64_t elements = 0;
  for (const auto& t : tensors) elements += static_cast<uint64_t>(t.numel());
  return of(tensors.empty() ? core::DType::kUInt8 : tensors.front().dtype(), elements);
}

Signature& Signature::with(const core::ReduceOp& op) {
  reduce = static_cast<uint8_t>(op.kind);
  return *this;
}

Signature& Signature::from(int64_t root_rank) {
  root = static_cast<int32_t>(root_rank);
  return *this;
}

std::string Signature::name() const { return trace_op_name(static_cast<core::OpType>(kind)); }

std::string Signature::str() const {
  std::string text = str_cat(name(), " sequence ", seq);
  if (dtype != kNone && dtype < core::kNumDTypes) {
    text +=
        str_cat(" of ", count, " ", core::dtype_name(static_cast<core::DType>(dtype)), " elements");
  }
  if (reduce != kNone) {
    text += str_cat(" with ", core::ReduceOp(static_cast<core::ReduceOp::Kind>(reduce)).name());
  }
  if (root >= 0) text += str_cat(" from root ", root);
  return text;
}

size_t agreement_words(int size) { return kSignatureWords + 2 * static_cast<size_t>(size); }

std::vector<int64_t> agreement_record(const Signature& sig, const Traffic& traffic, int size) {
  const auto n = static_cast<size_t>(size);
  std::vector<int64_t> record(agreement_words(size), 0);
  std::memcpy(record.data(), &sig, sizeof sig);
  for (size_t r = 0; r < traffic.sends.size() && r < n; ++r) {
    record[kSignatureWords + r] = traffic.sends[r];
  }
  for (size_t r = 0; r < traffic.receives.size() && r < n; ++r) {
    record[kSignatureWords + n + r] = traffic.receives[r];
  }
  return record;
}

std::string disagreement(int rank, int size, const int64_t* records, size_t stride) {
  const auto n = static_cast<size_t>(size);
  const Signature mine = signature_in(records + rank * stride);
  for (int r = 0; r < size; ++r) {
    const Signature theirs = signature_in(records + r * stride);
    if (theirs == mine) continue;
    return str_cat("rank ", rank, " called ", mine.str(), ", but rank ", r, " called ",
                   theirs.str(), ": the ranks called different collectives");
  }
  // Every rank holds every record, so all reach the same verdict on every pair.
  for (size_t from = 0; from < n; ++from) {
    for (size_t to = 0; to < n; ++to) {
      const int64_t sent = records[from * stride + kSignatureWords + to];
      const int64_t expected = records[to * stride + kSignatureWords + n + from];
      if (sent == expected) continue;
      return str_cat(mine.str(), ": rank ", from, " sends ", sent, " bytes to rank ", to,
                     ", which expects ", expected, " from it: the ranks' sizes disagree");
    }
  }
  return {};
}

}  // namespace c10d::pg
