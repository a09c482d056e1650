// Engine's direct paths: collectives that read the peers' own buffers, in place where they are
// mapped here (the shared heap, aliases) and through the kernel elsewhere (cross-memory attach),
// instead of copying through the slots (see engine.h).
#include "c10d/backends/shm/engine.h"

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "c10d/backends/shm/alias.h"
#include "c10d/core/reduce.h"

namespace c10d::backends::shm {

using core::DistBackendError;
using core::DType;
using core::ReduceOp;
using core::detail::str_cat;
using detail::copy;
using detail::kDirectAllreduceFarBytes;
using detail::kZeroCopyPiece;
using detail::piece_of;

// One two-sided step in which every rank publishes where [data, data + bytes) is.
// The result lives in the engine (valid until the next locate).
// The same step also hands every rank rank 0's view of the placement (located_far_).
const std::vector<Engine::Where>& Engine::locate(const void* data, size_t bytes, int path) {
  const uint32_t s = next_step();
  auto* meta = reinterpret_cast<int64_t*>(seg_.meta(rank_, s));
  meta[0] = seg_.heap_offset(data, bytes);
  meta[1] = static_cast<int64_t>(reinterpret_cast<uint64_t>(data));
  if (rank_ == 0) meta[2] = (far_ ? 1 : 0) | (path << 1);
  const AliasedPart part = meta[0] >= 0 ? AliasedPart{} : find_alias(seg_, data, bytes);
  meta[3] = part.hi > part.lo ? static_cast<int64_t>(part.heap_offset) : -1;
  meta[4] = static_cast<int64_t>(part.lo);
  meta[5] = static_cast<int64_t>(part.hi);
  sync(s);
  std::vector<Where>& where = where_;
  where.assign(size_, Where{});
  for (int r = 0; r < size_; ++r) {
    const auto* m = reinterpret_cast<const int64_t*>(seg_.meta(r, s));
    Where& w = where[r];
    w.address = static_cast<uint64_t>(m[1]);
    if (m[0] >= 0) {
      w.mapped = w.part = seg_.heap(r) + m[0];
      w.hi = bytes;
    } else if (m[3] >= 0) {
      w.lo = static_cast<size_t>(m[4]);
      w.hi = static_cast<size_t>(m[5]);
      w.part = seg_.heap(r) + m[3];
    }
  }
  const int64_t handed = reinterpret_cast<const int64_t*>(seg_.meta(0, s))[2];
  located_far_ = (handed & 1) != 0;
  located_path_ = static_cast<int>(handed >> 1);
  return where;
}

// From this size an allreduce of ordinary tensors goes through the kernel (right after
// locate: every rank then holds the same located_far_, so every rank takes the same path).
size_t Engine::direct_allreduce_bytes() const {
  return located_far_ ? std::min(direct_allreduce_, kDirectAllreduceFarBytes) : direct_allreduce_;
}

// The probe of allreduces of `bytes` (one per power of two from kOneShotBytes).
ModeProbe& Engine::path_probe(size_t bytes) {
  const size_t k = std::bit_width(bytes) - std::bit_width(detail::kOneShotBytes);
  return path_probes_[std::min(k, path_probes_.size() - 1)];
}

// Copies rank r's buffer (`where`) into `dst`: from the mapping if there is one, else
// through the kernel.
void Engine::fetch(const Where& where, int r, char* dst, size_t bytes) {
  if (where.mapped != nullptr) return copy(dst, where.mapped, bytes);
  read_from(r, dst, where.address, bytes);
}

// Cross-memory copies that fail as this operation, naming the peer.
void Engine::read_from(int r, void* local, uint64_t remote, size_t bytes) {
  try {
    seg_.read_peer(r, local, remote, bytes);
  } catch (const DistBackendError& e) {
    peer_copy_failed(r, e);
  }
}

void Engine::peer_copy_failed(int r, const DistBackendError& e) {
  const std::string gone = seg_.peer_gone(r);
  if (!gone.empty()) fail<DistBackendError>(str_cat(describe(), ": rank ", r, " ", gone));
  fail<DistBackendError>(str_cat(describe(), ": ", e.what()));
}

// Copies bytes [off, off + n) of rank r's buffer (`w`) into `dst`: what is mapped here from
// the mapping, the rest through the kernel.
void Engine::read_range(const Where& w, int r, char* dst, size_t off, size_t n) {
  size_t lo, hi;
  mapped_span(w, off, n, lo, hi);
  if (lo > off) read_from(r, dst, w.address + off, lo - off);
  if (hi > lo) copy(dst + (lo - off), w.part + (lo - w.lo), hi - lo);
  if (off + n > hi) read_from(r, dst + (hi - off), w.address + hi, off + n - hi);
}

// The mapped bytes [lo, hi) of [off, off + n) in `w` (lo == hi == off + n when none).
void Engine::mapped_span(const Where& w, size_t off, size_t n, size_t& lo, size_t& hi) {
  lo = hi = off + n;
  if (w.part == nullptr) return;
  lo = std::clamp(w.lo, off, off + n);
  hi = std::clamp(w.hi, lo, off + n);
}

// Owner computes on the ranks' own tensors (`where`, from locate), pulling only: rank r
// reduces piece r of every peer's tensor into its own, then, after a step, copies every other
// piece from its owner's tensor into its own. No rank ever writes into a peer's memory, so a
// peer that resumes after this rank gave up on the operation cannot touch it. Reads come in
// place where the peer's tensor is mapped here (shared heap, aliases), through the kernel
// elsewhere: one copy in and one copy out per byte of the piece, and no slot in between.
void Engine::owner_computes(const std::vector<Where>& where, char* data, size_t count, DType dtype,
                            const ReduceOp& op, bool premul) {
  const size_t es = core::element_size(dtype);
  const bool mapped = mostly_mapped(where, count * es);
  const size_t per = std::max<size_t>(1, (mapped ? kZeroCopyPiece : direct_piece_) / es);
  if (scratch_.size() < per * es) scratch_.resize(per * es);
  size_t b, len;
  piece_of(count, size_, es, rank_, b, len);
  for (size_t at = b; at < b + len; at += per) {
    const size_t m = std::min(per, b + len - at);
    const size_t off = at * es, n = m * es;
    char* acc = data + off;
    // PREMUL_SUM scales every input before the sum, as the other paths do: scaling the sum
    // instead overflows where the scaled inputs do not (float16, factor 1/n).
    if (premul) core::apply_premul(acc, m, dtype, op);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      const Where& w = where[j];
      const char* theirs = scratch_.data();
      if (!premul && w.part != nullptr && off >= w.lo && off + n <= w.hi) {
        theirs = w.part + (off - w.lo);
      } else {
        read_range(w, j, scratch_.data(), off, n);
        if (premul) core::apply_premul(scratch_.data(), m, dtype, op);
      }
      core::reduce(acc, theirs, m, dtype, op);
    }
    core::apply_postdiv(acc, m, dtype, op, size_);
  }
  sync(next_step());  // every piece is reduced in its owner's tensor
  // Starting with the next rank's piece spreads the readers over the owners.
  for (int k = 1; k < size_; ++k) {
    const int j = (rank_ + k) % size_;
    piece_of(count, size_, es, j, b, len);
    if (len != 0) read_range(where[j], j, data + b * es, b * es, len * es);
  }
  sync_after_reads();  // nobody changes its tensor while a peer may still read it
}

}  // namespace c10d::backends::shm
