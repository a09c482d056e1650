#include "c10d/backends/shm/p2p.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "c10d/backends/shm/alias.h"
#include "c10d/backends/shm/step_channel.h"
#include "c10d/core/blocking.h"
#include "c10d/core/clock.h"
#include "c10d/core/exception.h"
#include "c10d/pg/backend.h"

namespace c10d::backends::shm {

using core::DistBackendError;
using core::DistTimeoutError;
using core::now_ns;
using core::detail::str_cat;
using detail::copy;
using detail::cpu_relax;
using detail::futex_wait;
using detail::kCheckNs;
using detail::kSleepNs;
using detail::notify;
using pg::Millis;

P2PEngine::P2PEngine(std::shared_ptr<Segment> segment, std::shared_ptr<StepChannel> channel)
    : segment_(std::move(segment)), seg_(*segment_), channel_(std::move(channel)),
      rank_(seg_.rank()), size_(seg_.size()), sends_(size_), incoming_(size_), small_posted_(size_),
      small_read_(size_), small_next_(size_) {}

P2PEngine::~P2PEngine() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& queue : sends_) {
    for (auto& op : queue) withdraw(*op);
  }
}

bool P2PEngine::post(const std::shared_ptr<P2POp>& op) {
  op->whole = op->is_send && op->bytes >= kDirectMessageBytes && seg_.cma();
  std::vector<std::shared_ptr<P2POp>> done;
  bool finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (op->is_send) {
      sends_[op->peer].push_back(op);
    } else if (!claim_unexpected(op, done)) {
      recvs_.push_back(op);
    }
    progress(done, false);
    finished = op->finished;
  }
  complete(done);
  return finished;
}

void P2PEngine::attach(const std::shared_ptr<P2POp>& op, const std::shared_ptr<core::Work>& work,
                       core::Tensor tensor) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!op->finished) {  // whoever finishes it finishes the Work
      op->work = work;
      op->tensor = std::move(tensor);
      return;
    }
  }
  finish(*work, *op, tensor);
}

bool P2PEngine::receiving() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !recvs_.empty();
}

void P2PEngine::wait(const std::shared_ptr<P2POp>& op, Millis caller_timeout) {
  auto advance = [&](bool buffer_offers) {
    std::vector<std::shared_ptr<P2POp>> done;
    bool finished;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      progress(done, buffer_offers);
      finished = op->finished;
    }
    complete(done);
    return finished;
  };
  // Most waits for a small message end at once or after a few spins: no clock read for those
  // (a read costs about as much as the rest of such a wait).
  if (advance(false)) return;
  for (int i = 0; i < channel_->policy().blind_spins; ++i) {
    cpu_relax();
    if (advance(false)) return;
  }
  const core::Deadline caller(caller_timeout);
  {
    // The operation's deadline counts from its first wait that got this far.
    std::lock_guard<std::mutex> lock(mutex_);
    if (!op->deadline_started) {
      op->deadline = core::Deadline(op->timeout);
      op->deadline_started = true;
    }
  }
  FutexWord& bell = seg_.header(rank_)->doorbell;
  const int64_t spin_until = now_ns() + channel_->policy().spin_ns;
  const int64_t yield_until = spin_until + channel_->policy().yield_ns;
  int64_t last_check = 0;
  for (;;) {
    if (advance(now_ns() >= spin_until)) return;
    const int64_t now = now_ns();
    if (now < spin_until) {
      cpu_relax();
      continue;
    }
    core::before_blocking();  // an inline caller holding the GIL lets go of it now
    if (now - last_check >= kCheckNs) {
      last_check = now;
      std::string why;
      bool timed_out = false;
      if (channel_->aborted()) {
        why = "the backend was shut down";
      } else if (op->peer >= 0) {
        if (std::string gone = seg_.peer_gone(op->peer); !gone.empty()) {
          why = str_cat("rank ", op->peer, " ", gone);
        }
      } else {
        std::vector<int> gone;
        for (int r = 0; r < size_; ++r) {
          if (r != rank_ && !seg_.peer_gone(r).empty()) gone.push_back(r);
        }
        if (static_cast<int>(gone.size()) == size_ - 1) {
          why = str_cat("every other rank is gone (", pg::join_ranks(gone), ")");
        }
      }
      if (why.empty() && op->deadline.expired()) {
        why = str_cat("Timed out after ", core::format_timeout(op->timeout));
        timed_out = true;
      }
      if (!why.empty()) {
        const std::string message = str_cat("shm ", describe(*op), " ", why);
        fail(op, timed_out ? std::make_exception_ptr(DistTimeoutError(message))
                           : std::make_exception_ptr(DistBackendError(message)));
        return;
      }
      if (caller.expired()) {
        throw DistTimeoutError(str_cat("shm ", describe(*op), " did not complete within ",
                                       core::format_timeout(caller_timeout),
                                       " (it is still pending)"));
      }
    }
    if (now < yield_until) {
      ::sched_yield();
      continue;
    }
    bell.waiters.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t v = bell.value.load(std::memory_order_relaxed);
    // A peer that published before this rank counted itself did not wake it: look again.
    const bool finished = advance(true);
    if (!finished) futex_wait(&bell.value, v, kSleepNs);
    bell.waiters.fetch_sub(1, std::memory_order_relaxed);
    if (finished) return;
  }
}

std::string P2PEngine::describe(const P2POp& op) const {
  const char* what = op.is_send ? "send" : op.peer >= 0 ? "recv" : "recv_anysource";
  if (op.peer < 0) return str_cat(what, " (tag ", op.tag, ", rank ", rank_, " from any rank)");
  return str_cat(what, " (tag ", op.tag, ", rank ", rank_, op.is_send ? " to" : " from", " rank ",
                 op.peer, ")");
}

std::exception_ptr P2PEngine::mismatch(const P2POp& op, int src, size_t bytes,
                                       core::DType dtype) const {
  return std::make_exception_ptr(DistBackendError(str_cat(
      "shm ", describe(op), ": rank ", src, " sent ", bytes, " bytes of ", core::dtype_name(dtype),
      " for a receive of ", op.bytes, " bytes of ", core::dtype_name(op.dtype))));
}

bool P2PEngine::matches(const P2POp& op, int src, int tag) {
  return (op.peer < 0 || op.peer == src) && op.tag == tag;
}

// Expects mutex_ held. Takes the oldest buffered message that `op` accepts.
bool P2PEngine::claim_unexpected(const std::shared_ptr<P2POp>& op,
                                 std::vector<std::shared_ptr<P2POp>>& done) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    auto& u = **it;
    if (u.claimed || !matches(*op, u.src, u.tag)) continue;
    if (u.complete) {
      deliver(*op, u);
      unexpected_.erase(it);
      done.push_back(op);
    } else {
      u.claimed = op;
    }
    return true;
  }
  return false;
}

void P2PEngine::deliver(P2POp& op, const Unexpected& u) {
  op.source = u.src;
  if (u.data.size() != op.bytes || u.dtype != op.dtype) {
    op.error = mismatch(op, u.src, u.data.size(), u.dtype);
  } else {
    copy(op.data, u.data.data(), op.bytes);
  }
  op.finished = true;
}

// Expects mutex_ held. Moves every channel as far as it goes without waiting.
void P2PEngine::progress(std::vector<std::shared_ptr<P2POp>>& done, bool buffer_offers) {
  for (int d = 0; d < size_; ++d) {
    auto& queue = sends_[d];
    while (!queue.empty()) {
      P2POp& op = *queue.front();
      if (op.whole) {
        if (!progress_offer(d, op)) break;
        done.push_back(queue.front());
        queue.pop_front();
        continue;
      }
      if (op.bytes <= kSmallMessageBytes) {
        if (!post_small(d, op)) break;
        op.finished = true;
        done.push_back(queue.front());
        queue.pop_front();
        continue;
      }
      ChannelCtrl* ch = seg_.channel(rank_, d);
      const uint32_t posted = ch->posted.load(std::memory_order_relaxed);
      if (ch->consumed.load(std::memory_order_acquire) != posted) break;  // slot busy
      if (!op.started && !small_drained(d)) break;
      const size_t len = std::min(kChannelBytes, op.bytes - op.done);
      copy_shared(seg_.channel_data(rank_, d), op.data + op.done, len);
      ch->tag = op.tag;
      ch->bytes = static_cast<uint32_t>(len);
      ch->total = op.bytes;
      ch->offset = op.done;
      ch->address = 0;
      ch->dtype = static_cast<uint8_t>(op.dtype);
      ch->posted.store(posted + 1, std::memory_order_release);
      notify(seg_.header(d)->doorbell);
      op.done += len;
      op.started = true;
      if (op.done == op.bytes) {
        op.finished = true;
        done.push_back(queue.front());
        queue.pop_front();
      }
    }
  }
  for (int src = 0; src < size_; ++src) {
    if (src == rank_) continue;
    ChannelCtrl* ch = seg_.channel(src, rank_);
    take_small(src, ch, buffer_offers, done);
    for (;;) {
      const uint32_t consumed = ch->consumed.load(std::memory_order_relaxed);
      if (ch->posted.load(std::memory_order_acquire) == consumed) break;
      if (ch->address != 0) {
        if (!take_offer(src, ch, consumed, buffer_offers, done)) break;
        continue;
      }
      const int tag = ch->tag;
      const size_t len = ch->bytes;
      const size_t total = ch->total;
      const size_t offset = ch->offset;
      const auto dtype = static_cast<core::DType>(ch->dtype);
      const char* data = seg_.channel_data(src, rank_);
      Incoming& in = incoming_[src];
      if (offset == 0) {
        in = Incoming{};
        for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
          if (!matches(**it, src, tag)) continue;
          in.op = *it;
          recvs_.erase(it);
          break;
        }
        if (in.op) {
          in.op->source = src;
          if (in.op->bytes != total || in.op->dtype != dtype) {
            in.op->error = mismatch(*in.op, src, total, dtype);
            in.discard = true;
          }
        } else {
          in.buffer = std::make_shared<Unexpected>();
          in.buffer->src = src;
          in.buffer->tag = tag;
          in.buffer->dtype = dtype;
          in.buffer->data.resize(total);
          unexpected_.push_back(in.buffer);
        }
      }
      if (in.op && !in.discard) {
        copy(in.op->data + offset, data, len);
      } else if (in.buffer) {
        copy(in.buffer->data.data() + offset, data, len);
      }
      ch->consumed.store(consumed + 1, std::memory_order_release);
      notify(seg_.header(src)->doorbell);
      if (offset + len < total) continue;
      if (in.op) {
        if (!in.op->finished) {
          in.op->finished = true;
          done.push_back(in.op);
        }
      } else if (in.buffer) {
        in.buffer->complete = true;
        if (auto claimed = in.buffer->claimed) {
          deliver(*claimed, *in.buffer);
          unexpected_.erase(std::find(unexpected_.begin(), unexpected_.end(), in.buffer));
          done.push_back(claimed);
        }
      }
      in = Incoming{};
    }
  }
}

bool P2PEngine::small_drained(int d) {
  return seg_.channel(rank_, d)->small_consumed.load(std::memory_order_acquire) == small_posted_[d];
}

bool P2PEngine::post_small(int d, const P2POp& op) {
  ChannelCtrl* ch = seg_.channel(rank_, d);
  // After the chunks before it are read, and while the ring has room.
  if (ch->consumed.load(std::memory_order_acquire) != ch->posted.load(std::memory_order_relaxed)) {
    return false;
  }
  const uint32_t n = small_posted_[d];
  if (n - small_read_[d] == kSmallMessages) {
    small_read_[d] = ch->small_consumed.load(std::memory_order_acquire);
    if (n - small_read_[d] == kSmallMessages) return false;
  }
  SmallMessage& m = ch->small[n % kSmallMessages];
  m.tag = op.tag;
  m.bytes = static_cast<uint32_t>(op.bytes);
  m.dtype = static_cast<uint8_t>(op.dtype);
  std::memcpy(m.data, op.data, op.bytes);
  m.seq.store(n + 1, std::memory_order_release);
  small_posted_[d] = n + 1;
  notify(seg_.header(d)->doorbell);
  return true;
}

void P2PEngine::take_small(int src, ChannelCtrl* ch, bool buffer_offers,
                           std::vector<std::shared_ptr<P2POp>>& done) {
  uint32_t& next = small_next_[src];
  for (;;) {
    const SmallMessage& m = ch->small[next % kSmallMessages];
    if (m.seq.load(std::memory_order_acquire) != next + 1) return;
    const int tag = m.tag;
    // Never past the line, whatever the peer wrote.
    const size_t bytes = std::min<size_t>(m.bytes, kSmallMessageBytes);
    const auto dtype = static_cast<core::DType>(m.dtype);
    auto it = std::find_if(recvs_.begin(), recvs_.end(),
                           [&](const std::shared_ptr<P2POp>& r) { return matches(*r, src, tag); });
    if (it != recvs_.end()) {
      std::shared_ptr<P2POp> op = std::move(*it);
      recvs_.erase(it);
      op->source = src;
      if (op->bytes != bytes || op->dtype != dtype) {
        op->error = mismatch(*op, src, bytes, dtype);
      } else {
        std::memcpy(op->data, m.data, bytes);
      }
      op->done = op->bytes;
      op->finished = true;
      done.push_back(std::move(op));
    } else if (buffer_offers) {
      // Left in the ring unless this thread has waited a while, as offers are: the receive
      // is usually about to be posted. A message behind it may be the one being waited for.
      auto u = std::make_shared<Unexpected>();
      u->src = src;
      u->tag = tag;
      u->dtype = dtype;
      u->data.assign(m.data, m.data + bytes);
      u->got = bytes;
      u->complete = true;
      unexpected_.push_back(std::move(u));
    } else {
      return;
    }
    ++next;
    ch->small_consumed.store(next, std::memory_order_release);
    notify(seg_.header(src)->doorbell);
  }
}

bool P2PEngine::progress_offer(int d, P2POp& op) {
  ChannelCtrl* ch = seg_.channel(rank_, d);
  if (!op.started) {
    const uint32_t posted = ch->posted.load(std::memory_order_relaxed);
    if (ch->consumed.load(std::memory_order_acquire) != posted) return false;  // channel busy
    if (!small_drained(d)) return false;
    ch->tag = op.tag;
    ch->bytes = 0;
    ch->total = op.bytes;
    ch->offset = 0;
    ch->address = reinterpret_cast<uint64_t>(op.data);
    const AliasedPart part = mapped_part(seg_, op.data, op.bytes);
    ch->part_heap = part.hi > part.lo ? static_cast<int64_t>(part.heap_offset) : -1;
    ch->part_lo = part.lo;
    ch->part_hi = part.hi;
    ch->dtype = static_cast<uint8_t>(op.dtype);
    ch->offer.store(ChannelCtrl::kOffered, std::memory_order_relaxed);
    ch->posted.store(posted + 1, std::memory_order_release);
    notify(seg_.header(d)->doorbell);
    op.offered = posted + 1;
    op.started = true;
    return false;
  }
  if (ch->consumed.load(std::memory_order_acquire) != op.offered) return false;
  op.done = op.bytes;
  op.finished = true;
  return true;
}

bool P2PEngine::take_offer(int src, ChannelCtrl* ch, uint32_t consumed, bool buffer_offers,
                           std::vector<std::shared_ptr<P2POp>>& done) {
  const int tag = ch->tag;
  if (!buffer_offers && ch->offer.load(std::memory_order_acquire) == ChannelCtrl::kOffered &&
      std::none_of(recvs_.begin(), recvs_.end(),
                   [&](const std::shared_ptr<P2POp>& r) { return matches(*r, src, tag); })) {
    return false;
  }
  const size_t total = ch->total;
  const auto dtype = static_cast<core::DType>(ch->dtype);
  PeerBuffer message{.address = ch->address};
  if (ch->part_heap >= 0) {
    message.part = seg_.heap(src) + ch->part_heap;
    message.lo = ch->part_lo;
    message.hi = ch->part_hi;
  }
  std::shared_ptr<P2POp> op;
  std::shared_ptr<Unexpected> buffer;
  uint32_t state = ChannelCtrl::kOffered;
  // A sender that gave up withdrew it: there is nothing to read.
  if (ch->offer.compare_exchange_strong(state, ChannelCtrl::kTaken, std::memory_order_acq_rel)) {
    for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
      if (!matches(**it, src, tag)) continue;
      op = *it;
      recvs_.erase(it);
      break;
    }
    char* into = nullptr;
    if (op) {
      op->source = src;
      if (op->bytes != total || op->dtype != dtype) {
        op->error = mismatch(*op, src, total, dtype);
      } else {
        into = op->data;
      }
    } else {
      buffer = std::make_shared<Unexpected>();
      buffer->src = src;
      buffer->tag = tag;
      buffer->dtype = dtype;
      buffer->data.resize(total);
      into = buffer->data.data();
    }
    std::string failed;
    if (into != nullptr) {
      try {
        seg_.read_peer_buffer(src, message, into, 0, total);
      } catch (const DistBackendError& e) {
        failed = e.what();
      }
      // The sender withdraws even an offer being read once it gave up waiting for the read
      // (withdraw): what was read after that may be another owner's bytes.
      if (failed.empty() && ch->offer.load(std::memory_order_acquire) != ChannelCtrl::kTaken) {
        failed = str_cat("rank ", src, " withdrew the message while it was read");
      }
    }
    if (!failed.empty()) {
      if (op)
        op->error =
            std::make_exception_ptr(DistBackendError(str_cat("shm ", describe(*op), ": ", failed)));
      buffer.reset();  // a receive posted later waits for a message that will not come
    }
  }
  ch->consumed.store(consumed + 1, std::memory_order_release);
  notify(seg_.header(src)->doorbell);
  if (op) {
    op->done = op->bytes;
    op->finished = true;
    done.push_back(op);
  } else if (buffer) {
    buffer->got = total;
    buffer->complete = true;
    unexpected_.push_back(buffer);
  }
  return true;
}

void P2PEngine::withdraw(P2POp& op) {
  if (!op.whole || !op.started) return;
  ChannelCtrl* ch = seg_.channel(rank_, op.peer);
  uint32_t state = ChannelCtrl::kOffered;
  if (ch->offer.compare_exchange_strong(state, ChannelCtrl::kWithdrawn,
                                        std::memory_order_acq_rel)) {
    return;  // not taken: the receiver skips it
  }
  // The receiver is reading the buffer: let it finish (a read takes milliseconds), or withdraw
  // anyway after kWithdrawWait, which the receiver notices after its read.
  const int64_t until = now_ns() + kWithdrawWait.count() * 1000000;
  while (ch->consumed.load(std::memory_order_acquire) != op.offered &&
         seg_.peer_gone(op.peer).empty() && now_ns() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (ch->consumed.load(std::memory_order_acquire) != op.offered) {
    ch->offer.store(ChannelCtrl::kWithdrawn, std::memory_order_release);
  }
}

// Fails `op` (deadline, dead peer) and forgets it.
void P2PEngine::fail(const std::shared_ptr<P2POp>& op, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (op->finished) return;
    op->finished = true;
    op->error = error;
    if (op->is_send) {
      withdraw(*op);
      auto& q = sends_[op->peer];
      if (auto it = std::find(q.begin(), q.end(), op); it != q.end()) q.erase(it);
    } else {
      if (auto it = std::find(recvs_.begin(), recvs_.end(), op); it != recvs_.end()) {
        recvs_.erase(it);
      }
      for (auto& u : unexpected_) {
        if (u->claimed == op) u->claimed.reset();
      }
      for (auto& in : incoming_) {
        if (in.op == op) in.discard = true;
      }
    }
  }
  complete({op});
}

void P2PEngine::complete(const std::vector<std::shared_ptr<P2POp>>& ops) {
  for (const auto& op : ops) {
    if (auto work = op->work.lock()) finish(*work, *op, op->tensor);
  }
}

void P2PEngine::finish(core::Work& work, const P2POp& op, const core::Tensor& tensor) {
  try {
    if (!op.is_send && op.source >= 0) work.set_source_rank(op.source);
    if (op.error) {
      work.finish_with_error(op.error);
    } else if (op.is_send) {
      work.finish();  // a send has no outputs
    } else {
      work.finish({tensor});
    }
  } catch (...) {
    // completed already
  }
}

}  // namespace c10d::backends::shm
