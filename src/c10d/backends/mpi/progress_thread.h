// ProgressThread: the one thread that makes every MPI call of the process (MPI_THREAD_SERIALIZED),
// posting operations as non-blocking calls in submission order and completing their Works; and
// Op and MpiBackend::Group, the operations it runs and the group state it guards.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "c10d/backends/mpi/mpi_backend.h"
#include "c10d/core/exception.h"
#include "c10d/pg/op_queue.h"
#include "c10d/pg/signature.h"

namespace c10d::backends::mpi {

struct MpiBackend::Group {
  MPI_Comm comm = MPI_COMM_NULL;     // the user's collectives and messages
  MPI_Comm control = MPI_COMM_NULL;  // monitored_barrier's messages
  int rank = 0;
  int size = 1;
  // Guarded by the progress thread's mutex.
  std::string broken;      // why the group can no longer run operations (empty: it can)
  bool shut_down = false;  // sends and receives are refused (collectives: the backend's queue)
  // Operations posted and not yet completed.
  int outstanding = 0;
};

namespace detail {

// One operation: `start` posts its non-blocking calls (their requests go into `requests`),
// `done` runs once all completed (copies out of scratch, AVG's division, ...). A collective is
// run by the backend's operation queue, one at a time per group (MpiBackend::submit), which
// numbers it; sends and receives go to the progress thread directly.
struct Op : std::enable_shared_from_this<Op> {
  core::OpType type = core::OpType::kUnknown;
  const char* name = "";  // "allreduce"
  // A send's or receive's Work; a collective has none (its queue's Work is the user's), and
  // ends in `finished` and `error`, guarded by the progress thread's mutex.
  std::shared_ptr<core::Work> work;
  bool finished = false;
  std::exception_ptr error;
  std::string what;  // "allreduce (sequence 3, rank 0 of 2)"
  std::shared_ptr<MpiBackend::Group> group;
  pg::Millis timeout{0};
  core::Deadline deadline{pg::Millis(0)};
  bool collective = true;
  std::function<void(std::vector<MPI_Request>&)> start;
  std::function<void(const MPI_Status&)> done;
  std::vector<core::Tensor> outputs;
  std::vector<MPI_Request> requests;
  // The user's call and its sizes (collectives only; set with check_call), compared with every
  // rank's in an all-gather on the group's control communicator before `start` posts any
  // data: ranks that called different things fail, naming both, instead of MPI combining
  // mismatched buffers or aborting the job.
  std::optional<pg::Signature> call;
  pg::Traffic traffic;
  std::vector<int64_t> records;  // every rank's, gathered while `checking`
  // A collective of at most kInlineBytes per rank can travel inside its check: `pack` writes
  // this rank's bytes into its record, and once every rank's record agrees, `unpack` gets them
  // all (rank order, `stride` bytes apart) and leaves in the outputs what the data step would
  // have; `done` follows as after it. One MPI call instead of two: the check costs small calls
  // nothing. (The group's collectives run one at a time, so the packed bytes are the data an
  // in-order run would send.)
  std::function<void(std::byte* slot)> pack;
  std::function<void(const std::byte* slots, size_t stride)> unpack;
  bool checking = false;
};
using OpPtr = std::shared_ptr<Op>;

// The most bytes per rank a collective's pack may write into its check record.
inline constexpr size_t kInlineBytes = 128;

// A collective for `group`, numbered and timed when its turn comes (ProgressThread::run).
OpPtr make_op(const std::shared_ptr<MpiBackend::Group>& group, core::OpType type, const char* name,
              std::vector<core::Tensor> outputs);
// A send or receive (`what` names it), ready to submit.
OpPtr make_message(const std::shared_ptr<MpiBackend::Group>& group, core::OpType type,
                   std::string what, pg::Millis timeout, std::vector<core::Tensor> outputs);
// Has `op` check `call` (kind, dtype, count, op, root; numbered when it runs) and `traffic`
// against every rank's before it moves data.
void check_call(Op& op, pg::Signature call, pg::Traffic traffic = {});

class ProgressThread {
 public:
  // Starts the thread and MPI the first time; throws DistBackendError if MPI failed to start.
  static ProgressThread& instance() {
    static ProgressThread* progress = [] {
      ProgressThread* p = new ProgressThread();  // never destroyed: finalize() stops the thread
      started_instance().store(p);
      return p;
    }();
    progress->started_.wait();
    if (!progress->init_error_.empty()) throw core::DistBackendError(progress->init_error_);
    return *progress;
  }

  // The progress thread if MPI was started, else null.
  static std::atomic<ProgressThread*>& started_instance();

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // Runs `fn` on the progress thread and returns its result (or rethrows its exception). A
  // call that does not finish within `timeout` throws DistTimeoutError naming `what` (fn
  // keeps running, so it must own what it uses).
  template <typename Fn>
  auto call(Fn fn, pg::Millis timeout, const std::string& what) -> decltype(fn()) {
    using R = decltype(fn());
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
    std::future<R> result = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) throw core::DistBackendError("MPI backend: MPI was finalized");
      calls_.push_back([task] { (*task)(); });
    }
    wake_.notify_one();
    if (timeout > pg::Millis::zero() && result.wait_for(timeout) != std::future_status::ready) {
      throw core::DistTimeoutError(core::detail::str_cat(
          "MPI backend: ", what, " did not finish within ", core::format_timeout(timeout)));
    }
    return result.get();
  }

  // Runs `fn` on the progress thread later, without waiting (for destructors, which may hold
  // the GIL that the progress thread needs to release Python-owned buffers).
  void later(std::function<void()> fn);

  // Queues a send or receive behind every operation posted before it; its Work completes on
  // the progress thread.
  pg::WorkPtr submit(OpPtr op);

  // Runs collective `op` as operation `queued` of its group and returns when it is over
  // (throwing its error). Called by the group's operation queue, one at a time per group. With
  // the progress thread idle it runs on the calling thread: handing it over and back cost two
  // thread wake-ups a call. MPI_THREAD_SERIALIZED allows that as long as the two threads never
  // call MPI at once: while it runs (inline_) the progress thread takes no work, and it starts
  // only while the progress thread has nothing queued or in flight (busy_).
  void run(const OpPtr& op, const pg::QueuedOp& queued);

  std::mutex& mutex() { return mutex_; }
  std::condition_variable& settled() { return settled_; }

  // Lets the thread finish what was submitted (at most `grace`), then stops it and finalises
  // MPI if c10d initialised it.
  void finalize(pg::Millis grace);

 private:
  ProgressThread();

  void initialise();
  void run();
  void set_active(size_t n);
  // Whether `op` may be posted (else it is failed, naming why); counts it as outstanding.
  bool admit(Op& op);
  // Posts the operation's calls (its check first, when it has one); false when it already
  // finished (or failed).
  bool post(Op& op);
  // The check's records arrived: compares them (throws on a mismatch).
  void finish_check(Op& op);
  // Tests the operation's requests; true when it is over (completed, failed or timed out).
  bool progress(Op& op);
  // Fails an operation that is still posted. A send or receive is cancelled; a collective
  // cannot be withdrawn, so the group is broken (its peers may be anywhere in it). The
  // operation and its buffers are kept until the process ends, in case MPI still uses them.
  void fail(Op& op, const std::string& why, bool timeout);
  // The operation is over: counts it out and finishes it with `error` (std::exceptions other
  // than c10d's become DistBackendError naming it).
  void complete(Op& op, std::exception_ptr error);
  // Ends an operation: a collective's waiter wakes, a message's Work completes.
  void finish(Op& op, std::exception_ptr error);

  // How long finalize() waits for MPI_Finalize.
  static constexpr pg::Millis kFinalizeWait{30000};

  std::thread thread_;
  std::latch started_{1};  // opened once MPI is initialised (or failed to be)
  std::string init_error_;
  bool owns_mpi_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;

  std::mutex mutex_;
  std::condition_variable wake_;             // work submitted or stopping
  std::condition_variable settled_;          // an operation finished
  std::deque<OpPtr> queue_;                  // guarded by mutex_
  std::deque<std::function<void()>> calls_;  // guarded by mutex_
  size_t active_ = 0;                        // guarded by mutex_
  bool busy_ = false;          // the thread took work it has not finished; guarded by mutex_
  bool inline_ = false;        // a caller runs an operation itself (submit); guarded by mutex_
  bool stopping_ = false;      // guarded by mutex_
  bool stopped_ = false;       // guarded by mutex_
  bool exited_ = false;        // guarded by mutex_: MPI finalised
  std::vector<OpPtr> leaked_;  // guarded by mutex_
};

}  // namespace detail
}  // namespace c10d::backends::mpi
