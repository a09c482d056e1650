// GlooBackend's point-to-point operations (posted on unbound buffers, completed when waited on)
// and monitored_barrier, which is built from such messages to and from rank 0.
#include "c10d/backends/gloo/gloo_backend.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "c10d/backends/gloo/internal.h"
#include "c10d/core/exception.h"

namespace c10d::backends::gloo {

using core::data_or_dummy;
using core::DistBackendError;
using core::DistTimeoutError;
using core::OpType;
using core::Tensor;
using core::detail::str_cat;
using detail::is_gloo_timeout;
using detail::kForever;
using detail::resolve_timeout;
using pg::Millis;

namespace {

// Slot prefix of monitored_barrier's messages. Gloo's collectives use prefixes 0x01-0x08 in the
// top byte of the slot and point-to-point slots leave it 0, so this cannot collide.
constexpr uint64_t kMonitoredBarrierPrefix = 0x10;

// Gloo treats a zero-millisecond wait as "no timeout"; never pass it one.
Millis at_least_1ms(Millis timeout) { return std::max(timeout, Millis(1)); }

enum class WaitResult { kDone, kTimedOut, kAborted };

// Waits for the pending send or receive on `buffer` for up to `limit`. Gloo's own timeout is
// not used because it closes every connection of the context ("Application timeout caused pair
// closure"); a watchdog thread aborts the wait instead, leaving the context usable. For the
// rare waits that must survive a timeout (monitored_barrier, Work::wait with a short timeout).
// I/O errors still throw Gloo's exception.
WaitResult wait_or_abort(::gloo::transport::UnboundBuffer& buffer, bool is_send, Millis limit,
                         int* rank = nullptr) {
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  bool fired = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (!cv.wait_for(lock, limit, [&] { return finished; })) {
      fired = true;
      if (is_send) {
        buffer.abortWaitSend();
      } else {
        buffer.abortWaitRecv();
      }
    }
  });
  auto stop_watchdog = [&] {
    {
      std::lock_guard<std::mutex> lock(mutex);
      finished = true;
    }
    cv.notify_one();
    watchdog.join();
  };
  bool done;
  try {
    done = is_send ? buffer.waitSend(rank, kForever) : buffer.waitRecv(rank, kForever);
  } catch (...) {
    stop_watchdog();
    throw;
  }
  stop_watchdog();
  if (done) return WaitResult::kDone;
  return fired ? WaitResult::kTimedOut : WaitResult::kAborted;
}

// A send or receive posted on an unbound buffer. It completes when waited on: wait() blocks on
// the buffer (up to the operation's deadline, or the caller's shorter timeout, after which the
// operation stays pending and may be waited on again).
class P2PWork : public core::Work {
 public:
  P2PWork(OpType type, std::string description, Tensor tensor,
          std::unique_ptr<::gloo::transport::UnboundBuffer> buffer, Millis timeout,
          std::string context)
      : Work(type, std::move(description)), tensor_(std::move(tensor)), buffer_(std::move(buffer)),
        deadline_(timeout), timeout_(timeout), context_(std::move(context)) {}

  bool wait(Millis timeout) override {
    {
      std::lock_guard<std::mutex> lock(wait_mutex_);
      // A send or receive that failed when posted (the pair closed after an earlier timeout)
      // is settled already: its buffer was never posted, so waiting on it cannot end well.
      if (!settled_ && !is_completed()) settle(timeout);
    }
    return Work::wait(core::kNoTimeout);
  }

  bool progresses_in_wait() const override { return true; }

  void abort() override {
    if (op_type() == OpType::kSend) {
      buffer_->abortWaitSend();
    } else {
      buffer_->abortWaitRecv();
    }
  }

 private:
  // Expects wait_mutex_ held.
  void settle(Millis caller_timeout) {
    const Millis left = deadline_.remaining();
    const bool caller_limited = caller_timeout > Millis::zero() && caller_timeout < left;
    const Millis limit = at_least_1ms(caller_limited ? caller_timeout : left);
    const bool is_send = op_type() == OpType::kSend;
    try {
      int rank = -1;
      bool done;
      if (caller_limited) {
        // A short wait must not close the context when it expires: the operation goes on.
        const WaitResult result = wait_or_abort(*buffer_, is_send, limit, &rank);
        if (result == WaitResult::kTimedOut) {
          throw DistTimeoutError(str_cat("Gloo ", context_, " did not complete within ",
                                         core::format_timeout(caller_timeout),
                                         " (it is still pending)"));
        }
        done = result == WaitResult::kDone;
      } else {
        done = is_send ? buffer_->waitSend(&rank, limit) : buffer_->waitRecv(&rank, limit);
      }
      settled_ = true;
      if (!done) {
        finish_with_error(
            std::make_exception_ptr(DistBackendError(str_cat("Gloo ", context_, " was aborted"))));
        return;
      }
      if (!is_send) set_source_rank(rank);
      finish({tensor_});
    } catch (const DistTimeoutError&) {
      throw;  // the caller's own timeout: not settled
    } catch (const std::exception& e) {
      const bool timed_out = is_gloo_timeout(e.what());
      settled_ = true;
      if (timed_out) {
        finish_with_error(std::make_exception_ptr(DistTimeoutError(str_cat(
            "Gloo ", context_, " timed out after ", core::format_timeout(timeout_), ": ", e.what(),
            " (a send matches only a receive with the same tag and "
            "byte count)"))));
      } else {
        finish_with_error(std::make_exception_ptr(
            DistBackendError(str_cat("Gloo ", context_, " failed: ", e.what()))));
      }
    }
  }

  Tensor tensor_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer_;
  core::Deadline deadline_;
  Millis timeout_;
  std::string context_;
  std::mutex wait_mutex_;
  bool settled_ = false;  // guarded by wait_mutex_
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Point to point

WorkPtr GlooBackend::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  return post_p2p(OpType::kSend, tensors, dst_rank, tag);
}

WorkPtr GlooBackend::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  return post_p2p(OpType::kRecv, tensors, src_rank, tag);
}

WorkPtr GlooBackend::recv_anysource(std::vector<Tensor>& tensors, int tag) {
  return post_p2p(OpType::kRecvAnySource, tensors, -1, tag);
}

WorkPtr GlooBackend::post_p2p(OpType type, std::vector<Tensor>& tensors, int peer, int tag) {
  const Tensor tensor = tensors[0];
  // Point-to-point operations do not take a sequence number: the user's tag is the slot, so
  // they match regardless of how collectives interleave with them.
  const auto& contexts = shared_->contexts;
  const auto& context = contexts[static_cast<uint32_t>(tag) % contexts.size()];
  const char* what = type == OpType::kSend   ? "send"
                     : type == OpType::kRecv ? "recv"
                                             : "recv_anysource";
  const std::string between =
      peer < 0 ? str_cat("rank ", rank(), " from any rank")
               : str_cat("rank ", rank(), type == OpType::kSend ? " to" : " from", " rank ", peer);
  std::string description =
      str_cat(what, " (tag ", tag, ", ", between, ", ", tensor.nbytes(), " bytes)");
  // The byte count is part of the slot, so a send meets only a receive of its size. Gloo
  // itself matches by tag alone and then throws on its network thread when a message is larger
  // than the receive buffer, which terminates the process; now the two time out with the usual
  // error instead. Sizes below 16 MiB are in the slot exactly, larger ones folded in.
  uint64_t size_key = tensor.nbytes();
  size_key = (size_key ^ (size_key >> 24) ^ (size_key >> 48)) & 0xFFFFFF;
  const uint64_t slot = (size_key << 32) | static_cast<uint32_t>(tag);
  auto buffer = context->createUnboundBuffer(data_or_dummy(tensor), tensor.nbytes());
  auto* raw = buffer.get();
  auto work = std::make_shared<P2PWork>(type, str_cat("gloo:", what), tensor, std::move(buffer),
                                        resolve_timeout(timeout()), description);
  try {
    if (type == OpType::kSend) {
      raw->send(peer, slot);
    } else if (type == OpType::kRecv) {
      raw->recv(peer, slot);
    } else {
      std::vector<int> sources;
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) sources.push_back(r);
      }
      raw->recv(sources, slot);
    }
  } catch (const std::exception& e) {
    work->finish_with_error(std::make_exception_ptr(
        DistBackendError(str_cat("Gloo ", description, " failed: ", e.what()))));
  }
  return work;
}

// ---------------------------------------------------------------------------------------------
// Monitored barrier

void GlooBackend::monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) {
  // In its turn among the collectives; the caller runs it (or waits for it) and sees its error.
  queue_
      ->submit(OpType::kBarrier, "monitored_barrier",
               resolve_timeout(effective_timeout(opts.timeout)), false,
               [this, wait_all_ranks](const pg::QueuedOp& queued) {
                 run_monitored_barrier(
                     shared_->context_for(static_cast<uint32_t>(queued.seq), queued.timeout),
                     wait_all_ranks);
               },
               {})
      ->wait();
}

void GlooBackend::run_monitored_barrier(const OpContext& c, bool wait_all_ranks) {
  if (c.size == 1) return;
  const core::Deadline deadline(c.timeout);
  const uint64_t arrive_slot = (kMonitoredBarrierPrefix << 56) | (uint64_t{c.tag} << 24);
  const uint64_t release_slot = arrive_slot + 1;

  // Waits go through wait_or_abort, so a rank that does not arrive leaves the context usable.
  // A receive given up on is parked rather than destroyed (see parked_).
  auto park = [this](Parked parked) {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    parked_.push_back(std::move(parked));
  };
  if (c.rank != 0) {
    const Millis wait = pg::monitored_barrier_release_wait(timeout(), c.timeout);
    const core::Deadline released_by(wait);
    Parked slot{std::make_unique<char>(1), nullptr};
    slot.buffer = c.context->createUnboundBuffer(slot.byte.get(), 1);
    WaitResult result = WaitResult::kTimedOut;
    try {
      slot.buffer->send(0, arrive_slot);
      result = wait_or_abort(*slot.buffer, true, at_least_1ms(released_by.remaining()));
      if (result == WaitResult::kDone) {
        slot.buffer->recv(0, release_slot);
        result = wait_or_abort(*slot.buffer, false, at_least_1ms(released_by.remaining()));
      }
    } catch (const std::exception& e) {
      throw DistBackendError(str_cat("Rank ", c.rank,
                                     " failed in monitored_barrier while "
                                     "talking to rank 0: ",
                                     e.what()));
    }
    if (result != WaitResult::kDone) {
      park(std::move(slot));
      throw DistTimeoutError(pg::monitored_barrier_unreleased(c.rank, wait));
    }
    if (*slot.byte != 1) {
      throw DistBackendError(pg::monitored_barrier_others_failed(c.rank, c.timeout));
    }
    return;
  }

  // Rank 0: every other rank must check in before the deadline.
  // A rank that has already exited closed its connection, so posting the receive itself
  // throws: that rank failed the barrier like one that never arrives.
  std::vector<Parked> arrivals(c.size);
  std::vector<std::string> post_errors(c.size);
  for (int r = 1; r < c.size; ++r) {
    arrivals[r].byte = std::make_unique<char>(0);
    arrivals[r].buffer = c.context->createUnboundBuffer(arrivals[r].byte.get(), 1);
    try {
      arrivals[r].buffer->recv(r, arrive_slot);
    } catch (const std::exception& e) {
      post_errors[r] = e.what();
    }
  }
  std::vector<int> arrived, failed;
  std::string first_error;
  for (int r = 1; r < c.size; ++r) {
    // After the first failure without wait_all_ranks, only collect ranks already there.
    const bool give_up = !wait_all_ranks && !failed.empty();
    const Millis limit = give_up ? Millis(1) : at_least_1ms(deadline.remaining());
    std::string error = std::move(post_errors[r]);  // empty: not arrived in time (yet)
    if (error.empty()) {
      try {
        if (wait_or_abort(*arrivals[r].buffer, false, limit) == WaitResult::kDone) {
          arrived.push_back(r);
          continue;
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (!give_up) {
      failed.push_back(r);
      if (first_error.empty()) first_error = std::move(error);
    }
    park(std::move(arrivals[r]));
  }
  // Release the ranks that arrived, telling them whether the barrier passed.
  std::vector<char> statuses(c.size, failed.empty() ? 1 : 0);
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> releases;
  for (int r : arrived) {
    try {
      releases.push_back(c.context->createUnboundBuffer(&statuses[r], 1));
      releases.back()->send(r, release_slot);
    } catch (const std::exception&) {
      releases.pop_back();
    }
  }
  for (auto& release : releases) {
    try {
      (void)wait_or_abort(*release, true, Millis(1000));
    } catch (const std::exception&) {
      // A rank that went away after arriving finds out on its own.
    }
  }
  if (failed.empty()) return;
  // A rank that arrives after rank 0 gave up on it finds this verdict waiting instead of
  // waiting out its own timeout (the send stays parked until it does).
  for (int r : failed) {
    Parked verdict{std::make_unique<char>(0), nullptr};
    try {
      verdict.buffer = c.context->createUnboundBuffer(verdict.byte.get(), 1);
      verdict.buffer->send(r, release_slot);
    } catch (const std::exception&) {
      continue;  // gone: nobody to tell
    }
    park(std::move(verdict));
  }
  const std::string message = pg::monitored_barrier_missing(failed, c.timeout);
  if (!first_error.empty()) throw DistBackendError(str_cat(message, ": ", first_error));
  throw DistTimeoutError(message);
}

}  // namespace c10d::backends::gloo
