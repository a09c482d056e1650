// ProgressThread (see progress_thread.h): MPI's start and end, the loop that posts and tests
// every operation's requests, and how it waits between tests (Poller).
#include "c10d/backends/mpi/progress_thread.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "c10d/backends/mpi/datatypes.h"
#include "c10d/backends/mpi/internal.h"
#include "c10d/backends/mpi/nbc_algorithms.h"
#include "c10d/core/blocking.h"
#include "c10d/core/env.h"

namespace c10d::backends::mpi::detail {

using core::DistBackendError;
using core::DistTimeoutError;
using core::OpType;
using core::Tensor;
using core::detail::str_cat;
using pg::Millis;
using pg::WorkPtr;

namespace {

// How a thread waits for posted requests. MPI moves them on only inside MPI_Test (libnbc runs
// a collective's schedule a round per call, vader completes large transfers there), so
// sleeping between tests stretches every round of a long operation (see
// docs/design/mpi.md#waiting-for-requests). The poller tests back to back at first, then
// yields the core after every empty round (a rank sharing it runs; that is how Open MPI's
// blocking calls wait when oversubscribed), and only once nothing finished for kYieldTime does
// it sleep between rounds, for 1% of the wait so far, 10 us to 1 ms: a peer that is seconds
// late costs little CPU.
class Poller {
 public:
  // After a round of tests that finished nothing: how long to sleep before the next (zero:
  // test again now).
  std::chrono::microseconds idle_round() {
    using std::chrono::microseconds;
    if (++idle_ <= kSpins) return microseconds(0);
    const auto now = std::chrono::steady_clock::now();
    if (idle_ == kSpins + 1) since_ = now;
    const auto waited = std::chrono::duration_cast<microseconds>(now - since_);
    if (waited < kYieldTime) {
      std::this_thread::yield();
      return microseconds(0);
    }
    return std::clamp(waited / 100, microseconds(10), microseconds(1000));
  }

  // Something finished: the next wait starts from the beginning.
  void reset() { idle_ = 0; }

 private:
  // Empty rounds tested back to back before the poller yields.
  static constexpr int kSpins = 200;
  // No sleeps before this: operations shorter than it (all but the largest) never sleep.
  static constexpr std::chrono::milliseconds kYieldTime{50};
  int idle_ = 0;
  std::chrono::steady_clock::time_point since_;
};

}  // namespace

std::atomic<ProgressThread*>& ProgressThread::started_instance() {
  static std::atomic<ProgressThread*> progress{nullptr};
  return progress;
}

void ProgressThread::later(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    calls_.push_back(std::move(fn));
  }
  wake_.notify_one();
}

bool ProgressThread::admit(Op& op) {
  std::string refusal;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_ || stopping_) {
      refusal = "MPI was finalized";
    } else if (op.group->shut_down && !op.collective) {
      refusal = "the process group was shut down";
    } else if (!op.group->broken.empty()) {
      refusal = op.group->broken;
    } else {
      ++op.group->outstanding;
      return true;
    }
  }
  finish(op, std::make_exception_ptr(DistBackendError(str_cat("MPI ", op.what, ": ", refusal))));
  return false;
}

WorkPtr ProgressThread::submit(OpPtr op) {
  WorkPtr work = op->work;
  if (!admit(*op)) return work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(op));
  }
  wake_.notify_one();
  return work;
}

void ProgressThread::run(const OpPtr& op, const pg::QueuedOp& queued) {
  op->what = str_cat(op->name, " (sequence ", queued.seq, ", rank ", op->group->rank, " of ",
                     op->group->size, ")");
  op->timeout = queued.timeout;
  op->deadline = core::Deadline(queued.timeout);
  if (op->call) op->call->seq = queued.seq;
  if (admit(*op)) {
    bool here;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      here = !busy_ && !inline_ && queue_.empty() && calls_.empty();
      if (here) {
        inline_ = true;
      } else {
        queue_.push_back(op);
      }
    }
    if (here) {
      if (post(*op)) {
        core::before_blocking();  // the peers may be late: let go of the caller's GIL
        Poller poller;            // as the progress thread polls
        while (!progress(*op)) {
          const std::chrono::microseconds pause = poller.idle_round();
          if (pause.count() > 0) std::this_thread::sleep_for(pause);
        }
      }
      bool held_back;  // work submitted meanwhile waits for the progress thread
      {
        std::lock_guard<std::mutex> lock(mutex_);
        inline_ = false;
        held_back = stopping_ || !queue_.empty() || !calls_.empty();
      }
      if (held_back) wake_.notify_one();
      settled_.notify_all();
    } else {
      wake_.notify_one();
    }
  }
  // The progress thread ends it by its deadline (or fails it when MPI is finalised).
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!op->finished) {
      lock.unlock();
      core::before_blocking();
      lock.lock();
      settled_.wait(lock, [&] { return op->finished; });
    }
    error = op->error;
  }
  if (error) std::rethrow_exception(error);
}

void ProgressThread::finalize(Millis grace) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopped_ || stopping_) return;
    settled_.wait_for(lock, grace, [&] { return queue_.empty() && active_ == 0 && !inline_; });
    stopping_ = true;
  }
  wake_.notify_one();
  // MPI_Finalize waits for every rank to finalise; a peer that hangs must not hang this
  // process's exit too.
  std::unique_lock<std::mutex> lock(mutex_);
  if (settled_.wait_for(lock, kFinalizeWait, [&] { return exited_; })) {
    lock.unlock();
    thread_.join();
    return;
  }
  core::log(core::LogLevel::kWarning,
            str_cat("MPI rank ", world_rank_, ": MPI_Finalize did not return within ",
                    core::format_timeout(kFinalizeWait),
                    " (a peer is not finalising); "
                    "exiting without it"));
  thread_.detach();
}

ProgressThread::ProgressThread() {
  thread_ = std::thread([this] { run(); });
}

void ProgressThread::initialise() {
  int initialised = 0;
  check(MPI_Initialized(&initialised), "MPI_Initialized");
  if (!initialised) {
    int provided = MPI_THREAD_SINGLE;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    owns_mpi_ = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      throw DistBackendError(
          "MPI backend: the MPI library does not support "
          "MPI_THREAD_SERIALIZED, which its progress thread needs");
    }
  } else {
    int provided = MPI_THREAD_SINGLE;
    check(MPI_Query_thread(&provided), "MPI_Query_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      throw DistBackendError(
          "MPI backend: MPI was initialised by the application with a "
          "thread level below MPI_THREAD_SERIALIZED; initialise it with "
          "MPI_THREAD_MULTIPLE (mpi4py's default) or let c10d do it");
    }
  }
  check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size");
  set_up_types_and_limits();
  nbc_algorithms.set_up();
  // Programs that never call finalize() (C++ ones) still finalise MPI before exiting, as
  // mpirun expects of every rank.
  std::atexit([] { MpiBackend::finalize(std::chrono::seconds(10)); });
}

void ProgressThread::run() {
  try {
    initialise();
  } catch (const std::exception& e) {
    init_error_ = e.what();
    stopped_ = true;
    started_.count_down();
    return;
  }
  started_.count_down();
  std::vector<OpPtr> active;
  Poller poller;
  std::chrono::microseconds pause{0};
  bool stopping = false;
  for (;;) {
    std::deque<std::function<void()>> calls;
    std::deque<OpPtr> fresh;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Nothing is taken while a caller runs an operation itself (submit).
      auto has_news = [&] {
        return !inline_ && (stopping_ || !queue_.empty() || !calls_.empty());
      };
      if (active.empty()) {
        wake_.wait(lock, has_news);
      } else if (pause.count() > 0) {
        // Nothing finished for a while: poll less often, but wake for new work at once.
        wake_.wait_for(lock, pause, has_news);
      }
      if (inline_) continue;  // woken by the time limit while a caller runs one
      calls.swap(calls_);
      fresh.swap(queue_);
      busy_ = !active.empty() || !calls.empty() || !fresh.empty();
      stopping = stopping_;
      if (stopping && active.empty() && fresh.empty() && calls.empty()) break;
    }
    bool moved = !calls.empty() || !fresh.empty();
    for (auto& call : calls) call();
    for (OpPtr& op : fresh) {
      if (post(*op)) {
        active.push_back(std::move(op));
      }
    }
    set_active(active.size());
    for (size_t i = 0; i < active.size();) {
      if (progress(*active[i])) {
        active[i] = std::move(active.back());
        active.pop_back();
        moved = true;
      } else {
        ++i;
      }
    }
    set_active(active.size());
    if (moved) poller.reset();
    pause = moved ? std::chrono::microseconds(0) : poller.idle_round();
    if (stopping && !active.empty()) {
      // finalize() gave up waiting: fail what is left and leave MPI alone.
      for (OpPtr& op : active) fail(*op, "MPI was finalized while it ran", false);
      active.clear();
      owns_mpi_ = false;  // finalising with requests pending would hang or abort
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  stopped_ = true;
  const bool finalise = owns_mpi_;
  lock.unlock();
  nbc_algorithms.tear_down();
  if (finalise) MPI_Finalize();
  lock.lock();
  exited_ = true;
  settled_.notify_all();
}

void ProgressThread::set_active(size_t n) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    active_ = n;
    if (n == 0) busy_ = false;
  }
  settled_.notify_all();
}

namespace {

// A check record: the agreement record, then whether this rank packed its data, then the data.
constexpr size_t kInlineWords = kInlineBytes / sizeof(int64_t);
static_assert(kInlineBytes % sizeof(int64_t) == 0);

size_t record_words(int size) { return pg::agreement_words(size) + 1 + kInlineWords; }

}  // namespace

bool ProgressThread::post(Op& op) {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!op.group->broken.empty()) {
      // An earlier operation timed out after this one was queued.
      why = op.group->broken;
      --op.group->outstanding;
    }
  }
  if (!why.empty()) {
    finish(op, std::make_exception_ptr(DistBackendError(str_cat("MPI ", op.what, ": ", why))));
    return false;
  }
  try {
    if (op.call && op.group->size > 1) {
      const std::vector<int64_t> mine = pg::agreement_record(*op.call, op.traffic, op.group->size);
      const size_t stride = record_words(op.group->size);
      op.records.assign(stride * static_cast<size_t>(op.group->size), 0);
      op.checking = true;
      op.requests.emplace_back();
      const int words = count_of(stride, "call record");
      // In place: this rank's record lies in its slot, which lives as long as the operation.
      int64_t* slot = op.records.data() + static_cast<size_t>(op.group->rank) * stride;
      std::copy(mine.begin(), mine.end(), slot);
      if (op.pack) {
        slot[mine.size()] = 1;
        op.pack(reinterpret_cast<std::byte*>(slot + mine.size() + 1));
      }
      check(MPI_Iallgather(MPI_IN_PLACE, words, MPI_INT64_T, op.records.data(), words, MPI_INT64_T,
                           op.group->control, &op.requests.back()),
            "MPI_Iallgather");
    } else {
      op.start(op.requests);
    }
  } catch (...) {
    complete(op, std::current_exception());
    return false;
  }
  return !progress(op);
}

void ProgressThread::finish_check(Op& op) {
  op.checking = false;
  op.requests.clear();
  const int size = op.group->size;
  const size_t stride = record_words(size);
  if (std::string why = pg::disagreement(op.group->rank, size, op.records.data(), stride);
      !why.empty()) {
    throw DistBackendError(str_cat("MPI ", op.what, ": ", why));
  }
  // The ranks agree, so each decided alike on packing but for what it had in flight.
  const size_t packed_at = pg::agreement_words(size);
  bool packed = static_cast<bool>(op.unpack);
  for (int r = 0; r < size && packed; ++r) packed = op.records[r * stride + packed_at] == 1;
  if (!packed) {
    op.start(op.requests);
    return;
  }
  op.unpack(reinterpret_cast<const std::byte*>(op.records.data() + packed_at + 1),
            stride * sizeof(int64_t));
}

bool ProgressThread::progress(Op& op) {
  int flag = 0;
  MPI_Status status{};
  std::exception_ptr error;
  try {
    if (op.requests.empty()) {
      flag = 1;  // its data travelled in its check
    } else if (op.requests.size() == 1) {
      check(MPI_Test(op.requests.data(), &flag, &status), "MPI_Test");
    } else {
      std::vector<MPI_Status> statuses(op.requests.size());
      check(MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &flag,
                        statuses.data()),
            "MPI_Testall");
      if (flag && !statuses.empty()) status = statuses.front();
    }
    if (flag && op.checking) {
      // Every rank's call arrived: compare, then (in the group's order) post the data.
      // On a mismatch nobody posts data: the group stays usable (complete passes the turn).
      finish_check(op);
      return progress(op);
    }
    if (!flag) {
      if (!op.deadline.expired()) return false;
      // torch's wording, which its users match: " Timed out ".
      fail(
          op,
          str_cat("failed: Timed out after ", core::format_timeout(op.timeout),
                  op.collective ? " waiting for the group's other ranks" : " waiting for the peer"),
          true);
      return true;
    }
    if (op.done) op.done(status);
  } catch (...) {
    error = std::current_exception();
  }
  complete(op, error);
  return true;
}

void ProgressThread::fail(Op& op, const std::string& why, bool timeout) {
  const std::string message = str_cat("MPI ", op.what, " ", why);
  if (!op.collective) {
    for (MPI_Request& request : op.requests) {
      if (request == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&request);
      MPI_Request_free(&request);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (op.collective && op.group->broken.empty()) {
      op.group->broken = str_cat("the group is unusable since ", op.what, " ", why);
    }
    leaked_.push_back(op.shared_from_this());
  }
  complete(op, timeout ? std::make_exception_ptr(DistTimeoutError(message))
                       : std::make_exception_ptr(DistBackendError(message)));
}

void ProgressThread::complete(Op& op, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --op.group->outstanding;
  }
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const core::DistError&) {
    } catch (const core::InvalidArgument&) {
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(DistBackendError(str_cat("MPI ", op.what, ": ", e.what())));
    } catch (...) {
    }
  }
  finish(op, error);
}

void ProgressThread::finish(Op& op, std::exception_ptr error) {
  if (!op.work) {  // a collective: ProgressThread::run waits for this
    {
      std::lock_guard<std::mutex> lock(mutex_);
      op.error = error;
      op.finished = true;
    }
    settled_.notify_all();
    return;
  }
  settled_.notify_all();
  try {
    if (error) {
      op.work->finish_with_error(error);
    } else {
      op.work->finish(std::move(op.outputs));
    }
  } catch (...) {
    // The Work was completed already (shutdown failed it).
  }
}

OpPtr make_op(const std::shared_ptr<MpiBackend::Group>& group, OpType type, const char* name,
              std::vector<Tensor> outputs) {
  auto op = std::make_shared<Op>();
  op->type = type;
  op->name = name;
  op->group = group;
  op->outputs = std::move(outputs);
  return op;
}

OpPtr make_message(const std::shared_ptr<MpiBackend::Group>& group, OpType type, std::string what,
                   Millis timeout, std::vector<Tensor> outputs) {
  auto op = std::make_shared<Op>();
  op->type = type;
  op->work = std::make_shared<core::Work>(type, str_cat("mpi:", what));
  op->what = str_cat(what, " (rank ", group->rank, " of ", group->size, ")");
  op->group = group;
  op->timeout = timeout;
  op->deadline = core::Deadline(timeout);
  op->collective = false;
  op->outputs = std::move(outputs);
  return op;
}

void check_call(Op& op, pg::Signature call, pg::Traffic traffic) {
  op.call = call;
  op.traffic = std::move(traffic);
}

}  // namespace c10d::backends::mpi::detail
