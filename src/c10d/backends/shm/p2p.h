// P2PEngine: point-to-point messages through the per-pair channels (see segment.h). Progress
// happens whenever any point-to-point operation of this rank is posted or waited on, so sends
// and receives in any order cannot deadlock: data that arrives before its receive is posted is
// buffered.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "c10d/backends/shm/segment.h"
#include "c10d/backends/shm/shared_writer.h"
#include "c10d/core/deadline.h"
#include "c10d/core/tensor.h"
#include "c10d/core/work.h"

namespace c10d::backends::shm {

class StepChannel;

struct P2POp {
  bool is_send = false;
  int peer = -1;  // -1: any source
  int tag = 0;
  char* data = nullptr;
  size_t bytes = 0;
  core::DType dtype = core::DType::kUInt8;
  size_t done = 0;
  bool started = false;
  bool whole = false;     // a send offered whole (ChannelCtrl::address), not chunked
  uint32_t offered = 0;   // its channel's `posted` count once offered
  bool finished = false;  // guarded by the engine's mutex
  int source = -1;
  std::exception_ptr error;
  std::weak_ptr<core::Work> work;
  core::Tensor tensor;
  core::Millis timeout{0};
  // Counts from the first wait that had to wait (P2PEngine::wait); guarded by the engine's mutex.
  core::Deadline deadline{core::Millis(0)};
  bool deadline_started = false;
};

class P2PEngine {
 public:
  P2PEngine(std::shared_ptr<Segment> segment, std::shared_ptr<StepChannel> channel);
  // Withdraws the offers of sends never completed: their buffers go with their ops.
  ~P2PEngine();

  // Queues `op` and moves every channel as far as it goes; returns whether `op` finished.
  bool post(const std::shared_ptr<P2POp>& op);
  // Makes `work` the Work that `op` finishes (at once if it has), and `tensor` (its buffer,
  // kept alive by it) the op's until then.
  void attach(const std::shared_ptr<P2POp>& op, const std::shared_ptr<core::Work>& work,
              core::Tensor tensor);

  // Whether a receive is posted and not complete (another thread may be writing its buffer).
  bool receiving();

  // Drives progress until `op` finishes, its deadline passes (the op fails) or the caller's
  // timeout passes (throws, the op stays pending).
  void wait(const std::shared_ptr<P2POp>& op, core::Millis caller_timeout);

  // "send (tag 0, rank 0 to rank 1)": what errors call `op`, built only for them.
  std::string describe(const P2POp& op) const;

 private:
  struct Unexpected {
    int src = -1;
    int tag = 0;
    core::DType dtype = core::DType::kUInt8;
    std::vector<char> data;
    size_t got = 0;
    bool complete = false;
    std::shared_ptr<P2POp> claimed;  // a receive waiting for the rest of this message
  };
  struct Incoming {
    std::shared_ptr<P2POp> op;           // the receive it lands in, or
    std::shared_ptr<Unexpected> buffer;  // the buffer holding it until one is posted
    bool discard = false;
  };

  static bool matches(const P2POp& op, int src, int tag);
  // The error of a receive whose message (from `src`) has another size or dtype.
  std::exception_ptr mismatch(const P2POp& op, int src, size_t bytes, core::DType dtype) const;
  bool claim_unexpected(const std::shared_ptr<P2POp>& op,
                        std::vector<std::shared_ptr<P2POp>>& done);
  void deliver(P2POp& op, const Unexpected& u);
  // An offered message no receive matches yet is left offered unless `buffer_offers`: taken
  // into a buffer it costs a second copy and fresh pages, and the receive is usually about to
  // be posted. A thread that has waited a while buffers them, so that sends in any order
  // still cannot deadlock.
  void progress(std::vector<std::shared_ptr<P2POp>>& done, bool buffer_offers);
  // Sender side of an offered message (mutex_ held): offers it, or finishes it once read.
  // False while the channel is busy or the receiver has not read it yet.
  bool progress_offer(int d, P2POp& op);
  // Sender side of a small message (mutex_ held): into the ring to `d`, or false while the
  // channel's chunks are unread or the ring is full.
  bool post_small(int d, const P2POp& op);
  // Whether `d` has taken every small message sent to it (mutex_ held).
  bool small_drained(int d);
  // Receiver side: takes the small messages from `src` in order, into the receives they match
  // or, with `buffer_offers`, into buffers (mutex_ held).
  void take_small(int src, ChannelCtrl* ch, bool buffer_offers,
                  std::vector<std::shared_ptr<P2POp>>& done);
  // Receiver side of an offered message from `src`: takes and reads it (mutex_ held).
  // False (nothing done) when no receive matches and `buffer_offers` is false.
  bool take_offer(int src, ChannelCtrl* ch, uint32_t consumed, bool buffer_offers,
                  std::vector<std::shared_ptr<P2POp>>& done);
  // A send that fails: withdraws its offer, or waits for the receiver reading it (mutex_ held).
  void withdraw(P2POp& op);
  void fail(const std::shared_ptr<P2POp>& op, std::exception_ptr error);
  static void complete(const std::vector<std::shared_ptr<P2POp>>& ops);
  // Finishes `work` with the outcome of the finished `op`, whose buffer is `tensor`.
  static void finish(core::Work& work, const P2POp& op, const core::Tensor& tensor);

  // How long a send that fails waits for a receiver reading its buffer.
  static constexpr std::chrono::milliseconds kWithdrawWait{100};

  std::shared_ptr<Segment> segment_;
  Segment& seg_;
  std::shared_ptr<StepChannel> channel_;
  const int rank_;
  const int size_;
  std::mutex mutex_;
  detail::SharedWriter copy_shared;                        // guarded by mutex_
  std::vector<std::deque<std::shared_ptr<P2POp>>> sends_;  // per destination; guarded by mutex_
  std::deque<std::shared_ptr<P2POp>> recvs_;               // posted, unmatched; guarded by mutex_
  std::deque<std::shared_ptr<Unexpected>> unexpected_;     // arrival order; guarded by mutex_
  std::vector<Incoming> incoming_;                         // per source; guarded by mutex_
  // Small messages: sent to each destination, what that one had read when last looked at,
  // and taken from each source. Guarded by mutex_.
  std::vector<uint32_t> small_posted_, small_read_, small_next_;
};

namespace detail {

// A send or receive: wait() drives the channels until it completes.
class P2PWork : public core::Work {
 public:
  P2PWork(core::OpType type, std::string description, std::shared_ptr<P2PEngine> engine,
          std::shared_ptr<P2POp> op)
      : Work(type, std::move(description)), engine_(std::move(engine)), op_(std::move(op)) {}

  bool wait(core::Millis timeout) override {
    if (!is_completed()) engine_->wait(op_, timeout);
    return Work::wait(core::kNoTimeout);
  }

  bool progresses_in_wait() const override { return true; }

 private:
  std::shared_ptr<P2PEngine> engine_;
  std::shared_ptr<P2POp> op_;
};

}  // namespace detail

}  // namespace c10d::backends::shm
