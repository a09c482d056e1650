// The bodies of the template algorithms (see collectives.h, which includes this file at its end).
#pragma once

#include <algorithm>
#include <cstddef>

#include "c10d/backends/shm/collectives.h"
#include "c10d/core/reduce.h"

namespace c10d::backends::shm::algo {

template <typename Dst>
void allgather(StepChannel& ch, const char* in, size_t bytes, core::DType dtype, Dst&& dst) {
  const int rank = ch.rank();
  const int size = ch.size();
  Segment& seg = ch.seg();
  detail::SharedWriter& copy_shared = ch.writer();
  ch.expect_moved(bytes, dtype);
  if (ch.nothing_to_move(bytes)) return;
  if (bytes > detail::kOneShotBytes && size > 1) {
    // Inputs are read in place when every rank's is mostly in the shared heap (or adopted
    // into it), or through the kernel when large.
    const std::vector<StepChannel::Where>& where = ch.locate(in, bytes);
    if (ch.mostly_mapped(where, bytes) || ch.direct_fanout(bytes) || ch.direct_mid(bytes)) {
      for (int r = 0; r < size; ++r) {
        char* d = dst(r);
        if (d == nullptr) continue;
        if (r == rank) {
          detail::copy(d, in, bytes);
        } else {
          ch.read_range(where[r], r, d, 0, bytes);
        }
      }
      ch.sync_after_reads();  // inputs must not change while peers read them
      return;
    }
  }
  for (size_t off = 0; off < bytes; off += kSlotBytes) {
    const size_t len = std::min(kSlotBytes, bytes - off);
    const uint32_t s = ch.next_step();
    if (size > 1) copy_shared(seg.in(rank, s), in + off, len);
    ch.sync(s);
    for (int r = 0; r < size; ++r) {
      char* d = dst(r);
      if (d != nullptr) detail::copy(d + off, r == rank ? in + off : seg.in(r, s), len);
    }
  }
}

template <typename Out>
void gather(StepChannel& ch, const char* in, size_t bytes, core::DType dtype, int root,
            Out&& out_of) {
  const int rank = ch.rank();
  const int size = ch.size();
  detail::SharedWriter& copy_shared = ch.writer();
  ch.expect_moved(bytes, dtype, root);
  if (ch.nothing_to_move(bytes)) return;
  if (ch.direct_fanout(bytes) && size > 1) {
    return allgather(ch, in, bytes, dtype,
                     [&](int r) { return rank == root ? out_of(r) : nullptr; });
  }
  const bool small = ch.fits_ring(bytes);
  const bool boxed = ch.fits_mailbox(bytes);
  for (size_t off = 0; off < bytes; off += detail::kPipelineChunk) {
    const size_t len = std::min(detail::kPipelineChunk, bytes - off);
    const uint32_t s = ch.next_step(small, true);
    if (rank != root) {
      copy_shared(ch.step_data(rank, s, small, boxed), in + off, len);
      if (boxed) ch.seal_mailbox(s, len);
    } else {
      for (int r = 0; r < size; ++r) {
        if (r == root) {
          detail::copy(out_of(r) + off, in + off, len);
        } else {
          ch.wait_step_data(r, s, boxed);
          detail::copy(out_of(r) + off, ch.step_data(r, s, small, boxed), len);
        }
      }
    }
    ch.finish_step(s, off + len == bytes);
  }
}

template <typename Src>
void scatter(StepChannel& ch, Src&& src_of, char* out, size_t bytes, core::DType dtype, int root) {
  const int rank = ch.rank();
  const int size = ch.size();
  Segment& seg = ch.seg();
  detail::SharedWriter& copy_shared = ch.writer();
  ch.expect_moved(bytes, dtype, root);
  if (ch.nothing_to_move(bytes)) return;
  if ((ch.direct(bytes) || ch.direct_mid(bytes)) && size > 1 && size <= kMaxRanks) {
    // Every rank reads its part from the root's list through the kernel (mid-sized parts
    // too with a core per rank: see docs/design/shm.md#direct-or-slots).
    const uint32_t s = ch.next_step();
    if (rank == root) {
      auto* table = reinterpret_cast<uint64_t*>(seg.meta(rank, s));
      for (int j = 0; j < size; ++j) table[j] = reinterpret_cast<uint64_t>(src_of(j));
    }
    ch.sync(s);
    if (rank == root) {
      detail::copy(out, src_of(rank), bytes);
    } else {
      ch.read_from(root, out, reinterpret_cast<const uint64_t*>(seg.meta(root, s))[rank], bytes);
    }
    ch.sync_after_reads();  // the root's list must not change while peers read it
    return;
  }
  // Every part in one ring entry when they fit, else in rounds of the slot.
  const size_t part = detail::ceil_div(bytes, kLine) * kLine;
  const bool small = ch.fits_ring(part * static_cast<size_t>(size));
  // The parts packed one after another when they fit a mailbox together.
  const bool boxed = ch.fits_mailbox(bytes * static_cast<size_t>(size));
  const size_t quota = boxed ? bytes : small ? part : kSlotBytes / size / kLine * kLine;
  for (size_t off = 0; off < bytes; off += quota) {
    const size_t len = std::min(quota, bytes - off);
    const uint32_t s = ch.next_step(small, true);
    // One-sided, as broadcast: the root fills round k + 1 while the others copy out round k
    // (see docs/design/shm.md#one-sided-steps-and-mailboxes).
    if (rank == root) {
      char* parts = ch.step_data(root, s, small, boxed);
      for (int j = 0; j < size; ++j) {
        if (j != root) copy_shared(parts + j * quota, src_of(j) + off, len);
      }
      if (boxed) ch.seal_mailbox(s, quota * static_cast<size_t>(size));
      detail::copy(out + off, src_of(rank) + off, len);
    } else {
      ch.wait_step_data(root, s, boxed);
      detail::copy(out + off, ch.step_data(root, s, small, boxed) + rank * quota, len);
    }
    ch.finish_step(s, off + len == bytes);
  }
}

template <typename Block>
void reduce_scatter(StepChannel& ch, Block&& block_of, char* out, size_t count, core::DType dtype,
                    const core::ReduceOp& op) {
  const int rank = ch.rank();
  const int size = ch.size();
  Segment& seg = ch.seg();
  detail::SharedWriter& copy_shared = ch.writer();
  ch.expect(count, dtype, -1, op.kind);
  if (ch.nothing_to_move(count)) return;
  const size_t es = core::element_size(dtype);
  const bool premul = op.kind == core::ReduceOp::PREMUL_SUM;
  const size_t quota = kSlotBytes / size / kLine * kLine / es;  // elements per rank per round
  for (size_t off = 0; off < count; off += quota) {
    const size_t m = std::min(quota, count - off);
    const uint32_t s = ch.next_step();
    for (int j = 0; j < size; ++j) {
      char* slot = seg.in(rank, s) + j * quota * es;
      copy_shared(slot, block_of(j) + off * es, m * es);
      if (premul) core::apply_premul(slot, m, dtype, op);
    }
    ch.sync(s);
    char* dst = out + off * es;
    const size_t at = rank * quota * es;
    reduce_sources(ch, dst, m, dtype, op, [&](int j) { return seg.in(j, s) + at; });
  }
}

template <typename Source>
void reduce_sources(StepChannel& ch, char* out, size_t count, core::DType dtype,
                    const core::ReduceOp& op, Source&& source) {
  const int size = ch.size();
  ch.scratch().sources.resize(size);
  for (int j = 0; j < size; ++j) ch.scratch().sources[j] = source(j);
  core::reduce_many(out, ch.scratch().sources.data(), ch.scratch().sources.size(), count, dtype,
                    op);
  core::apply_postdiv(out, count, dtype, op, size);
}

}  // namespace c10d::backends::shm::algo
