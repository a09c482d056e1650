// The bodies of Engine's template collectives (see engine.h, which includes this file at its
// end).
#pragma once

#include <algorithm>
#include <cstddef>

#include "c10d/backends/shm/engine.h"
#include "c10d/core/reduce.h"

namespace c10d::backends::shm {

template <typename Dst>
void Engine::allgather(const char* in, size_t bytes, core::DType dtype, Dst&& dst) {
  expect_moved(bytes, dtype);
  if (nothing_to_move(bytes)) return;
  if (bytes > detail::kOneShotBytes && size_ > 1) {
    // Inputs are read in place when every rank's is in the shared heap, or through the
    // kernel when large.
    const std::vector<Where>& where = locate(in, bytes);
    if (all_mapped(where) || direct_fanout(bytes) || direct_mid(bytes)) {
      for (int r = 0; r < size_; ++r) {
        char* d = dst(r);
        if (d == nullptr) continue;
        if (r == rank_) {
          detail::copy(d, in, bytes);
        } else {
          fetch(where[r], r, d, bytes);
        }
      }
      sync_after_reads();  // inputs must not change while peers read them
      return;
    }
  }
  for (size_t off = 0; off < bytes; off += kSlotBytes) {
    const size_t len = std::min(kSlotBytes, bytes - off);
    const uint32_t s = next_step();
    if (size_ > 1) copy_shared(seg_.in(rank_, s), in + off, len);
    sync(s);
    for (int r = 0; r < size_; ++r) {
      char* d = dst(r);
      if (d != nullptr) detail::copy(d + off, r == rank_ ? in + off : seg_.in(r, s), len);
    }
  }
}

template <typename Out>
void Engine::gather(const char* in, size_t bytes, core::DType dtype, int root, Out&& out_of) {
  expect_moved(bytes, dtype, root);
  if (nothing_to_move(bytes)) return;
  if (direct_fanout(bytes) && size_ > 1) {
    return allgather(in, bytes, dtype, [&](int r) { return rank_ == root ? out_of(r) : nullptr; });
  }
  const bool small = fits_ring(bytes);
  const bool boxed = fits_mailbox(bytes);
  for (size_t off = 0; off < bytes; off += detail::kPipelineChunk) {
    const size_t len = std::min(detail::kPipelineChunk, bytes - off);
    const uint32_t s = next_step(small, true);
    if (rank_ != root) {
      copy_shared(step_data(rank_, s, small, boxed), in + off, len);
      if (boxed) seal_mailbox(s, len);
    } else {
      for (int r = 0; r < size_; ++r) {
        if (r == root) {
          detail::copy(out_of(r) + off, in + off, len);
        } else {
          wait_step_data(r, s, boxed);
          detail::copy(out_of(r) + off, step_data(r, s, small, boxed), len);
        }
      }
    }
    finish_step(s, off + len == bytes);
  }
}

template <typename Src>
void Engine::scatter(Src&& src_of, char* out, size_t bytes, core::DType dtype, int root) {
  expect_moved(bytes, dtype, root);
  if (nothing_to_move(bytes)) return;
  if ((direct(bytes) || direct_mid(bytes)) && size_ > 1 && size_ <= kMaxRanks) {
    // Every rank reads its part from the root's list through the kernel (mid-sized parts
    // too with a core per rank: see docs/design/shm.md#direct-or-slots).
    const uint32_t s = next_step();
    if (rank_ == root) {
      auto* table = reinterpret_cast<uint64_t*>(seg_.meta(rank_, s));
      for (int j = 0; j < size_; ++j) table[j] = reinterpret_cast<uint64_t>(src_of(j));
    }
    sync(s);
    if (rank_ == root) {
      detail::copy(out, src_of(rank_), bytes);
    } else {
      read_from(root, out, reinterpret_cast<const uint64_t*>(seg_.meta(root, s))[rank_], bytes);
    }
    sync_after_reads();  // the root's list must not change while peers read it
    return;
  }
  // Every part in one ring entry when they fit, else in rounds of the slot.
  const size_t part = detail::ceil_div(bytes, kLine) * kLine;
  const bool small = fits_ring(part * static_cast<size_t>(size_));
  // The parts packed one after another when they fit a mailbox together.
  const bool boxed = fits_mailbox(bytes * static_cast<size_t>(size_));
  const size_t quota = boxed ? bytes : small ? part : kSlotBytes / size_ / kLine * kLine;
  for (size_t off = 0; off < bytes; off += quota) {
    const size_t len = std::min(quota, bytes - off);
    const uint32_t s = next_step(small, true);
    // One-sided, as broadcast: the root fills round k + 1 while the others copy out round k
    // (see docs/design/shm.md#one-sided-steps-and-mailboxes).
    if (rank_ == root) {
      char* parts = step_data(root, s, small, boxed);
      for (int j = 0; j < size_; ++j) {
        if (j != root) copy_shared(parts + j * quota, src_of(j) + off, len);
      }
      if (boxed) seal_mailbox(s, quota * static_cast<size_t>(size_));
      detail::copy(out + off, src_of(rank_) + off, len);
    } else {
      wait_step_data(root, s, boxed);
      detail::copy(out + off, step_data(root, s, small, boxed) + rank_ * quota, len);
    }
    finish_step(s, off + len == bytes);
  }
}

template <typename Block>
void Engine::reduce_scatter(Block&& block_of, char* out, size_t count, core::DType dtype,
                            const core::ReduceOp& op) {
  expect(count, dtype, -1, op.kind);
  if (nothing_to_move(count)) return;
  const size_t es = core::element_size(dtype);
  const bool premul = op.kind == core::ReduceOp::PREMUL_SUM;
  const size_t quota = kSlotBytes / size_ / kLine * kLine / es;  // elements per rank per round
  for (size_t off = 0; off < count; off += quota) {
    const size_t m = std::min(quota, count - off);
    const uint32_t s = next_step();
    for (int j = 0; j < size_; ++j) {
      char* slot = seg_.in(rank_, s) + j * quota * es;
      copy_shared(slot, block_of(j) + off * es, m * es);
      if (premul) core::apply_premul(slot, m, dtype, op);
    }
    sync(s);
    char* dst = out + off * es;
    const size_t at = rank_ * quota * es;
    reduce_sources(dst, m, dtype, op, [&](int j) { return seg_.in(j, s) + at; });
  }
}

template <typename Source>
void Engine::reduce_sources(char* out, size_t count, core::DType dtype, const core::ReduceOp& op,
                            Source&& source) {
  sources_.resize(size_);
  for (int j = 0; j < size_; ++j) sources_[j] = source(j);
  core::reduce_many(out, sources_.data(), sources_.size(), count, dtype, op);
  core::apply_postdiv(out, count, dtype, op, size_);
}

}  // namespace c10d::backends::shm
