// The collective algorithms over the step protocol (see collectives.h; the template ones are
// in collectives_inl.h).
#include "c10d/backends/shm/collectives.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "c10d/backends/shm/alias.h"
#include "c10d/core/clock.h"
#include "c10d/core/env.h"
#include "c10d/core/reduce.h"
#include "c10d/pg/backend.h"

namespace c10d::backends::shm::algo {

using core::DistBackendError;
using core::DistTimeoutError;
using core::DType;
using core::now_ns;
using core::ReduceOp;
using core::detail::str_cat;
using detail::ceil_div;
using detail::copy;
using detail::kBroadcastMidEndBytes;
using detail::kModeLargeChunks;
using detail::kOneShotBytes;
using detail::kPathProbeBytes;
using detail::kPipelineChunk;
using detail::kPublishBlock;
using detail::kZeroCopyPiece;
using detail::piece_of;
using pg::Millis;

namespace {

// Rank 0's verdict in a monitored barrier's step: passed, or the first rank that did not
// arrive (kMonitoredFirstMissing + its rank).
constexpr uint64_t kMonitoredPassed = 1;
constexpr uint64_t kMonitoredFirstMissing = 2;

}  // namespace

void monitored_barrier(StepChannel& ch, bool wait_all_ranks, Millis monitored) {
  const int rank = ch.rank();
  const int size = ch.size();
  Segment& seg = ch.seg();
  const uint32_t s = ch.next_step();
  if (rank != 0) {
    ch.publish(s);
    try {
      ch.wait_peer(0, s);
    } catch (const DistTimeoutError&) {
      ch.fail<DistTimeoutError>(pg::monitored_barrier_unreleased(rank, ch.timeout()));
    } catch (const DistBackendError& e) {
      if (ch.aborted()) throw;
      ch.fail<DistBackendError>(
          str_cat(pg::monitored_barrier_failure_on(rank), " (", e.what(), ")"));
    }
    ch.complete(s, false);
    const uint64_t verdict = ch.rank0_word(s);
    if (verdict == kMonitoredPassed) return;
    ch.fail<DistBackendError>(
        str_cat(pg::monitored_barrier_failure_on(rank), " (rank 0: ",
                pg::monitored_barrier_missing({static_cast<int>(verdict - kMonitoredFirstMissing)},
                                              monitored),
                ")"));
  }
  try {
    for (int r = 1; r < size; ++r) ch.wait_peer(r, s);
    ch.rank0_word(s) = kMonitoredPassed;
    ch.finish_step(s, false);
    ch.complete(s, true);
    return;
  } catch (const DistTimeoutError&) {
  } catch (const DistBackendError&) {
    // A peer that exited is reported as not arriving; other failures (a mismatched
    // operation, a shutdown) stand as they are.
    const std::vector<int> missing = ch.not_arrived(s);
    if (ch.aborted() || std::none_of(missing.begin(), missing.end(), [&](int r) {
          return r != rank && !seg.peer_gone(r).empty();
        })) {
      throw;
    }
  }
  std::vector<std::string> gone(size);
  for (bool waiting = true; waiting;) {
    waiting = false;
    for (int r : ch.not_arrived(s)) {
      if (r == rank || !gone[r].empty()) continue;
      gone[r] = seg.peer_gone(r);
      waiting = waiting || (wait_all_ranks && gone[r].empty());
    }
    if (waiting && (ch.deadline_expired() || ch.aborted())) break;
    if (waiting) ::usleep(1000);
  }
  std::vector<int> missing = ch.not_arrived(s);
  std::erase(missing, rank);
  // The verdict for the ranks that arrived, and for those that still will (the last ones
  // may have come in just after the deadline).
  ch.rank0_word(s) = missing.empty() ? kMonitoredPassed
                                     : kMonitoredFirstMissing + static_cast<uint64_t>(missing[0]);
  ch.finish_step(s, false);
  if (missing.empty()) return;
  if (!wait_all_ranks && missing.size() > 1) missing.resize(1);
  std::string why;
  for (int r : missing) {
    if (!gone[r].empty()) why += str_cat(why.empty() ? " (" : "; ", "rank ", r, " ", gone[r]);
  }
  if (!why.empty()) why += ")";
  const std::string message = pg::monitored_barrier_missing(missing, ch.timeout()) + why;
  if (why.empty()) ch.fail<DistTimeoutError>(message);
  ch.fail<DistBackendError>(message);
}

void broadcast(StepChannel& ch, char* data, size_t bytes, DType dtype, int root) {
  const int rank = ch.rank();
  const int size = ch.size();
  detail::SharedWriter& copy_shared = ch.writer();
  ch.expect_moved(bytes, dtype, root);
  if (ch.nothing_to_move(bytes) || size == 1) return;
  if (bytes > kOneShotBytes) {
    // A root tensor mostly in the shared heap (or adopted into it) is read in place by every
    // other rank; a large one elsewhere is read through the kernel.
    const std::vector<StepChannel::Where>& where = ch.locate(data, bytes);
    if (StepChannel::mostly_mapped(where[root], bytes) || ch.direct_fanout(bytes) ||
        ch.direct_mid(bytes, kBroadcastMidEndBytes)) {
      if (rank != root) ch.read_range(where[root], root, data, 0, bytes);
      ch.sync_after_reads();  // the root's tensor must not change while peers read it
      return;
    }
  }
  // One-sided but for the last step: the root publishes a chunk and moves on while the
  // others read the one before; the others wait only for the root.
  const bool small = ch.fits_ring(bytes);
  const bool boxed = ch.fits_mailbox(bytes);
  for (size_t off = 0; off < bytes; off += kPipelineChunk) {
    const size_t len = std::min(kPipelineChunk, bytes - off);
    const uint32_t s = ch.next_step(small, true);
    if (rank == root) {
      copy_shared(ch.step_data(rank, s, small, boxed), data + off, len);
      if (boxed) ch.seal_mailbox(s, len);
    } else {
      ch.wait_step_data(root, s, boxed);
      copy(data + off, ch.step_data(root, s, small, boxed), len);
    }
    ch.finish_step(s, off + len == bytes);
  }
}

void allreduce(StepChannel& ch, const char* in, char* out, size_t count, DType dtype,
               const ReduceOp& op, int root, bool premul_done) {
  const int rank = ch.rank();
  const int size = ch.size();
  Segment& seg = ch.seg();
  ch.expect(count, dtype, root, op.kind);
  const bool everyone = root < 0;
  if (ch.nothing_to_move(count)) return;
  const size_t es = core::element_size(dtype);
  const size_t bytes = count * es;
  const bool premul = !premul_done && op.kind == ReduceOp::PREMUL_SUM;
  if (size == 1) {
    if (out == nullptr) return;
    copy(out, in, bytes);
    if (premul) core::apply_premul(out, count, dtype, op);
    core::apply_postdiv(out, count, dtype, op, size);
    return;
  }
  if (bytes <= kOneShotBytes) return one_shot(ch, in, out, count, dtype, op, premul);
  if (everyone && in == out) {
    // Owner computes on the tensors themselves when every rank's lies in its shared heap,
    // or mostly does (aliases), unless rank 0 timed the slots faster at this size; and, for
    // large tensors, through the kernel.
    ModeProbe* probe = rank == 0 && bytes < kPathProbeBytes ? &ch.path_probe(bytes) : nullptr;
    const int64_t start = probe != nullptr && probe->wants_time() ? now_ns() : 0;
    const std::vector<StepChannel::Where>& where =
        ch.locate(out, bytes, probe != nullptr ? probe->mode() : 0);
    const bool in_place = ch.all_mapped(where) || (seg.cma() && ch.mostly_mapped(where, bytes));
    if (in_place) {
      const int path = ch.located_path();
      if (path == StepChannel::kPathSlots) {
        pipelined(ch, in, out, count, dtype, op, premul);
      } else {
        owner_computes(ch, where, out, count, dtype, op, premul);
      }
      if (probe == nullptr) return;
      if (start == 0) return probe->skip();
      const int64_t now = now_ns();
      if (probe->record(static_cast<double>(now - start) / static_cast<double>(bytes), now, bytes,
                        path, now - start) &&
          core::log_enabled(core::LogLevel::kDebug)) {
        core::log(
            core::LogLevel::kDebug,
            str_cat("shm path probe: allreduce of ", bytes, " bytes keeps ",
                    probe->mode() == StepChannel::kPathSlots ? "the slots" : "owner computes"));
      }
      return;
    }
    if (seg.cma() && bytes >= ch.direct_allreduce_bytes()) {
      return owner_computes(ch, where, out, count, dtype, op, premul);
    }
  }
  pipelined(ch, in, out, count, dtype, op, premul);
}

void reduce_scatter_flat(StepChannel& ch, const char* in, char* out, size_t count, DType dtype,
                         const ReduceOp& op) {
  const size_t block = count * core::element_size(dtype);
  reduce_scatter(
      ch, [&](int j) { return in + j * block; }, out, count, dtype, op);
}

void alltoall_equal(StepChannel& ch, const char* in, char* out, size_t bytes, DType dtype) {
  const int size = ch.size();
  ch.scratch().equal_send.resize(size);
  ch.scratch().equal_recv.resize(size);
  ch.scratch().equal_lens.assign(size, bytes);
  for (int j = 0; j < size; ++j) {
    ch.scratch().equal_send[j] = in + j * bytes;
    ch.scratch().equal_recv[j] = out + j * bytes;
  }
  alltoall(ch, ch.scratch().equal_send, ch.scratch().equal_lens, ch.scratch().equal_recv,
           ch.scratch().equal_lens, dtype);
}

namespace {

// alltoall's direct path reads a peer's parts in place where they lie in its heap or an
// alias (adopted arrays): each rank publishes the span its send parts cover and the part of
// it that is mapped (base address, heap offset or -1, lo, hi, the span's length); without
// `look_up`, none (heap offset -1).
constexpr int kSpanWords = 5;

void publish_span(StepChannel& ch, const std::vector<const char*>& send,
                  const std::vector<size_t>& send_len, bool look_up, int64_t* words) {
  uintptr_t lo = UINTPTR_MAX;
  uintptr_t hi = 0;
  for (int j = 0; j < ch.size(); ++j) {
    if (j == ch.rank() || send_len[j] == 0) continue;
    lo = std::min(lo, reinterpret_cast<uintptr_t>(send[j]));
    hi = std::max(hi, reinterpret_cast<uintptr_t>(send[j]) + send_len[j]);
  }
  words[0] = static_cast<int64_t>(lo);
  words[1] = -1;
  words[4] = hi > lo ? static_cast<int64_t>(hi - lo) : 0;
  if (hi <= lo || !look_up) return;
  const AliasedPart part = mapped_part(ch.seg(), reinterpret_cast<const char*>(lo), hi - lo);
  if (part.hi <= part.lo) return;
  words[1] = static_cast<int64_t>(part.heap_offset);
  words[2] = static_cast<int64_t>(part.lo);
  words[3] = static_cast<int64_t>(part.hi);
}

// Whether every rank's span is mostly mapped here, so that the direct path reads it in place
// whatever its size (the same answer on every rank: all see the same tables of step s).
bool spans_mapped(StepChannel& ch, uint32_t s) {
  for (int j = 0; j < ch.size(); ++j) {
    const auto* words = reinterpret_cast<const int64_t*>(ch.seg().meta(j, s)) + 2 * ch.size();
    if (words[4] == 0) continue;  // sends nothing to the others
    if (words[1] < 0 || 2 * (words[3] - words[2]) < words[4]) return false;
  }
  return true;
}

// Rank j's span (publish_span) as a Where.
StepChannel::Where span_of(StepChannel& ch, int j, const int64_t* words) {
  StepChannel::Where w;
  w.address = static_cast<uint64_t>(words[0]);
  if (words[1] >= 0) {
    w.part = ch.seg().heap(j) + words[1];
    w.lo = static_cast<size_t>(words[2]);
    w.hi = static_cast<size_t>(words[3]);
  }
  return w;
}

}  // namespace

void alltoall(StepChannel& ch, const std::vector<const char*>& send,
              const std::vector<size_t>& send_len, const std::vector<char*>& recv,
              const std::vector<size_t>& recv_len, DType dtype) {
  const int rank = ch.rank();
  const int size = ch.size();
  Segment& seg = ch.seg();
  detail::SharedWriter& copy_shared = ch.writer();
  // Sizes differ by rank (the size table below checks them); the dtype must not.
  ch.expect(0, dtype);
  // Step 1: everyone learns every send size (and so the number of rounds).
  // With the sizes go the send addresses, for the direct path, and small parts themselves:
  // a rank whose parts all fit `small` writes them too, and when every rank did (each sees
  // all sizes) this step is the whole exchange.
  copy_shared.select(std::accumulate(send_len.begin(), send_len.end(), size_t{0}),
                     ch.agreed_mode());
  const bool addresses = seg.cma() && 2 * size + kSpanWords <= kMaxRanks;
  const size_t quota = kSlotBytes / size / kLine * kLine;
  const size_t small = std::min(quota, kOneShotBytes);
  uint32_t s = ch.next_step();
  auto* table = reinterpret_cast<uint64_t*>(seg.meta(rank, s));
  for (int j = 0; j < size; ++j) table[j] = send_len[j];
  // Parts that all fit the first step are sent with it: their span is not worth a lookup.
  const bool fits_first = *std::max_element(send_len.begin(), send_len.end()) <= small;
  if (addresses) {
    for (int j = 0; j < size; ++j) table[size + j] = reinterpret_cast<uint64_t>(send[j]);
    publish_span(ch, send, send_len, !fits_first, reinterpret_cast<int64_t*>(table + 2 * size));
  }
  if (fits_first) {
    for (int j = 0; j < size; ++j) {
      if (j != rank) copy_shared(seg.in(rank, s) + j * quota, send[j], send_len[j]);
    }
  }
  ch.sync(s);
  std::vector<size_t>& incoming = ch.scratch().incoming;
  incoming.resize(size);
  size_t longest = 0;
  for (int i = 0; i < size; ++i) {
    const auto* t = reinterpret_cast<const uint64_t*>(seg.meta(i, s));
    for (int j = 0; j < size; ++j) longest = std::max<size_t>(longest, t[j]);
    incoming[i] = t[rank];
  }
  std::string mismatch;
  for (int j = 0; j < size; ++j) {
    if (incoming[j] != recv_len[j] && mismatch.empty()) {
      mismatch = str_cat(ch.describe(), ": rank ", j, " sends ", incoming[j],
                         " bytes but this rank expects ", recv_len[j]);
    }
  }
  copy(recv[rank], send[rank], std::min(send_len[rank], recv_len[rank]));
  if (longest <= small) {
    for (int j = 0; j < size; ++j) {
      const size_t n = std::min(incoming[j], recv_len[j]);
      if (j != rank) copy(recv[j], seg.in(j, s) + rank * quota, n);
    }
    if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
    return;
  }
  if (addresses && (ch.direct(longest) || ch.direct_mid(longest) || spans_mapped(ch, s))) {
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      const auto* t = reinterpret_cast<const uint64_t*>(seg.meta(j, s));
      const StepChannel::Where w = span_of(ch, j, reinterpret_cast<const int64_t*>(t + 2 * size));
      ch.read_range(w, j, recv[j], t[size + rank] - w.address, std::min(incoming[j], recv_len[j]));
    }
    ch.sync_after_reads();  // send buffers must not change while peers read them
    if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
    return;
  }
  for (size_t off = 0; off < longest && size > 1; off += quota) {
    s = ch.next_step();
    for (int j = 0; j < size; ++j) {
      if (j == rank || send_len[j] <= off) continue;
      copy_shared(seg.in(rank, s) + j * quota, send[j] + off, std::min(quota, send_len[j] - off));
    }
    ch.sync(s);
    for (int j = 0; j < size; ++j) {
      const size_t n = std::min(incoming[j], recv_len[j]);
      if (j == rank || n <= off) continue;
      copy(recv[j] + off, seg.in(j, s) + rank * quota, std::min(quota, n - off));
    }
  }
  if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
}

void calibrate(StepChannel& ch, Millis timeout) {
  std::vector<float> data;  // only when the channel times (not when it remembers a verdict)
  ch.calibrate(timeout, [&](bool large_chunks) {
    if (data.empty()) data.assign(detail::kCalibrationBytes / sizeof(float), 1.0f);
    char* bytes = reinterpret_cast<char*>(data.data());
    pipelined(ch, bytes, bytes, data.size(), DType::kFloat32, ReduceOp(ReduceOp::MAX), false,
              large_chunks);
  });
}

// ---------------------------------------------------------------------------------------------
// The allreduce algorithms

void one_shot(StepChannel& ch, const char* in, char* out, size_t count, DType dtype,
              const ReduceOp& op, bool premul) {
  const int rank = ch.rank();
  detail::SharedWriter& copy_shared = ch.writer();
  const size_t bytes = count * core::element_size(dtype);
  if (ch.fits_mailbox(bytes)) return one_shot_mailbox(ch, in, out, count, dtype, op, premul);
  const bool small = ch.fits_ring(bytes);
  const uint32_t s = ch.next_step(small);
  char* mine = ch.slot(rank, s, small);
  copy_shared(mine, in, bytes);
  if (premul) core::apply_premul(mine, count, dtype, op);
  if (out == nullptr) return ch.finish_step(s, true);  // reduce: only the root reads
  ch.sync(s);
  reduce_sources(ch, out, count, dtype, op, [&](int r) { return ch.slot(r, s, small); });
}

// one_shot for messages that fit a Mailbox: every rank writes its contribution and the step
// into its mailbox line, then publishes the step as usual; the peers spin on that line, so
// the data comes with the step. A peer not there within the spins is waited for as usual
// (wait_peer: deadlines, dead peers, sleeping), after which its mailbox holds the step.
// Ranks without `out` (reduce's non-roots) only write.
void one_shot_mailbox(StepChannel& ch, const char* in, char* out, size_t count, DType dtype,
                      const ReduceOp& op, bool premul) {
  const int rank = ch.rank();
  const int size = ch.size();
  const size_t bytes = count * core::element_size(dtype);
  const uint32_t s = ch.next_step(true);
  char* mine = ch.mailbox_data(rank, s);
  std::memcpy(mine, in, bytes);
  if (premul) core::apply_premul(mine, count, dtype, op);
  ch.seal_mailbox(s, bytes);
  if (out == nullptr) return ch.finish_step(s, true);
  ch.publish(s);
  for (int r = 0; r < size; ++r) {
    if (r != rank) ch.await_mailbox(r, s);
  }
  ch.complete(s, true);
  reduce_sources(ch, out, count, dtype, op, [&](int r) { return ch.mailbox_data(r, s); });
  ch.claim_next_mailbox();
}

// Chunks of ch.small_chunk() bytes: at step k every rank copies in chunk k and, after the
// barrier, copies out the reduced pieces of chunk k-1 and reduces its own piece of chunk k
// into its out area of the next parity. One barrier per chunk. A rank's own piece stays out of
// the slots: it reduces it straight from its input into its output (and then publishes it in
// its out area), so only the peers' pieces are copied in and out. With PREMUL_SUM, whose
// scaling is applied to the slot copies, every piece goes through the slots.
//
// The chunks are kSlotBytes large if `large` (calibrate) or else if the ranks agreed on that
// in the previous pipelined allreduce: rank 0 proposes the mode of the next one (chunks and
// stores, SharedWriter::select) in this one's first step, and every rank reads it after
// the sync.
void pipelined(StepChannel& ch, const char* in, char* out, size_t count, DType dtype,
               const ReduceOp& op, bool premul, std::optional<bool> large) {
  const int rank = ch.rank();
  const int size = ch.size();
  Segment& seg = ch.seg();
  detail::SharedWriter& copy_shared = ch.writer();
  const bool own_direct = !premul;
  const size_t es = core::element_size(dtype);
  const bool large_chunks = large.value_or((ch.agreed_mode() & kModeLargeChunks) != 0);
  const size_t chunk = (large_chunks ? kSlotBytes : ch.small_chunk()) / es;
  const size_t chunks = ceil_div(count, chunk);
  for (size_t k = 0; k <= chunks; ++k) {
    const uint32_t s = ch.next_step();
    const bool agree = k == 0 && !large.has_value();
    if (agree && rank == 0) ch.rank0_word(s) = static_cast<uint64_t>(copy_shared.proposal());
    const size_t off = k * chunk;
    const size_t e = k < chunks ? std::min(chunk, count - off) : 0;
    size_t b = 0, len = 0;  // this rank's piece of chunk k
    if (e != 0) piece_of(e, size, es, rank, b, len);
    if (e != 0) {
      char* slot = seg.in(rank, s);
      const char* src = in + off * es;
      if (own_direct && ch.pinned_to_shared_cpus()) {
        // Each peer's piece goes to that peer alone: a rank on this CPU reads it from the
        // caches, so it never takes streaming stores (see shares_cpu).
        for (int j = 0; j < size; ++j) {
          if (j == rank) continue;
          size_t pb, plen;
          piece_of(e, size, es, j, pb, plen);
          if (ch.shares_cpu(j)) {
            copy_shared.same_cpu(slot + pb * es, src + pb * es, plen * es);
          } else {
            copy_shared(slot + pb * es, src + pb * es, plen * es);
          }
        }
      } else if (own_direct) {
        copy_shared(slot, src, b * es);
        copy_shared(slot + (b + len) * es, src + (b + len) * es, (e - b - len) * es);
      } else {
        copy_shared(slot, src, e * es);
        if (premul) core::apply_premul(slot, e, dtype, op);
      }
    }
    ch.sync(s);
    if (agree) ch.set_agreed_mode(static_cast<int>(ch.rank0_word(s)));
    if (k >= 1 && out != nullptr) {
      const size_t prev_off = (k - 1) * chunk;
      const size_t prev_e = std::min(chunk, count - prev_off);
      for (int j = 0; j < size; ++j) {
        if (own_direct && j == rank) continue;  // already in place
        size_t pb, plen;
        piece_of(prev_e, size, es, j, pb, plen);
        copy(out + (prev_off + pb) * es, seg.out(j, s) + pb * es, plen * es);
      }
    }
    if (len == 0) continue;
    // Operands in a fixed order (this rank's, then the peers' by rank); each piece is
    // reduced by one rank only, so every rank gets identical bits.
    const char* mine = own_direct ? in + (off + b) * es : seg.in(rank, s) + b * es;
    char* published = seg.out(rank, s + 1) + b * es;
    char* dst = own_direct && out != nullptr ? out + (off + b) * es : published;
    if (out == nullptr && copy_shared.streaming()) {
      // The piece is only for the peers (reduce's non-roots): with streaming stores it
      // goes out through them too, from a private buffer, instead of by the reduction's
      // plain stores into lines the root just read (those cost several times more while the
      // host keeps the vCPUs apart: see docs/design/shm.md#streaming-stores-and-placement).
      if (ch.scratch().bytes.size() < len * es) ch.scratch().bytes.resize(len * es);
      dst = ch.scratch().bytes.data();
    }
    // Reduced in place when this rank keeps no result (reduce's non-roots, PREMUL_SUM).
    // Otherwise the piece goes on to `published` block by block, each copied while it is
    // still in L1 (kPublishBlock), except with streaming stores, whose fence per copy
    // would then come every few microseconds.
    const bool publish = dst != published;
    const size_t block = publish && !copy_shared.streaming() ? kPublishBlock / es : len;
    for (size_t o = 0; o < len; o += block) {
      const size_t n = std::min(block, len - o);
      reduce_sources(ch, dst + o * es, n, dtype, op, [&](int j) {
        // This rank's operand first, then the peers' by rank.
        return (j == 0 ? mine : seg.in(j <= rank ? j - 1 : j, s) + b * es) + o * es;
      });
      if (publish) copy_shared(published + o * es, dst + o * es, n * es);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The direct paths

// Owner computes on the ranks' own tensors (`where`, from locate), pulling only: rank r
// reduces piece r of every peer's tensor into its own, then, after a step, copies every other
// piece from its owner's tensor into its own. No rank ever writes into a peer's memory, so a
// peer that resumes after this rank gave up on the operation cannot touch it. Reads come in
// place where the peer's tensor is mapped here (shared heap, aliases), through the kernel
// elsewhere: one copy in and one copy out per byte of the piece, and no slot in between.
void owner_computes(StepChannel& ch, const std::vector<StepChannel::Where>& where, char* data,
                    size_t count, DType dtype, const ReduceOp& op, bool premul) {
  const int rank = ch.rank();
  const int size = ch.size();
  const size_t es = core::element_size(dtype);
  const bool mapped = ch.mostly_mapped(where, count * es);
  const size_t per = std::max<size_t>(1, (mapped ? kZeroCopyPiece : ch.direct_piece()) / es);
  if (ch.scratch().bytes.size() < per * es) ch.scratch().bytes.resize(per * es);
  size_t b, len;
  piece_of(count, size, es, rank, b, len);
  for (size_t at = b; at < b + len; at += per) {
    const size_t m = std::min(per, b + len - at);
    const size_t off = at * es, n = m * es;
    char* acc = data + off;
    // PREMUL_SUM scales every input before the sum, as the other paths do: scaling the sum
    // instead overflows where the scaled inputs do not (float16, factor 1/n).
    if (premul) core::apply_premul(acc, m, dtype, op);
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      const StepChannel::Where& w = where[j];
      const char* theirs = ch.scratch().bytes.data();
      if (!premul && w.part != nullptr && off >= w.lo && off + n <= w.hi) {
        theirs = w.part + (off - w.lo);
      } else {
        ch.read_range(w, j, ch.scratch().bytes.data(), off, n);
        if (premul) core::apply_premul(ch.scratch().bytes.data(), m, dtype, op);
      }
      core::reduce(acc, theirs, m, dtype, op);
    }
    core::apply_postdiv(acc, m, dtype, op, size);
  }
  ch.sync(ch.next_step());  // every piece is reduced in its owner's tensor
  // Starting with the next rank's piece spreads the readers over the owners.
  for (int k = 1; k < size; ++k) {
    const int j = (rank + k) % size;
    piece_of(count, size, es, j, b, len);
    if (len != 0) ch.read_range(where[j], j, data + b * es, b * es, len * es);
  }
  ch.sync_after_reads();  // nobody changes its tensor while a peer may still read it
}

}  // namespace c10d::backends::shm::algo
