#include "c10d/backends/mpi/mpi_backend.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <latch>
#include <future>
#include <mutex>
#include <thread>

#include "c10d/core/blocking.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"

namespace c10d::backends::mpi {

using core::DistBackendError;
using core::DistTimeoutError;
using core::DType;
using core::OpType;
using core::ReduceOp;
using core::Tensor;
using core::detail::str_cat;
using pg::Millis;

namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return str_cat("error ", code);
  return std::string(text, static_cast<size_t>(length));
}

// Throws DistBackendError naming the MPI call when it failed (our communicators return errors
// instead of aborting: MPI_ERRORS_RETURN).
void check(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    throw DistBackendError(str_cat(call, " failed: ", mpi_error_text(code)));
  }
}

// MPI counts are ints.
int count_of(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX)) {
    throw core::InvalidArgument(str_cat("MPI backend: ", what, " of ", n, " elements exceeds "
                                        "MPI's limit of ", INT_MAX, " per call"));
  }
  return static_cast<int>(n);
}

// Zero-element tensors may have no storage; MPI wants a valid pointer all the same.
void* data_or_dummy(const Tensor& tensor) {
  static unsigned char dummy[16];
  return tensor.data() != nullptr ? tensor.data() : dummy;
}

// ---------------------------------------------------------------------------------------------
// Datatypes and reductions

// Types MPI has no arithmetic for get a datatype of their own (so the user operations below
// can tell them apart) and are reduced by c10d's kernels.
struct Types {
  MPI_Datatype of[core::kNumDTypes] = {};
  // User operations by ReduceOp kind (SUM ... BXOR), for the types MPI cannot reduce.
  MPI_Op user[ReduceOp::BXOR + 1] = {};
};
Types types;  // written once on the engine thread before any operation is posted
int tag_upper_bound = 32767;  // MPI_TAG_UB, read at initialisation (the standard's minimum)

DType own_dtype(MPI_Datatype datatype) {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kBool}) {
    if (types.of[static_cast<int>(d)] == datatype) return d;
  }
  return DType::kUInt8;  // not reached: user operations are used with these types only
}

template <ReduceOp::Kind kKind>
void user_reduce(void* in, void* inout, int* length, MPI_Datatype* datatype) {
  core::reduce(inout, in, static_cast<size_t>(*length), own_dtype(*datatype), ReduceOp(kKind));
}

void set_up_types_and_limits() {
  auto own = [](DType d, int bytes) {
    MPI_Datatype t;
    check(MPI_Type_contiguous(bytes, MPI_BYTE, &t), "MPI_Type_contiguous");
    check(MPI_Type_commit(&t), "MPI_Type_commit");
    types.of[static_cast<int>(d)] = t;
  };
  int* upper = nullptr;
  int found = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found) == MPI_SUCCESS && found &&
      upper != nullptr) {
    tag_upper_bound = *upper;
  }
  types.of[static_cast<int>(DType::kFloat32)] = MPI_FLOAT;
  types.of[static_cast<int>(DType::kFloat64)] = MPI_DOUBLE;
  types.of[static_cast<int>(DType::kInt8)] = MPI_INT8_T;
  types.of[static_cast<int>(DType::kInt16)] = MPI_INT16_T;
  types.of[static_cast<int>(DType::kInt32)] = MPI_INT32_T;
  types.of[static_cast<int>(DType::kInt64)] = MPI_INT64_T;
  types.of[static_cast<int>(DType::kUInt8)] = MPI_UINT8_T;
  types.of[static_cast<int>(DType::kComplex64)] = MPI_C_FLOAT_COMPLEX;
  types.of[static_cast<int>(DType::kComplex128)] = MPI_C_DOUBLE_COMPLEX;
  own(DType::kFloat16, 2);
  own(DType::kBFloat16, 2);
  own(DType::kBool, 1);
  auto user = [](ReduceOp::Kind kind, MPI_User_function* fn) {
    check(MPI_Op_create(fn, 1, &types.user[kind]), "MPI_Op_create");
  };
  user(ReduceOp::SUM, user_reduce<ReduceOp::SUM>);
  user(ReduceOp::PRODUCT, user_reduce<ReduceOp::PRODUCT>);
  user(ReduceOp::MIN, user_reduce<ReduceOp::MIN>);
  user(ReduceOp::MAX, user_reduce<ReduceOp::MAX>);
  user(ReduceOp::BAND, user_reduce<ReduceOp::BAND>);
  user(ReduceOp::BOR, user_reduce<ReduceOp::BOR>);
  user(ReduceOp::BXOR, user_reduce<ReduceOp::BXOR>);
}

MPI_Datatype datatype(DType dtype) { return types.of[static_cast<int>(dtype)]; }

// The MPI operation that combines contributions for `op` on `dtype` (AVG and PREMUL_SUM
// combine as SUM; the ProcessGroup has checked that the pair is valid).
MPI_Op mpi_op(DType dtype, const ReduceOp& op) {
  ReduceOp::Kind kind = op.kind;
  if (kind == ReduceOp::AVG || kind == ReduceOp::PREMUL_SUM) kind = ReduceOp::SUM;
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kBool) {
    return types.user[kind];
  }
  switch (kind) {
    case ReduceOp::SUM: return MPI_SUM;
    case ReduceOp::PRODUCT: return MPI_PROD;
    case ReduceOp::MIN: return MPI_MIN;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::BAND: return MPI_BAND;
    case ReduceOp::BOR: return MPI_BOR;
    case ReduceOp::BXOR: return MPI_BXOR;
    default:
      throw core::InvalidArgument(str_cat("MPI backend: unsupported reduction ", kind));
  }
}

// How a thread waits for posted requests. MPI moves them on only inside MPI_Test (libnbc runs
// a collective's schedule a round per call, vader completes large transfers there), so
// sleeping between tests stretches every round of a long operation: with sleeps from the
// 2,000th empty test on, reduce of 1 MiB took 141 ms at 2 ranks instead of 0.4. The poller
// tests back to back at first, then yields the core after every empty round (a rank sharing
// it runs; that is how Open MPI's blocking calls wait when oversubscribed), and only once
// nothing finished for kYieldTime does it sleep between rounds, for 1% of the wait so far,
// 10 us to 1 ms: a peer that is seconds late costs little CPU, and operations shorter than
// kYieldTime (all but the largest) never sleep.
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
  static constexpr int kSpins = 200;
  static constexpr std::chrono::milliseconds kYieldTime{50};
  int idle_ = 0;
  std::chrono::steady_clock::time_point since_;
};

// ---------------------------------------------------------------------------------------------
// Open MPI's algorithms for non-blocking collectives

// Open MPI's libnbc runs an in-place MPI_Iallreduce on fewer than 4 ranks as a binomial
// reduce and broadcast, whatever its size, and MPI_Ireduce as a chain; both are several times
// slower than the blocking calls for large messages. libnbc reads its algorithm from control
// variables at every call, and MPI_T may change them between calls, so each call sets the
// one that suits it, unless the user chose one (a variable that is not 0, "ignore", when MPI
// starts: OMPI_MCA_..., mpirun --mca, a parameter file). Nothing happens where the variables
// do not exist (another MPI). The choice is global, so the application's own non-blocking
// calls run with the last one set.
//
// Timings of MPI_Iallreduce + MPI_Test of float32 in place (Open MPI 4.1.4, this project's
// 2-vCPU EPYC guest, close placement), by algorithm, 2 ranks: 16 KiB 12.2 us binomial,
// 9.4 ring, 9.7 Rabenseifner, 7.7 recursive doubling; 1 MiB 219 / 111 / 111 / 165; 4 MiB
// 871 / 387 / 313 / 750; 16 MiB 6.8 ms / 2.4 / 1.9 / 8.3 (blocking MPI_Allreduce: 1 MiB
// 109-130 us, 4 MiB 306-351). 4 ranks on 2 cores: 4 B 15.0 us binomial, 7.8 recursive
// doubling; 64 KiB 65.5 / 62.8; 1 MiB 584 binomial, 366 ring, 548 Rabenseifner, 545
// recursive doubling; 4 MiB 2510 / 1193 / 2010 / 4217. MPI_Ireduce to rank 0, in place,
// binomial against libnbc's own choice: 2 ranks 4 B 1.4 us against 2.4, 1 MiB 128 against
// 419, 4 MiB 462 against 2203; 4 ranks 1 MiB 243 against 311, 4 MiB 1078 against 1905.
// (Every algorithm gave exact results at 2-5 ranks, counts 1 to 262147, in place.)
class NbcAlgorithms {
 public:
  // Once MPI is initialised (on the thread that makes the MPI calls).
  void set_up() {
    int provided = 0;
    if (MPI_T_init_thread(MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return;
    started_ = true;
    allreduce_ = bind("coll_libnbc_iallreduce_algorithm");
    reduce_ = bind("coll_libnbc_ireduce_algorithm");
  }

  void tear_down() {
    for (Variable* v : {&allreduce_, &reduce_}) {
      if (v->handle != MPI_T_CVAR_HANDLE_NULL) MPI_T_cvar_handle_free(&v->handle);
    }
    if (started_) MPI_T_finalize();
    started_ = false;
  }

  // Before an MPI_Iallreduce of `bytes` on `ranks` ranks.
  void allreduce(size_t bytes, int ranks) {
    if (bytes < kLargeBytes) return allreduce_.set(kRecursiveDoubling);
    allreduce_.set(ranks == 2 ? kRabenseifner : kRing);
  }

  // Before an MPI_Ireduce.
  void reduce() { reduce_.set(kBinomialReduce); }

 private:
  // libnbc's numbers for its algorithms.
  static constexpr int kRing = 1;
  static constexpr int kRabenseifner = 3;
  static constexpr int kRecursiveDoubling = 4;
  static constexpr int kBinomialReduce = 2;
  // From this size on an allreduce splits the message among the ranks.
  static constexpr size_t kLargeBytes = size_t{64} << 10;

  struct Variable {
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    int value = 0;

    void set(int wanted) {
      if (handle == MPI_T_CVAR_HANDLE_NULL || wanted == value) return;
      if (MPI_T_cvar_write(handle, &wanted) == MPI_SUCCESS) value = wanted;
    }
  };

  // A handle on the integer variable `name` if it exists and is still libnbc's default.
  static Variable bind(const char* name) {
    Variable v;
    int index = 0, verbosity = 0, binding = 0, scope = 0, count = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum values;
    if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS ||
        MPI_T_cvar_get_info(index, nullptr, nullptr, &verbosity, &type, &values, nullptr,
                            nullptr, &binding, &scope) != MPI_SUCCESS ||
        type != MPI_INT || binding != MPI_T_BIND_NO_OBJECT ||
        MPI_T_cvar_handle_alloc(index, nullptr, &v.handle, &count) != MPI_SUCCESS) {
      v.handle = MPI_T_CVAR_HANDLE_NULL;
      return v;
    }
    if (count != 1 || MPI_T_cvar_read(v.handle, &v.value) != MPI_SUCCESS || v.value != 0) {
      MPI_T_cvar_handle_free(&v.handle);  // the user's choice stands
      v.handle = MPI_T_CVAR_HANDLE_NULL;
    }
    return v;
  }

  bool started_ = false;
  Variable allreduce_;
  Variable reduce_;
};
NbcAlgorithms nbc_algorithms;  // used on the thread that makes the MPI calls only

// ---------------------------------------------------------------------------------------------
// The engine: one thread makes every MPI call of the process.

// One operation: `start` posts its non-blocking calls (their requests go into `requests`),
// `done` runs once all completed (copies out of scratch, AVG's division, ...).
struct Op : std::enable_shared_from_this<Op> {
  std::shared_ptr<core::Work> work;
  std::string what;  // "allreduce (sequence 3, rank 0 of 2)"
  std::shared_ptr<MpiBackend::Group> group;
  Millis timeout{0};
  core::Deadline deadline{Millis(0)};
  bool collective = true;
  std::function<void(std::vector<MPI_Request>&)> start;
  std::function<void(const MPI_Status&)> done;
  std::vector<Tensor> outputs;
  std::vector<MPI_Request> requests;
  // A barrier completes only once the group's collectives submitted before it did, as torch's
  // does (the engine runs them concurrently): filled by submit when `waits_prior`.
  bool waits_prior = false;
  std::vector<std::weak_ptr<core::Work>> prior;
};
using OpPtr = std::shared_ptr<Op>;

// Drops the Works that completed or are gone. Those still referenced elsewhere go into
// `last`, so that a last reference (and the arrays it holds) is released where the caller
// holds no lock.
void drop_finished(std::vector<std::weak_ptr<core::Work>>& works,
                   std::vector<std::shared_ptr<core::Work>>& last) {
  std::erase_if(works, [&](const std::weak_ptr<core::Work>& w) {
    auto work = w.lock();
    if (work && !work->is_completed()) return false;
    if (work) last.push_back(std::move(work));
    return true;
  });
}

}  // namespace

struct MpiBackend::Group {
  MPI_Comm comm = MPI_COMM_NULL;      // the user's collectives and messages
  MPI_Comm control = MPI_COMM_NULL;   // monitored_barrier's messages
  int rank = 0;
  int size = 1;
  // Guarded by the engine's mutex.
  uint64_t next_seq = 0;
  std::string broken;  // why the group can no longer run operations (empty: it can)
  bool shut_down = false;
  // Operations submitted and not yet completed (finish_pending waits for 0).
  int outstanding = 0;
  // The Works of its collectives (and some completed ones, pruned at each submission), for
  // barriers.
  std::vector<std::weak_ptr<core::Work>> unfinished;
};

namespace {

class Engine {
 public:
  static Engine& instance() {
    static Engine* engine = [] {
      Engine* e = new Engine();  // never destroyed: finalize() stops the thread
      started_engine().store(e);
      return e;
    }();
    engine->started_.wait();
    if (!engine->init_error_.empty()) throw DistBackendError(engine->init_error_);
    return *engine;
  }

  // The engine if MPI was started, else null.
  static std::atomic<Engine*>& started_engine() {
    static std::atomic<Engine*> engine{nullptr};
    return engine;
  }

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // Runs `fn` on the engine thread and returns its result (or rethrows its exception). A
  // call that does not finish within `timeout` throws DistTimeoutError naming `what` (fn
  // keeps running, so it must own what it uses).
  template <typename Fn>
  auto call(Fn fn, Millis timeout, const std::string& what) -> decltype(fn()) {
    using R = decltype(fn());
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
    std::future<R> result = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) throw DistBackendError("MPI backend: MPI was finalized");
      calls_.push_back([task] { (*task)(); });
    }
    wake_.notify_one();
    if (timeout > Millis::zero() && result.wait_for(timeout) != std::future_status::ready) {
      throw DistTimeoutError(str_cat("MPI backend: ", what, " did not finish within ",
                                     core::format_timeout(timeout)));
    }
    return result.get();
  }

  // Runs `fn` on the engine thread later, without waiting (for destructors, which may hold
  // the GIL that the engine needs to release Python-owned buffers).
  void later(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) return;
      calls_.push_back(std::move(fn));
    }
    wake_.notify_one();
  }

  // Queues `op` behind every operation submitted before it; its Work completes on the engine.
  // A synchronous one (`async` false) that finds the engine idle runs on the calling thread
  // instead, and is complete on return: handing it to the engine thread and back cost two
  // thread wake-ups a call. MPI_THREAD_SERIALIZED allows that as long as the two threads never
  // call MPI at once: while it runs (inline_) the engine takes no work, and it starts only
  // while the engine has nothing queued or in flight (busy_).
  WorkPtr submit(OpPtr op, bool async = true) {
    WorkPtr work = op->work;
    std::vector<WorkPtr> finished;  // released after the lock
    std::string refusal;
    bool here = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_ || stopping_) {
        refusal = "MPI was finalized";
      } else if (op->group->shut_down) {
        refusal = "the process group was shut down";
      } else if (!op->group->broken.empty()) {
        refusal = op->group->broken;
      } else {
        ++op->group->outstanding;
        auto& unfinished = op->group->unfinished;
        drop_finished(unfinished, finished);
        if (op->waits_prior) op->prior = unfinished;
        if (op->collective) unfinished.push_back(op->work);  // as torch, not sends and receives
        here = !async && !busy_ && !inline_ && queue_.empty() && calls_.empty();
        if (here) {
          inline_ = true;
        } else {
          queue_.push_back(op);
        }
      }
    }
    if (!refusal.empty()) {
      work->finish_with_error(std::make_exception_ptr(
          DistBackendError(str_cat("MPI ", work->description(), ": ", refusal))));
      return work;
    }
    if (!here) {
      wake_.notify_one();
      return work;
    }
    if (post(*op)) {
      core::before_blocking();  // the peers may be late: let go of the caller's GIL
      Poller poller;  // as the engine polls
      while (!progress(*op)) {
        const std::chrono::microseconds pause = poller.idle_round();
        if (pause.count() > 0) std::this_thread::sleep_for(pause);
      }
    }
    bool held_back;  // work submitted meanwhile waits for the engine
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inline_ = false;
      held_back = stopping_ || !queue_.empty() || !calls_.empty();
    }
    if (held_back) wake_.notify_one();
    settled_.notify_all();
    return work;
  }

  std::mutex& mutex() { return mutex_; }
  std::condition_variable& settled() { return settled_; }

  void finalize(Millis grace) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stopped_ || stopping_) return;
      settled_.wait_for(lock, grace,
                        [&] { return queue_.empty() && active_ == 0 && !inline_; });
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
                      core::format_timeout(kFinalizeWait), " (a peer is not finalising); "
                      "exiting without it"));
    thread_.detach();
  }

 private:
  Engine() {
    thread_ = std::thread([this] { run(); });
  }

  void initialise() {
    int initialised = 0;
    check(MPI_Initialized(&initialised), "MPI_Initialized");
    if (!initialised) {
      int provided = MPI_THREAD_SINGLE;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
            "MPI_Init_thread");
      owns_mpi_ = true;
      if (provided < MPI_THREAD_SERIALIZED) {
        throw DistBackendError("MPI backend: the MPI library does not support "
                               "MPI_THREAD_SERIALIZED, which its engine thread needs");
      }
    } else {
      int provided = MPI_THREAD_SINGLE;
      check(MPI_Query_thread(&provided), "MPI_Query_thread");
      if (provided < MPI_THREAD_SERIALIZED) {
        throw DistBackendError("MPI backend: MPI was initialised by the application with a "
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

  void run() {
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

  void set_active(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_ = n;
      if (n == 0) busy_ = false;
    }
    settled_.notify_all();
  }

  // Posts the operation's calls; false when it already finished (or failed).
  bool post(Op& op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!op.group->broken.empty()) {
        // An earlier operation timed out after this one was queued.
        std::string why = op.group->broken;
        --op.group->outstanding;
        settled_.notify_all();
        op.work->finish_with_error(std::make_exception_ptr(
            DistBackendError(str_cat("MPI ", op.what, ": ", why))));
        return false;
      }
    }
    try {
      op.start(op.requests);
    } catch (...) {
      complete(op, std::current_exception());
      return false;
    }
    return !progress(op);
  }

  // Tests the operation's requests; true when it is over (completed, failed or timed out).
  bool progress(Op& op) {
    int flag = 0;
    MPI_Status status{};
    std::exception_ptr error;
    try {
      if (op.requests.size() == 1) {
        check(MPI_Test(op.requests.data(), &flag, &status), "MPI_Test");
      } else {
        std::vector<MPI_Status> statuses(op.requests.size());
        check(MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &flag,
                          statuses.data()),
              "MPI_Testall");
        if (flag && !statuses.empty()) status = statuses.front();
      }
      if (flag && !op.prior.empty()) {
        std::vector<WorkPtr> finished;
        drop_finished(op.prior, finished);
        flag = op.prior.empty();
      }
      if (!flag) {
        if (!op.deadline.expired()) return false;
        // torch's wording, which its users match: " Timed out ".
        fail(op, str_cat("failed: Timed out after ", core::format_timeout(op.timeout),
                         !op.prior.empty() ? str_cat(" waiting for ", op.prior.size(),
                                                     " earlier collective(s) of the group")
                         : op.collective   ? std::string(" waiting for the group's other ranks")
                                           : std::string(" waiting for the peer")),
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

  // Fails an operation that is still posted. A send or receive is cancelled; a collective
  // cannot be withdrawn, so the group is broken (its peers may be anywhere in it). The
  // operation and its buffers are kept until the process ends, in case MPI still uses them.
  void fail(Op& op, const std::string& why, bool timeout) {
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

  void complete(Op& op, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --op.group->outstanding;
    }
    settled_.notify_all();
    try {
      if (error) {
        try {
          std::rethrow_exception(error);
        } catch (const core::DistError&) {
          op.work->finish_with_error(error);
        } catch (const core::InvalidArgument&) {
          op.work->finish_with_error(error);
        } catch (const std::exception& e) {
          op.work->finish_with_error(std::make_exception_ptr(
              DistBackendError(str_cat("MPI ", op.what, ": ", e.what()))));
        }
      } else {
        op.work->finish(std::move(op.outputs));
      }
    } catch (...) {
      // The Work was completed already (shutdown failed it).
    }
  }

  // How long finalize() waits for MPI_Finalize.
  static constexpr Millis kFinalizeWait{30000};

  std::thread thread_;
  std::latch started_{1};  // opened once MPI is initialised (or failed to be)
  std::string init_error_;
  bool owns_mpi_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;

  std::mutex mutex_;
  std::condition_variable wake_;     // work submitted or stopping
  std::condition_variable settled_;  // an operation finished
  std::deque<OpPtr> queue_;                      // guarded by mutex_
  std::deque<std::function<void()>> calls_;      // guarded by mutex_
  size_t active_ = 0;                            // guarded by mutex_
  bool busy_ = false;    // the engine took work it has not finished; guarded by mutex_
  bool inline_ = false;  // a caller runs an operation itself (submit); guarded by mutex_
  bool stopping_ = false;                        // guarded by mutex_
  bool stopped_ = false;                         // guarded by mutex_
  bool exited_ = false;                          // guarded by mutex_: MPI finalised
  std::vector<OpPtr> leaked_;                    // guarded by mutex_
};

// The element count and type an operation moves `tensor` with: its dtype where MPI knows it,
// else bytes (which needs no arithmetic).
struct Buffer {
  void* data;
  int count;
  MPI_Datatype type;
};

Buffer typed(const Tensor& t, const char* what) {
  return Buffer{data_or_dummy(t), count_of(static_cast<size_t>(t.numel()), what),
                datatype(t.dtype())};
}

Buffer bytes_of(const Tensor& t, const char* what) {
  return Buffer{data_or_dummy(t), count_of(t.nbytes(), what), MPI_BYTE};
}

const Tensor& single(const std::vector<Tensor>& tensors, const char* op) {
  if (tensors.size() != 1) {
    throw core::InvalidArgument(str_cat("MPI backend: ", op, " takes exactly one tensor per "
                                        "rank, got ", tensors.size()));
  }
  return tensors.front();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation

std::pair<int, int> MpiBackend::world() {
  Engine& engine = Engine::instance();
  return {engine.world_rank(), engine.world_size()};
}

void MpiBackend::finalize(Millis grace) {
  // Only if MPI was ever started: finalising must not start it.
  if (Engine* engine = Engine::started_engine().load()) engine->finalize(grace);
}

std::shared_ptr<MpiBackend> MpiBackend::create(std::vector<int> ranks, Millis timeout) {
  Engine& engine = Engine::instance();
  const int world_size = engine.world_size();
  const int world_rank = engine.world_rank();
  if (ranks.empty()) {
    for (int r = 0; r < world_size; ++r) ranks.push_back(r);
  }
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      sorted.front() < 0 || sorted.back() >= world_size) {
    throw core::InvalidArgument(str_cat("MPI backend: group ranks must be distinct ranks of "
                                        "the MPI world (size ", world_size, ")"));
  }
  const auto me = std::find(ranks.begin(), ranks.end(), world_rank);
  if (me == ranks.end()) return nullptr;
  auto group = std::make_shared<Group>();
  group->rank = static_cast<int>(me - ranks.begin());
  group->size = static_cast<int>(ranks.size());
  // Members agree on the tag from the ranks alone (MPI_Comm_create_group runs among them).
  uint32_t tag = 2166136261u;
  for (int r : ranks) tag = (tag ^ static_cast<uint32_t>(r)) * 16777619u;
  const std::string what = str_cat("creating the communicator of world ranks [",
                                   pg::join_ranks(ranks), "] on world rank ", world_rank,
                                   " (every member must create it)");
  engine.call([group, ranks, tag, world_size] {
    if (static_cast<int>(ranks.size()) == world_size &&
        std::is_sorted(ranks.begin(), ranks.end())) {
      check(MPI_Comm_dup(MPI_COMM_WORLD, &group->comm), "MPI_Comm_dup");
    } else {
      MPI_Group world_group, members;
      check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
      check(MPI_Group_incl(world_group, group->size, ranks.data(), &members),
            "MPI_Group_incl");
      check(MPI_Comm_create_group(MPI_COMM_WORLD, members, static_cast<int>(tag % 32768),
                                  &group->comm),
            "MPI_Comm_create_group");
      MPI_Group_free(&members);
      MPI_Group_free(&world_group);
    }
    check(MPI_Comm_set_errhandler(group->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_dup(group->comm, &group->control), "MPI_Comm_dup");
    return 0;
  }, timeout, what);
  return std::make_shared<MpiBackend>(group, group->rank, group->size, timeout);
}

MpiBackend::MpiBackend(std::shared_ptr<Group> group, int rank, int size, Millis timeout)
    : pg::Backend(rank, size, timeout), group_(std::move(group)) {}

MpiBackend::~MpiBackend() {
  shutdown();
  // The engine frees the communicators once nothing uses them. Not waited for: the caller
  // may hold the GIL, which the engine needs to drop the buffers of finished operations.
  std::shared_ptr<Group> group = group_;
  try {
    Engine& engine = Engine::instance();
    {
      std::lock_guard<std::mutex> lock(engine.mutex());
      if (group->outstanding != 0 || !group->broken.empty()) return;  // leave them to MPI
    }
    engine.later([group] {
      MPI_Comm_free(&group->control);
      MPI_Comm_free(&group->comm);
    });
  } catch (...) {
  }
}

void MpiBackend::finish_pending(Millis timeout) {
  Engine& engine = Engine::instance();
  std::unique_lock<std::mutex> lock(engine.mutex());
  auto drained = [&] { return group_->outstanding == 0; };
  if (timeout <= Millis::zero()) return engine.settled().wait(lock, drained);
  if (engine.settled().wait_for(lock, timeout, drained)) return;
  core::log(core::LogLevel::kWarning,
            str_cat("MPI rank ", rank(), " of ", size(), ": ", group_->outstanding,
                    " operation(s) did not finish within ", core::format_timeout(timeout),
                    " while the backend shut down"));
}

void MpiBackend::shutdown() {
  try {
    Engine& engine = Engine::instance();
    std::lock_guard<std::mutex> lock(engine.mutex());
    group_->shut_down = true;
  } catch (...) {
  }
}

// ---------------------------------------------------------------------------------------------
// Operations

namespace {

// Builds an Op for `group` with the next sequence number.
OpPtr make_op(const std::shared_ptr<MpiBackend::Group>& group, OpType type, const char* name,
              Millis timeout, std::vector<Tensor> outputs, bool collective = true) {
  auto op = std::make_shared<Op>();
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(Engine::instance().mutex());
    seq = group->next_seq++;
  }
  op->what = str_cat(name, " (sequence ", seq, ", rank ", group->rank, " of ", group->size,
                     ")");
  op->work = std::make_shared<core::Work>(type, str_cat("mpi:", name, "#", seq));
  op->group = group;
  op->timeout = timeout;
  op->deadline = core::Deadline(timeout);
  op->collective = collective;
  op->outputs = std::move(outputs);
  return op;
}

}  // namespace

WorkPtr MpiBackend::broadcast(std::vector<Tensor>& tensors, const pg::BroadcastOptions& opts) {
  const Tensor t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.root_rank);
  OpPtr op = make_op(group_, OpType::kBroadcast, "broadcast", effective_timeout(opts.timeout),
                     {t});
  MPI_Comm comm = group_->comm;
  op->start = [t, root, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(t, "broadcast");
    r.emplace_back();
    check(MPI_Ibcast(b.data, b.count, b.type, root, comm, &r.back()), "MPI_Ibcast");
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::allreduce(std::vector<Tensor>& tensors, const pg::AllreduceOptions& opts) {
  const Tensor t = single(tensors, "allreduce");
  const ReduceOp rop = opts.reduce_op;
  const int n = size();
  OpPtr op = make_op(group_, OpType::kAllreduce, "allreduce", effective_timeout(opts.timeout),
                     {t});
  MPI_Comm comm = group_->comm;
  op->start = [t, rop, n, comm](std::vector<MPI_Request>& r) {
    const size_t count = static_cast<size_t>(t.numel());
    core::apply_premul(t.data(), count, t.dtype(), rop);
    const Buffer b = typed(t, "allreduce");
    r.emplace_back();
    nbc_algorithms.allreduce(count * t.element_size(), n);
    check(MPI_Iallreduce(MPI_IN_PLACE, b.data, b.count, b.type, mpi_op(t.dtype(), rop), comm,
                         &r.back()),
          "MPI_Iallreduce");
  };
  op->done = [t, rop, n](const MPI_Status&) {
    core::apply_postdiv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), rop, n);
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::reduce(std::vector<Tensor>& tensors, const pg::ReduceOptions& opts) {
  const Tensor t = tensors.at(static_cast<size_t>(opts.root_tensor));
  const ReduceOp rop = opts.reduce_op;
  const int root = static_cast<int>(opts.root_rank);
  const bool is_root = rank() == root;
  const int n = size();
  OpPtr op = make_op(group_, OpType::kReduce, "reduce", effective_timeout(opts.timeout),
                     tensors);
  MPI_Comm comm = group_->comm;
  // Ranks other than the root keep their tensor: a PREMUL_SUM scales a copy.
  auto input = std::make_shared<Tensor>(t);
  op->start = [t, rop, root, is_root, input, comm](std::vector<MPI_Request>& r) {
    const size_t count = static_cast<size_t>(t.numel());
    if (is_root) {
      core::apply_premul(t.data(), count, t.dtype(), rop);
    } else if (rop.kind == ReduceOp::PREMUL_SUM) {
      *input = t.contiguous_copy();
      core::apply_premul(input->data(), count, t.dtype(), rop);
    }
    const Buffer b = typed(*input, "reduce");
    r.emplace_back();
    nbc_algorithms.reduce();
    check(MPI_Ireduce(is_root ? MPI_IN_PLACE : b.data, is_root ? b.data : nullptr, b.count,
                      b.type, mpi_op(t.dtype(), rop), root, comm, &r.back()),
          "MPI_Ireduce");
  };
  op->done = [t, rop, n, is_root](const MPI_Status&) {
    if (is_root) core::apply_postdiv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), rop, n);
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::allgather_base(Tensor& output, Tensor& input,
                                   const pg::AllgatherOptions& opts) {
  const Tensor in = input, out = output;
  OpPtr op = make_op(group_, OpType::kAllgatherBase, "allgather_base",
                     effective_timeout(opts.timeout), {output});
  MPI_Comm comm = group_->comm;
  op->start = [in, out, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(in, "allgather");
    r.emplace_back();
    check(MPI_Iallgather(b.data, b.count, MPI_BYTE, data_or_dummy(out), b.count, MPI_BYTE, comm,
                         &r.back()),
          "MPI_Iallgather");
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                    std::vector<Tensor>& inputs,
                                                    const pg::AllgatherOptions& opts) {
  OpPtr op = make_op(group_, OpType::kAllgatherBase, "allgather_into_tensor_coalesced",
                     effective_timeout(opts.timeout), outputs);
  MPI_Comm comm = group_->comm;
  op->start = [ins = inputs, outs = outputs, comm](std::vector<MPI_Request>& r) {
    for (size_t i = 0; i < ins.size(); ++i) {
      const Buffer b = bytes_of(ins[i], "allgather");
      r.emplace_back();
      check(MPI_Iallgather(b.data, b.count, MPI_BYTE, data_or_dummy(outs[i]), b.count, MPI_BYTE,
                           comm, &r.back()),
            "MPI_Iallgather");
    }
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::gather(std::vector<std::vector<Tensor>>& outputs,
                           std::vector<Tensor>& inputs, const pg::GatherOptions& opts) {
  const Tensor in = single(inputs, "gather");
  const int root = static_cast<int>(opts.root_rank);
  const bool is_root = rank() == root;
  const std::vector<Tensor> gathered = is_root ? outputs.at(0) : std::vector<Tensor>{};
  const int n = size();
  OpPtr op = make_op(group_, OpType::kGather, "gather", effective_timeout(opts.timeout),
                     gathered);
  MPI_Comm comm = group_->comm;
  auto scratch = std::make_shared<Tensor>();
  op->start = [in, root, is_root, n, scratch, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(in, "gather");
    if (is_root) *scratch = Tensor::empty({static_cast<int64_t>(in.nbytes()) * n}, DType::kUInt8);
    r.emplace_back();
    check(MPI_Igather(b.data, b.count, MPI_BYTE, is_root ? data_or_dummy(*scratch) : nullptr,
                      b.count, MPI_BYTE, root, comm, &r.back()),
          "MPI_Igather");
  };
  op->done = [gathered, scratch, is_root](const MPI_Status&) {
    if (!is_root) return;
    const char* from = scratch->data_as<char>();
    for (const Tensor& t : gathered) {
      if (t.nbytes() != 0) std::memcpy(t.data(), from, t.nbytes());
      from += t.nbytes();
    }
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::scatter(std::vector<Tensor>& outputs,
                            std::vector<std::vector<Tensor>>& inputs,
                            const pg::ScatterOptions& opts) {
  const Tensor out = single(outputs, "scatter");
  const int root = static_cast<int>(opts.root_rank);
  const bool is_root = rank() == root;
  const std::vector<Tensor> sources = is_root ? inputs.at(0) : std::vector<Tensor>{};
  OpPtr op = make_op(group_, OpType::kScatter, "scatter", effective_timeout(opts.timeout),
                     {out});
  MPI_Comm comm = group_->comm;
  auto scratch = std::make_shared<Tensor>();
  op->start = [out, sources, is_root, root, scratch, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(out, "scatter");
    if (is_root) {
      *scratch = Tensor::empty({static_cast<int64_t>(out.nbytes() * sources.size())},
                               DType::kUInt8);
      char* to = scratch->data_as<char>();
      for (const Tensor& t : sources) {
        if (t.nbytes() != 0) std::memcpy(to, t.data(), t.nbytes());
        to += t.nbytes();
      }
    }
    r.emplace_back();
    check(MPI_Iscatter(is_root ? data_or_dummy(*scratch) : nullptr, b.count, MPI_BYTE, b.data,
                       b.count, MPI_BYTE, root, comm, &r.back()),
          "MPI_Iscatter");
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

namespace {

// Posts a reduce-scatter of `in` (size * out.numel() elements) into `out`; PREMUL_SUM's
// scaling is the caller's.
void post_reduce_scatter(const Tensor& out, const Tensor& in, const ReduceOp& rop, MPI_Comm comm,
                         std::vector<MPI_Request>& r) {
  const Buffer b = typed(out, "reduce_scatter");
  r.emplace_back();
  check(MPI_Ireduce_scatter_block(data_or_dummy(in), b.data, b.count, b.type,
                                  mpi_op(out.dtype(), rop), comm, &r.back()),
        "MPI_Ireduce_scatter_block");
}

}  // namespace

WorkPtr MpiBackend::reduce_scatter_base(Tensor& output, Tensor& input,
                                        const pg::ReduceScatterOptions& opts) {
  std::vector<Tensor> outputs{output}, inputs{input};
  return reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

WorkPtr MpiBackend::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                    std::vector<Tensor>& inputs,
                                                    const pg::ReduceScatterOptions& opts) {
  const ReduceOp rop = opts.reduce_op;
  const int n = size();
  OpPtr op = make_op(group_, OpType::kReduceScatterBase,
                     outputs.size() == 1 ? "reduce_scatter_base"
                                         : "reduce_scatter_tensor_coalesced",
                     effective_timeout(opts.timeout), outputs);
  MPI_Comm comm = group_->comm;
  // Scaled copies of PREMUL_SUM inputs must live until the operation completes.
  auto sources = std::make_shared<std::vector<Tensor>>(inputs);
  op->start = [outs = outputs, sources, rop, comm](std::vector<MPI_Request>& r) {
    for (size_t i = 0; i < outs.size(); ++i) {
      if (rop.kind == ReduceOp::PREMUL_SUM) {
        Tensor& s = (*sources)[i];
        s = s.contiguous_copy();
        core::apply_premul(s.data(), static_cast<size_t>(s.numel()), s.dtype(), rop);
      }
      post_reduce_scatter(outs[i], (*sources)[i], rop, comm, r);
    }
  };
  op->done = [outs = outputs, rop, n](const MPI_Status&) {
    for (const Tensor& t : outs) {
      core::apply_postdiv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), rop, n);
    }
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::reduce_scatter(std::vector<Tensor>& outputs,
                                   std::vector<std::vector<Tensor>>& inputs,
                                   const pg::ReduceScatterOptions& opts) {
  const Tensor out = single(outputs, "reduce_scatter");
  const std::vector<Tensor>& pieces = inputs.at(0);
  // One contiguous input: the pieces one after another.
  Tensor flat = Tensor::empty({out.numel() * static_cast<int64_t>(pieces.size())}, out.dtype());
  char* to = flat.data_as<char>();
  for (const Tensor& t : pieces) {
    if (t.nbytes() != 0) std::memcpy(to, t.data(), t.nbytes());
    to += t.nbytes();
  }
  std::vector<Tensor> outs{out}, ins{flat};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

WorkPtr MpiBackend::alltoall_base(Tensor& output, Tensor& input,
                                  std::vector<int64_t>& output_split_sizes,
                                  std::vector<int64_t>& input_split_sizes,
                                  const pg::AllToAllOptions& opts) {
  const int n = size();
  // Split sizes count rows of dimension 0; MPI gets bytes per rank.
  auto byte_counts = [n](const Tensor& t, const std::vector<int64_t>& splits) {
    const int64_t rows = t.dim() == 0 ? 1 : t.sizes()[0];
    const int64_t row_bytes = rows == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / rows;
    std::vector<int> counts(n), displs(n);
    int64_t offset = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t bytes = (splits.empty() ? rows / n : splits[r]) * row_bytes;
      counts[r] = count_of(static_cast<size_t>(bytes), "alltoall part");
      displs[r] = count_of(static_cast<size_t>(offset), "alltoall offset");
      offset += bytes;
    }
    return std::make_pair(counts, displs);
  };
  auto send = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(
      byte_counts(input, input_split_sizes));
  auto recv = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(
      byte_counts(output, output_split_sizes));
  OpPtr op = make_op(group_, OpType::kAlltoallBase, "alltoall_base",
                     effective_timeout(opts.timeout), {output});
  MPI_Comm comm = group_->comm;
  op->start = [in = input, out = output, send, recv, comm](std::vector<MPI_Request>& r) {
    r.emplace_back();
    check(MPI_Ialltoallv(data_or_dummy(in), send->first.data(), send->second.data(), MPI_BYTE,
                         data_or_dummy(out), recv->first.data(), recv->second.data(), MPI_BYTE,
                         comm, &r.back()),
          "MPI_Ialltoallv");
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                             const pg::AllToAllOptions& opts) {
  const int n = size();
  auto layout = [n](const std::vector<Tensor>& ts) {
    std::vector<int> counts(n), displs(n);
    size_t offset = 0;
    for (int r = 0; r < n; ++r) {
      counts[r] = count_of(ts[r].nbytes(), "alltoall part");
      displs[r] = count_of(offset, "alltoall offset");
      offset += ts[r].nbytes();
    }
    return std::make_tuple(counts, displs, offset);
  };
  auto [send_counts, send_displs, send_total] = layout(inputs);
  auto [recv_counts, recv_displs, recv_total] = layout(outputs);
  auto in = std::make_shared<Tensor>(
      Tensor::empty({static_cast<int64_t>(std::max<size_t>(send_total, 1))}, DType::kUInt8));
  auto out = std::make_shared<Tensor>(
      Tensor::empty({static_cast<int64_t>(std::max<size_t>(recv_total, 1))}, DType::kUInt8));
  char* to = in->data_as<char>();
  for (const Tensor& t : inputs) {
    if (t.nbytes() != 0) std::memcpy(to, t.data(), t.nbytes());
    to += t.nbytes();
  }
  OpPtr op = make_op(group_, OpType::kAlltoall, "alltoall", effective_timeout(opts.timeout),
                     outputs);
  MPI_Comm comm = group_->comm;
  op->start = [in, out, sc = send_counts, sd = send_displs, rc = recv_counts,
               rd = recv_displs, comm](std::vector<MPI_Request>& r) {
    r.emplace_back();
    check(MPI_Ialltoallv(in->data(), sc.data(), sd.data(), MPI_BYTE, out->data(), rc.data(),
                         rd.data(), MPI_BYTE, comm, &r.back()),
          "MPI_Ialltoallv");
  };
  op->done = [out, outs = outputs](const MPI_Status&) {
    const char* from = out->data_as<char>();
    for (const Tensor& t : outs) {
      if (t.nbytes() != 0) std::memcpy(t.data(), from, t.nbytes());
      from += t.nbytes();
    }
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

WorkPtr MpiBackend::barrier(const pg::BarrierOptions& opts) {
  OpPtr op = make_op(group_, OpType::kBarrier, "barrier", effective_timeout(opts.timeout), {});
  op->waits_prior = true;
  MPI_Comm comm = group_->comm;
  op->start = [comm](std::vector<MPI_Request>& r) {
    r.emplace_back();
    check(MPI_Ibarrier(comm, &r.back()), "MPI_Ibarrier");
  };
  return Engine::instance().submit(std::move(op), opts.async_op);
}

// ---------------------------------------------------------------------------------------------
// Point to point

namespace {

// On the caller's thread, which must not call MPI itself: the bound was read at init.
void check_tag(int tag) {
  if (tag < 0 || tag > tag_upper_bound) {
    throw core::InvalidArgument(str_cat("MPI backend: tag ", tag, " is outside MPI's range [0, ",
                                        tag_upper_bound, "]"));
  }
}

}  // namespace

WorkPtr MpiBackend::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  const Tensor t = single(tensors, "send");
  check_tag(tag);
  OpPtr op = make_op(group_, OpType::kSend,
                     str_cat("send to rank ", dst_rank, " (tag ", tag, ")").c_str(), timeout(),
                     {t}, false);
  MPI_Comm comm = group_->comm;
  op->start = [t, dst_rank, tag, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(t, "send");
    r.emplace_back();
    check(MPI_Isend(b.data, b.count, MPI_BYTE, dst_rank, tag, comm, &r.back()), "MPI_Isend");
  };
  return Engine::instance().submit(std::move(op));
}

namespace {

WorkPtr post_recv(const std::shared_ptr<MpiBackend::Group>& group, const Tensor& t, int source,
                  int tag, Millis timeout) {
  check_tag(tag);
  const bool any = source == MPI_ANY_SOURCE;
  const std::string name = any ? str_cat("recv from any rank (tag ", tag, ")")
                               : str_cat("recv from rank ", source, " (tag ", tag, ")");
  OpPtr op = make_op(group, any ? OpType::kRecvAnySource : OpType::kRecv, name.c_str(), timeout,
                     {t}, false);
  MPI_Comm comm = group->comm;
  op->start = [t, source, tag, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(t, "recv");
    r.emplace_back();
    check(MPI_Irecv(b.data, b.count, MPI_BYTE, source, tag, comm, &r.back()), "MPI_Irecv");
  };
  std::weak_ptr<core::Work> weak = op->work;
  const size_t expected = t.nbytes();
  op->done = [weak, expected, name](const MPI_Status& status) {
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    if (static_cast<size_t>(received) != expected) {
      throw core::InvalidArgument(str_cat(name, ": received ", received, " bytes from rank ",
                                          status.MPI_SOURCE, " but the tensor has ", expected));
    }
    if (auto work = weak.lock()) work->set_source_rank(status.MPI_SOURCE);
  };
  return Engine::instance().submit(std::move(op));
}

}  // namespace

WorkPtr MpiBackend::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  return post_recv(group_, single(tensors, "recv"), src_rank, tag, timeout());
}

WorkPtr MpiBackend::recv_anysource(std::vector<Tensor>& tensors, int tag) {
  return post_recv(group_, single(tensors, "recv_anysource"), MPI_ANY_SOURCE, tag, timeout());
}

// ---------------------------------------------------------------------------------------------
// Monitored barrier: every rank checks in with rank 0, which names those that did not come
// within the timeout and then releases the others (on the group's control communicator, so
// user messages never match these).

void MpiBackend::monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) {
  const Millis limit = effective_timeout(opts.timeout);
  {
    // It counts as an operation, as it does for the process group and the other backends.
    std::lock_guard<std::mutex> lock(Engine::instance().mutex());
    ++group_->next_seq;
  }
  if (size() == 1) return;
  MPI_Comm control = group_->control;
  auto message = [&](int peer, bool sending, std::shared_ptr<char> byte, Millis within) {
    OpPtr op = make_op(group_, sending ? OpType::kSend : OpType::kRecv,
                       sending ? "monitored_barrier send" : "monitored_barrier recv", within,
                       {}, false);
    op->start = [peer, sending, byte, control](std::vector<MPI_Request>& r) {
      r.emplace_back();
      if (sending) {
        check(MPI_Isend(byte.get(), 1, MPI_BYTE, peer, 0, control, &r.back()), "MPI_Isend");
      } else {
        check(MPI_Irecv(byte.get(), 1, MPI_BYTE, peer, 0, control, &r.back()), "MPI_Irecv");
      }
    };
    return Engine::instance().submit(std::move(op));
  };
  auto arrived = [](const WorkPtr& work) {
    try {
      work->wait();
      return true;
    } catch (const DistTimeoutError&) {
      return false;
    }
  };
  if (rank() != 0) {
    auto status = std::make_shared<char>(0);
    const bool ok = arrived(message(0, true, std::make_shared<char>(1), limit)) &&
                    arrived(message(0, false, status, limit + limit));
    if (!ok) {
      throw DistTimeoutError(pg::monitored_barrier_unreleased(rank(), limit));
    }
    if (*status != 1) {
      throw DistBackendError(pg::monitored_barrier_others_failed(rank(), limit));
    }
    return;
  }
  std::vector<WorkPtr> arrivals(size());
  for (int r = 1; r < size(); ++r) arrivals[r] = message(r, false, std::make_shared<char>(0), limit);
  std::vector<int> came, missing;
  for (int r = 1; r < size(); ++r) {
    if (!wait_all_ranks && !missing.empty()) {
      if (arrivals[r]->is_completed() && arrivals[r]->is_success()) came.push_back(r);
      continue;
    }
    (arrived(arrivals[r]) ? came : missing).push_back(r);
  }
  const char status = missing.empty() ? 1 : 0;
  std::vector<WorkPtr> releases;
  for (int r : came) releases.push_back(message(r, true, std::make_shared<char>(status), limit));
  for (auto& w : releases) arrived(w);
  if (missing.empty()) return;
  throw DistTimeoutError(pg::monitored_barrier_missing(missing, limit));
}

}  // namespace c10d::backends::mpi
