// Engine: the collective algorithms over the step protocol (see engine.h; the template ones
// are in collectives_inl.h, the direct paths in direct.cc).
#include "c10d/backends/shm/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "c10d/core/clock.h"
#include "c10d/core/env.h"
#include "c10d/core/reduce.h"
#include "c10d/pg/backend.h"

namespace c10d::backends::shm {

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
using detail::piece_of;
using pg::Millis;

namespace {

// Rank 0's verdict in a monitored barrier's step: passed, or the first rank that did not
// arrive (kMonitoredFirstMissing + its rank).
constexpr uint64_t kMonitoredPassed = 1;
constexpr uint64_t kMonitoredFirstMissing = 2;

}  // namespace

void Engine::monitored_barrier(bool wait_all_ranks, Millis monitored) {
  const uint32_t s = next_step();
  if (rank_ != 0) {
    publish(s);
    try {
      wait_peer(0, s);
    } catch (const DistTimeoutError&) {
      fail<DistTimeoutError>(pg::monitored_barrier_unreleased(rank_, timeout_));
    } catch (const DistBackendError& e) {
      if (aborted_.load()) throw;
      fail<DistBackendError>(str_cat(pg::monitored_barrier_failure_on(rank_), " (", e.what(), ")"));
    }
    step_ = s;
    const uint64_t verdict = rank0_word(s);
    if (verdict == kMonitoredPassed) return;
    fail<DistBackendError>(
        str_cat(pg::monitored_barrier_failure_on(rank_), " (rank 0: ",
                pg::monitored_barrier_missing({static_cast<int>(verdict - kMonitoredFirstMissing)},
                                              monitored),
                ")"));
  }
  try {
    for (int r = 1; r < size_; ++r) wait_peer(r, s);
    rank0_word(s) = kMonitoredPassed;
    finish_step(s, false);
    all_reached_ = s;
    return;
  } catch (const DistTimeoutError&) {
  } catch (const DistBackendError&) {
    // A peer that exited is reported as not arriving; other failures (a mismatched
    // operation, a shutdown) stand as they are.
    const std::vector<int> missing = not_arrived(s);
    if (aborted_.load() || std::none_of(missing.begin(), missing.end(), [&](int r) {
          return r != rank_ && !seg_.peer_gone(r).empty();
        })) {
      throw;
    }
  }
  std::vector<std::string> gone(size_);
  for (bool waiting = true; waiting;) {
    waiting = false;
    for (int r : not_arrived(s)) {
      if (r == rank_ || !gone[r].empty()) continue;
      gone[r] = seg_.peer_gone(r);
      waiting = waiting || (wait_all_ranks && gone[r].empty());
    }
    if (waiting && (deadline_.expired() || aborted_.load())) break;
    if (waiting) ::usleep(1000);
  }
  std::vector<int> missing = not_arrived(s);
  std::erase(missing, rank_);
  // The verdict for the ranks that arrived, and for those that still will (the last ones
  // may have come in just after the deadline).
  rank0_word(s) = missing.empty() ? kMonitoredPassed
                                  : kMonitoredFirstMissing + static_cast<uint64_t>(missing[0]);
  finish_step(s, false);
  if (missing.empty()) return;
  if (!wait_all_ranks && missing.size() > 1) missing.resize(1);
  std::string why;
  for (int r : missing) {
    if (!gone[r].empty()) why += str_cat(why.empty() ? " (" : "; ", "rank ", r, " ", gone[r]);
  }
  if (!why.empty()) why += ")";
  const std::string message = pg::monitored_barrier_missing(missing, timeout_) + why;
  if (why.empty()) fail<DistTimeoutError>(message);
  fail<DistBackendError>(message);
}

void Engine::broadcast(char* data, size_t bytes, DType dtype, int root) {
  expect_moved(bytes, dtype, root);
  if (nothing_to_move(bytes) || size_ == 1) return;
  if (bytes > kOneShotBytes) {
    // A root tensor in the shared heap is read in place by every other rank; a large one
    // elsewhere is read through the kernel.
    const std::vector<Where>& where = locate(data, bytes);
    if (where[root].mapped != nullptr || direct_fanout(bytes) ||
        direct_mid(bytes, kBroadcastMidEndBytes)) {
      if (rank_ != root) fetch(where[root], root, data, bytes);
      sync_after_reads();  // the root's tensor must not change while peers read it
      return;
    }
  }
  // One-sided but for the last step: the root publishes a chunk and moves on while the
  // others read the one before; the others wait only for the root.
  const bool small = fits_ring(bytes);
  const bool boxed = fits_mailbox(bytes);
  for (size_t off = 0; off < bytes; off += kPipelineChunk) {
    const size_t len = std::min(kPipelineChunk, bytes - off);
    const uint32_t s = next_step(small, true);
    if (rank_ == root) {
      copy_shared(step_data(rank_, s, small, boxed), data + off, len);
      if (boxed) seal_mailbox(s, len);
    } else {
      wait_step_data(root, s, boxed);
      copy(data + off, step_data(root, s, small, boxed), len);
    }
    finish_step(s, off + len == bytes);
  }
}

void Engine::allreduce(const char* in, char* out, size_t count, DType dtype, const ReduceOp& op,
                       int root, bool premul_done) {
  expect(count, dtype, root, op.kind);
  const bool everyone = root < 0;
  if (nothing_to_move(count)) return;
  const size_t es = core::element_size(dtype);
  const size_t bytes = count * es;
  const bool premul = !premul_done && op.kind == ReduceOp::PREMUL_SUM;
  if (size_ == 1) {
    if (out == nullptr) return;
    copy(out, in, bytes);
    if (premul) core::apply_premul(out, count, dtype, op);
    core::apply_postdiv(out, count, dtype, op, size_);
    return;
  }
  if (bytes <= kOneShotBytes) return one_shot(in, out, count, dtype, op, premul);
  if (everyone && in == out) {
    // Owner computes on the tensors themselves when every rank's lies in its shared heap,
    // or mostly does (aliases), unless rank 0 timed the slots faster at this size; and, for
    // large tensors, through the kernel.
    ModeProbe* probe = rank_ == 0 && bytes < kPathProbeBytes ? &path_probe(bytes) : nullptr;
    const int64_t start = probe != nullptr && probe->wants_time() ? now_ns() : 0;
    const std::vector<Where>& where = locate(out, bytes, probe != nullptr ? probe->mode() : 0);
    const bool in_place = all_mapped(where) || (seg_.cma() && mostly_mapped(where, bytes));
    if (in_place) {
      const int path = located_path_;
      if (path == kPathSlots) {
        pipelined(in, out, count, dtype, op, premul);
      } else {
        owner_computes(where, out, count, dtype, op, premul);
      }
      if (probe == nullptr) return;
      if (start == 0) return probe->skip();
      const int64_t now = now_ns();
      if (probe->record(static_cast<double>(now - start) / static_cast<double>(bytes), now, bytes,
                        path, now - start) &&
          core::log_enabled(core::LogLevel::kDebug)) {
        core::log(core::LogLevel::kDebug,
                  str_cat("shm path probe: allreduce of ", bytes, " bytes keeps ",
                          probe->mode() == kPathSlots ? "the slots" : "owner computes"));
      }
      return;
    }
    if (seg_.cma() && bytes >= direct_allreduce_bytes()) {
      return owner_computes(where, out, count, dtype, op, premul);
    }
  }
  pipelined(in, out, count, dtype, op, premul);
}

void Engine::reduce_scatter_flat(const char* in, char* out, size_t count, DType dtype,
                                 const ReduceOp& op) {
  const size_t block = count * core::element_size(dtype);
  reduce_scatter([&](int j) { return in + j * block; }, out, count, dtype, op);
}

void Engine::alltoall_equal(const char* in, char* out, size_t bytes, DType dtype) {
  equal_send_.resize(size_);
  equal_recv_.resize(size_);
  equal_lens_.assign(size_, bytes);
  for (int j = 0; j < size_; ++j) {
    equal_send_[j] = in + j * bytes;
    equal_recv_[j] = out + j * bytes;
  }
  alltoall(equal_send_, equal_lens_, equal_recv_, equal_lens_, dtype);
}

void Engine::alltoall(const std::vector<const char*>& send, const std::vector<size_t>& send_len,
                      const std::vector<char*>& recv, const std::vector<size_t>& recv_len,
                      DType dtype) {
  // Sizes differ by rank (the size table below checks them); the dtype must not.
  expect(0, dtype);
  // Step 1: everyone learns every send size (and so the number of rounds).
  // With the sizes go the send addresses, for the direct path, and small parts themselves:
  // a rank whose parts all fit `small` writes them too, and when every rank did (each sees
  // all sizes) this step is the whole exchange.
  copy_shared.select(std::accumulate(send_len.begin(), send_len.end(), size_t{0}), agreed_mode_);
  const bool addresses = seg_.cma() && 2 * size_ <= kMaxRanks;
  const size_t quota = kSlotBytes / size_ / kLine * kLine;
  const size_t small = std::min(quota, kOneShotBytes);
  uint32_t s = next_step();
  auto* table = reinterpret_cast<uint64_t*>(seg_.meta(rank_, s));
  for (int j = 0; j < size_; ++j) table[j] = send_len[j];
  if (addresses) {
    for (int j = 0; j < size_; ++j) table[size_ + j] = reinterpret_cast<uint64_t>(send[j]);
  }
  if (*std::max_element(send_len.begin(), send_len.end()) <= small) {
    for (int j = 0; j < size_; ++j) {
      if (j != rank_) copy_shared(seg_.in(rank_, s) + j * quota, send[j], send_len[j]);
    }
  }
  sync(s);
  std::vector<size_t>& incoming = incoming_;
  incoming.resize(size_);
  size_t longest = 0;
  for (int i = 0; i < size_; ++i) {
    const auto* t = reinterpret_cast<const uint64_t*>(seg_.meta(i, s));
    for (int j = 0; j < size_; ++j) longest = std::max<size_t>(longest, t[j]);
    incoming[i] = t[rank_];
  }
  std::string mismatch;
  for (int j = 0; j < size_; ++j) {
    if (incoming[j] != recv_len[j] && mismatch.empty()) {
      mismatch = str_cat(describe(), ": rank ", j, " sends ", incoming[j],
                         " bytes but this rank expects ", recv_len[j]);
    }
  }
  copy(recv[rank_], send[rank_], std::min(send_len[rank_], recv_len[rank_]));
  if (longest <= small) {
    for (int j = 0; j < size_; ++j) {
      const size_t n = std::min(incoming[j], recv_len[j]);
      if (j != rank_) copy(recv[j], seg_.in(j, s) + rank_ * quota, n);
    }
    if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
    return;
  }
  if (addresses && (direct(longest) || direct_mid(longest))) {
    for (int j = 0; j < size_; ++j) {
      const auto* t = reinterpret_cast<const uint64_t*>(seg_.meta(j, s));
      if (j != rank_) read_from(j, recv[j], t[size_ + rank_], std::min(incoming[j], recv_len[j]));
    }
    sync_after_reads();  // send buffers must not change while peers read them
    if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
    return;
  }
  for (size_t off = 0; off < longest && size_ > 1; off += quota) {
    s = next_step();
    for (int j = 0; j < size_; ++j) {
      if (j == rank_ || send_len[j] <= off) continue;
      copy_shared(seg_.in(rank_, s) + j * quota, send[j] + off, std::min(quota, send_len[j] - off));
    }
    sync(s);
    for (int j = 0; j < size_; ++j) {
      const size_t n = std::min(incoming[j], recv_len[j]);
      if (j == rank_ || n <= off) continue;
      copy(recv[j] + off, seg_.in(j, s) + rank_ * quota, std::min(quota, n - off));
    }
  }
  if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
}

// ---------------------------------------------------------------------------------------------
// The allreduce algorithms

void Engine::one_shot(const char* in, char* out, size_t count, DType dtype, const ReduceOp& op,
                      bool premul) {
  const size_t bytes = count * core::element_size(dtype);
  if (fits_mailbox(bytes)) return one_shot_mailbox(in, out, count, dtype, op, premul);
  const bool small = fits_ring(bytes);
  const uint32_t s = next_step(small);
  char* mine = slot(rank_, s, small);
  copy_shared(mine, in, bytes);
  if (premul) core::apply_premul(mine, count, dtype, op);
  if (out == nullptr) return finish_step(s, true);  // reduce: only the root reads
  sync(s);
  reduce_sources(out, count, dtype, op, [&](int r) { return slot(r, s, small); });
}

// one_shot for messages that fit a Mailbox: every rank writes its contribution and the step
// into its mailbox line, then publishes the step as usual; the peers spin on that line, so
// the data comes with the step. A peer not there within the spins is waited for as usual
// (wait_peer: deadlines, dead peers, sleeping), after which its mailbox holds the step.
// Ranks without `out` (reduce's non-roots) only write.
void Engine::one_shot_mailbox(const char* in, char* out, size_t count, DType dtype,
                              const ReduceOp& op, bool premul) {
  const size_t bytes = count * core::element_size(dtype);
  const uint32_t s = next_step(true);
  char* mine = mailbox_data(rank_, s);
  std::memcpy(mine, in, bytes);
  if (premul) core::apply_premul(mine, count, dtype, op);
  seal_mailbox(s, bytes);
  if (out == nullptr) return finish_step(s, true);
  publish(s);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) await_mailbox(r, s);
  }
  step_ = s;
  all_reached_ = s;
  reduce_sources(out, count, dtype, op, [&](int r) { return mailbox_data(r, s); });
  claim_next_mailbox();
}

// Chunks of small_chunk_ bytes: at step k every rank copies in chunk k and, after the
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
void Engine::pipelined(const char* in, char* out, size_t count, DType dtype, const ReduceOp& op,
                       bool premul, std::optional<bool> large) {
  const bool own_direct = !premul;
  const size_t es = core::element_size(dtype);
  const bool large_chunks = large.value_or((agreed_mode_ & kModeLargeChunks) != 0);
  const size_t chunk = (large_chunks ? kSlotBytes : small_chunk_) / es;
  const size_t chunks = ceil_div(count, chunk);
  for (size_t k = 0; k <= chunks; ++k) {
    const uint32_t s = next_step();
    const bool agree = k == 0 && !large.has_value();
    if (agree && rank_ == 0) rank0_word(s) = static_cast<uint64_t>(copy_shared.proposal());
    const size_t off = k * chunk;
    const size_t e = k < chunks ? std::min(chunk, count - off) : 0;
    size_t b = 0, len = 0;  // this rank's piece of chunk k
    if (e != 0) piece_of(e, size_, es, rank_, b, len);
    if (e != 0) {
      char* slot = seg_.in(rank_, s);
      const char* src = in + off * es;
      if (own_direct && cpu_group_ >= 0) {
        // Each peer's piece goes to that peer alone: a rank on this CPU reads it from the
        // caches, so it never takes streaming stores (see shares_cpu).
        for (int j = 0; j < size_; ++j) {
          if (j == rank_) continue;
          size_t pb, plen;
          piece_of(e, size_, es, j, pb, plen);
          if (shares_cpu(j)) {
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
    sync(s);
    if (agree) agreed_mode_ = static_cast<int>(rank0_word(s));
    if (k >= 1 && out != nullptr) {
      const size_t prev_off = (k - 1) * chunk;
      const size_t prev_e = std::min(chunk, count - prev_off);
      for (int j = 0; j < size_; ++j) {
        if (own_direct && j == rank_) continue;  // already in place
        size_t pb, plen;
        piece_of(prev_e, size_, es, j, pb, plen);
        copy(out + (prev_off + pb) * es, seg_.out(j, s) + pb * es, plen * es);
      }
    }
    if (len == 0) continue;
    // Operands in a fixed order (this rank's, then the peers' by rank); each piece is
    // reduced by one rank only, so every rank gets identical bits.
    const char* mine = own_direct ? in + (off + b) * es : seg_.in(rank_, s) + b * es;
    char* published = seg_.out(rank_, s + 1) + b * es;
    char* dst = own_direct && out != nullptr ? out + (off + b) * es : published;
    if (out == nullptr && copy_shared.streaming()) {
      // The piece is only for the peers (reduce's non-roots): with streaming stores it
      // goes out through them too, from a private buffer, instead of by the reduction's
      // plain stores into lines the root just read (those cost several times more while the
      // host keeps the vCPUs apart: see docs/design/shm.md#streaming-stores-and-placement).
      if (scratch_.size() < len * es) scratch_.resize(len * es);
      dst = scratch_.data();
    }
    // Reduced in place when this rank keeps no result (reduce's non-roots, PREMUL_SUM).
    // Otherwise the piece goes on to `published` block by block, each copied while it is
    // still in L1 (kPublishBlock), except with streaming stores, whose fence per copy
    // would then come every few microseconds.
    const bool publish = dst != published;
    const size_t block = publish && !copy_shared.streaming() ? kPublishBlock / es : len;
    for (size_t o = 0; o < len; o += block) {
      const size_t n = std::min(block, len - o);
      reduce_sources(dst + o * es, n, dtype, op, [&](int j) {
        // This rank's operand first, then the peers' by rank.
        return (j == 0 ? mine : seg_.in(j <= rank_ ? j - 1 : j, s) + b * es) + o * es;
      });
      if (publish) copy_shared(published + o * es, dst + o * es, n * es);
    }
  }
}

}  // namespace c10d::backends::shm
