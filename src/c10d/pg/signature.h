// What the ranks of a group must agree on before one collective moves any data: which operation
// (kind, sequence number), on what (dtype, elements per rank), how (reduction, root), and, where
// sizes may differ by rank (all_to_all, gather, scatter), the bytes each rank sends to and
// receives from every other. Backends that trust no rank to have called the same thing (Gloo,
// the ring, MPI) exchange it ahead of the data and fail on every rank, naming both calls,
// instead of reinterpreting a float32 as an int32 or summing into a MAX.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "c10d/core/reduce_op.h"
#include "c10d/core/tensor.h"
#include "c10d/core/work.h"

namespace c10d::pg {

struct Signature {
  static constexpr uint8_t kNone = 0xFF;  // no dtype, no reduction

  uint64_t seq = 0;
  uint64_t count = 0;  // elements each rank contributes; 0 where ranks may differ (all_to_all)
  uint8_t kind = static_cast<uint8_t>(core::OpType::kUnknown);
  uint8_t dtype = kNone;
  uint8_t reduce = kNone;  // ReduceOp::Kind
  uint8_t reserved = 0;
  int32_t root = -1;

  Signature() = default;
  Signature(core::OpType op, uint64_t sequence) : seq(sequence), kind(static_cast<uint8_t>(op)) {}
  // The dtype and element count of `t`.
  Signature& of(const core::Tensor& t);
  Signature& of(core::DType d, uint64_t elements);
  // The first tensor's dtype and all their elements (a coalesced call's).
  Signature& of(const std::vector<core::Tensor>& tensors);
  Signature& with(const core::ReduceOp& op);
  Signature& from(int64_t root_rank);

  bool operator==(const Signature&) const = default;
  // "allreduce sequence 5 of 4 float32 elements with SUM", "broadcast sequence 2 ... from root 1"
  std::string str() const;
  std::string name() const;  // the flight recorder's name of the kind: "allreduce"
};
static_assert(std::is_trivially_copyable_v<Signature> && sizeof(Signature) == 24);

// The bytes one rank moves to and from each peer in an operation whose sizes differ by rank:
// sends[r] and receives[r] for every group rank r. Empty for the other operations.
struct Traffic {
  std::vector<int64_t> sends;
  std::vector<int64_t> receives;
};

// One rank's part of the agreement: its signature, then sends and receives (size entries each,
// zeros without traffic). Every rank's record has the same size, so they travel in one
// all-gather.
std::vector<int64_t> agreement_record(const Signature& sig, const Traffic& traffic, int size);
// The length of agreement_record's records in a group of `size`, in words.
size_t agreement_words(int size);

// What is wrong with every rank's records (`records`: size records in rank order, each starting
// every `stride` words, which is agreement_words(size) or more for a transport that sends more
// with each), or "" when they agree: every rank made this rank's call, and what
// each rank sends every other is what that one expects ("rank 0 called <mine>, but rank 1
// called <theirs>: the ranks called different collectives"). Allocates only on a mismatch;
// callers put their operation in front.
std::string disagreement(int rank, int size, const int64_t* records, size_t stride);

}  // namespace c10d::pg
