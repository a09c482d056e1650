// StepChannel's reads of the peers' own buffers, for the algorithms' direct paths: in place
// where they are mapped here (the shared heap, aliases), through the kernel elsewhere
// (cross-memory attach), instead of copying through the slots (see step_channel.h).
#include "c10d/backends/shm/step_channel.h"

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "c10d/backends/shm/alias.h"

namespace c10d::backends::shm {

using core::DistBackendError;
using core::detail::str_cat;
using detail::kDirectAllreduceFarBytes;

// One two-sided step in which every rank publishes where [data, data + bytes) is.
// The result lives in the channel (valid until the next locate).
// The same step also hands every rank rank 0's view of the placement (located_far_).
const std::vector<StepChannel::Where>& StepChannel::locate(const void* data, size_t bytes,
                                                           int path) {
  const uint32_t s = next_step();
  auto* meta = reinterpret_cast<int64_t*>(seg_.meta(rank_, s));
  const AliasedPart part = mapped_part(seg_, data, bytes);
  meta[0] = part.hi > part.lo ? static_cast<int64_t>(part.heap_offset) : -1;
  meta[1] = static_cast<int64_t>(reinterpret_cast<uint64_t>(data));
  if (rank_ == 0) meta[2] = (far_ ? 1 : 0) | (path << 1);
  meta[3] = static_cast<int64_t>(part.lo);
  meta[4] = static_cast<int64_t>(part.hi);
  sync(s);
  std::vector<Where>& where = where_;
  where.assign(size_, Where{});
  for (int r = 0; r < size_; ++r) {
    const auto* m = reinterpret_cast<const int64_t*>(seg_.meta(r, s));
    Where& w = where[r];
    w.address = static_cast<uint64_t>(m[1]);
    if (m[0] >= 0) {
      w.part = seg_.heap(r) + m[0];
      w.lo = static_cast<size_t>(m[3]);
      w.hi = static_cast<size_t>(m[4]);
      if (w.lo == 0 && w.hi == bytes) w.mapped = w.part;  // in the heap, or aliased whole
    }
  }
  const int64_t handed = reinterpret_cast<const int64_t*>(seg_.meta(0, s))[2];
  located_far_ = (handed & 1) != 0;
  located_path_ = static_cast<int>(handed >> 1);
  return where;
}

// From this size an allreduce of ordinary tensors goes through the kernel (right after
// locate: every rank then holds the same located_far_, so every rank takes the same path).
size_t StepChannel::direct_allreduce_bytes() const {
  return located_far_ ? std::min(direct_allreduce_, kDirectAllreduceFarBytes) : direct_allreduce_;
}

// The probe of allreduces of `bytes` (one per power of two from kOneShotBytes).
ModeProbe& StepChannel::path_probe(size_t bytes) {
  const size_t k = std::bit_width(bytes) - std::bit_width(detail::kOneShotBytes);
  return path_probes_[std::min(k, path_probes_.size() - 1)];
}

// Cross-memory copies that fail as this operation, naming the peer.
void StepChannel::read_from(int r, void* local, uint64_t remote, size_t bytes) {
  try {
    seg_.read_peer(r, local, remote, bytes);
  } catch (const DistBackendError& e) {
    peer_copy_failed(r, e);
  }
}

void StepChannel::peer_copy_failed(int r, const DistBackendError& e) {
  const std::string gone = seg_.peer_gone(r);
  if (!gone.empty()) fail<DistBackendError>(str_cat(describe(), ": rank ", r, " ", gone));
  fail<DistBackendError>(str_cat(describe(), ": ", e.what()));
}

void StepChannel::read_range(const Where& w, int r, char* dst, size_t off, size_t n) {
  try {
    seg_.read_peer_buffer(r, w, dst, off, n);
  } catch (const DistBackendError& e) {
    peer_copy_failed(r, e);
  }
}

}  // namespace c10d::backends::shm
