// ShmBackend tests beyond the shared suite (backend_conformance_test.cc): the shared heap,
// the paths and their thresholds, probed modes, mismatch checks, CPU affinity, latency.
#include "c10d/backends/shm/shm_backend.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>

#include "c10d/backends/shm/segment.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"
#include "c10d/store/hash_store.h"
#include "rank_threads.h"

namespace c10d::backends::shm {
namespace {

using core::DType;
using core::ReduceOp;
using core::Tensor;
using rank_threads::expect_same;
using rank_threads::expected_reduce;
using rank_threads::filled;
using rank_threads::SetOnExit;
using rank_threads::wait_for;
using namespace std::chrono_literals;

struct RankRun {
  int size = 2;
  pg::Millis timeout = 10s;
  int cpu = -1;  // every rank runs on this CPU from before init (ranks share a core), if >= 0
};

// The last CPU this thread may run on (the tests that pin ranks to CPU 0 run beside others
// under ctest -j: sharing that CPU with them slowed them down 2-4x).
int last_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  for (int cpu = CPU_SETSIZE - 1; cpu > 0; --cpu) {
    if (CPU_ISSET(cpu, &set)) return cpu;
  }
  return 0;
}

// Pins the calling thread to `cpu`.
void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ASSERT_EQ(::pthread_setaffinity_np(::pthread_self(), sizeof set, &set), 0);
}

// Runs fn(rank, backend) on one thread per rank, each building its own backend (which maps the
// other ranks' segments exactly as separate processes would).
template <typename Fn>
void run_ranks(const RankRun& run, Fn fn) {
  rank_threads::run_rank_threads(
      run.size,
      [&run](std::shared_ptr<store::Store> store, int rank) {
        if (run.cpu >= 0) pin_to(run.cpu);
        ShmOptions opts;
        opts.timeout = run.timeout;
        opts.heap_bytes = size_t{64} << 20;
        return std::make_unique<ShmBackend>(std::move(store), rank, run.size, opts);
      },
      fn);
}

template <typename Fn>
void run_ranks(int size, Fn fn) {
  run_ranks(RankRun{size}, fn);
}

// The sizes where the allreduce changes path (the shared suite covers 0 to 8193 elements of
// every dtype and op): the float32 mailbox boundary (one_shot_mailbox) and several pipelined
// chunks with a ragged tail.
TEST(ShmBackend, AllreduceAtMailboxAndChunkBoundaries) {
  for (int size : {1, 2, 3}) {
    run_ranks(size, [size](int rank, ShmBackend& b) {
      const std::vector<std::pair<DType, std::vector<ReduceOp>>> cases = {
          {DType::kFloat32,
           {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX, ReduceOp::PRODUCT,
            ReduceOp::premul_sum(2.0)}},
          {DType::kInt32, {ReduceOp::SUM, ReduceOp::MIN, ReduceOp::BXOR, ReduceOp::AVG}},
          {DType::kBFloat16, {ReduceOp::SUM, ReduceOp::MAX}},
          {DType::kBool, {ReduceOp::SUM, ReduceOp::PRODUCT}},
          {DType::kInt8, {ReduceOp::SUM}},
      };
      constexpr auto kMailboxFloats = static_cast<int64_t>(Mailbox::kBytes / sizeof(float));
      for (int64_t n : {kMailboxFloats, kMailboxFloats + 1, int64_t{600001}}) {
        for (const auto& [dtype, ops] : cases) {
          for (const ReduceOp& op : ops) {
            Tensor t = filled(n, dtype, rank);
            std::vector<Tensor> ts{t};
            pg::AllreduceOptions opts;
            opts.reduce_op = op;
            opts.async_op = (n % 2) == 1;
            b.allreduce(ts, opts)->wait();
            expect_same(t, expected_reduce(n, dtype, size, op),
                        "allreduce n=" + std::to_string(n) + " " + std::string(op.name()) + " " +
                            std::string(core::dtype_name(dtype)) + " size " + std::to_string(size));
          }
        }
      }
    });
  }
}

TEST(ShmBackend, ZeroCopyAllreduceOnSharedHeapTensors) {
  run_ranks(3, [](int rank, ShmBackend& b) {
    for (int64_t n : {int64_t{50000}, int64_t{1} << 20}) {
      Tensor t = b.empty({n}, DType::kFloat32);
      Tensor src = filled(n, DType::kFloat32, rank);
      std::memcpy(t.data(), src.data(), src.nbytes());
      std::vector<Tensor> ts{t};
      pg::AllreduceOptions opts;
      opts.reduce_op = ReduceOp::SUM;
      b.allreduce(ts, opts)->wait();
      expect_same(t, expected_reduce(n, DType::kFloat32, 3, ReduceOp::SUM), "zero-copy SUM");
      std::memcpy(t.data(), src.data(), src.nbytes());
      opts.reduce_op = ReduceOp::AVG;
      b.allreduce(ts, opts)->wait();
      Tensor avg = expected_reduce(n, DType::kFloat32, 3, ReduceOp::AVG);
      for (int64_t i = 0; i < n; i += 997) {
        ASSERT_NEAR(t.data_as<float>()[i], avg.data_as<float>()[i], 1e-5);
      }
    }
  });
  // Broadcast from a heap tensor and allgather of heap inputs read the peers in place.
  run_ranks(3, [](int rank, ShmBackend& b) {
    const int64_t n = 300000;
    Tensor t = b.empty({n}, DType::kInt32);
    Tensor src = filled(n, DType::kInt32, rank);
    std::memcpy(t.data(), src.data(), src.nbytes());
    Tensor flat = Tensor::empty({3 * n}, DType::kInt32);
    b.allgather_base(flat, t, {})->wait();
    for (int r = 0; r < 3; ++r) {
      expect_same(flat.flat_slice(r * n, n), filled(n, DType::kInt32, r), "heap allgather");
    }
    std::vector<Tensor> ts{t};
    pg::BroadcastOptions bo;
    bo.root_rank = 2;
    b.broadcast(ts, bo)->wait();
    expect_same(t, filled(n, DType::kInt32, 2), "heap broadcast");
  });
  // A mix of heap and ordinary tensors takes the ordinary path on every rank.
  run_ranks(2, [](int rank, ShmBackend& b) {
    const int64_t n = 100000;
    Tensor t = rank == 0 ? b.empty({n}, DType::kInt64) : Tensor::empty({n}, DType::kInt64);
    Tensor src = filled(n, DType::kInt64, rank);
    std::memcpy(t.data(), src.data(), src.nbytes());
    std::vector<Tensor> ts{t};
    b.allreduce(ts, pg::AllreduceOptions{})->wait();
    expect_same(t, expected_reduce(n, DType::kInt64, 2, ReduceOp::SUM), "mixed heap");
  });
}

// A root of many broadcasts waits at each for a late rank to reach it (not to finish it):
// the late rank still gets every result exactly, and a mismatch after them fails on both
// ranks, the root too, naming the other's shape.
TEST(ShmBackend, RootOfManyBroadcastsAndALateRank) {
  constexpr int kCalls = static_cast<int>(kRingDepth) + 3;
  run_ranks(2, [&](int rank, ShmBackend& b) {
    auto bcast = [&](int i, int64_t n) {
      Tensor t = filled(n, DType::kInt32, rank == 0 ? i : 100 + i);
      std::vector<Tensor> ts{t};
      pg::BroadcastOptions bo;
      bo.root_rank = 0;
      b.broadcast(ts, bo)->wait();
      return t;
    };
    if (rank == 1) std::this_thread::sleep_for(50ms);
    for (int i = 0; i < kCalls; ++i) {
      Tensor got = bcast(i, 7);
      if (rank == 1)
        expect_same(got, filled(7, DType::kInt32, i), "broadcast " + std::to_string(i));
    }
    try {
      bcast(kCalls, rank == 0 ? 9 : 8);
      ADD_FAILURE() << "a broadcast of another shape passed on rank " << rank;
    } catch (const core::DistBackendError& e) {
      const std::string theirs = rank == 0 ? "8 elements of int32" : "9 elements of int32";
      EXPECT_NE(std::string(e.what()).find(theirs), std::string::npos) << e.what();
    }
  });
}

// Large messages copy straight between the ranks' memory when the kernel allows it, else go
// through the slots, written with plain or streaming stores; all must give the same results
// (C10D_SHM_CMA and C10D_SHM_STREAM choose).
TEST(ShmBackend, LargeMessagesDirectAndThroughSlots) {
  for (const auto& [cma, stream] :
       {std::pair{"1", "auto"}, {"0", "auto"}, {"0", "0"}, {"0", "1"}}) {
    ::setenv("C10D_SHM_CMA", cma, 1);
    ::setenv("C10D_SHM_STREAM", stream, 1);
    run_ranks(3, [cma = cma, stream = stream](int rank, ShmBackend& b) {
      const std::string mode = std::string(" C10D_SHM_CMA=") + cma + " C10D_SHM_STREAM=" + stream;
      const int64_t n = (int64_t{9} << 20) / 4 + 5;
      // Allreduce goes direct from 96 MiB when ranks outnumber cores (3 ranks here) and from
      // 64 MiB with a core per rank: 97 MiB is past both (only where the kernel path is on).
      std::vector<int64_t> counts{n};
      if (std::string(cma) == "1") counts.push_back((int64_t{97} << 20) / 4 + 5);
      for (const ReduceOp& op : {ReduceOp(ReduceOp::SUM), ReduceOp::premul_sum(0.5)}) {
        for (int64_t count : counts) {
          Tensor t = filled(count, DType::kFloat32, rank);
          std::vector<Tensor> ts{t};
          pg::AllreduceOptions opts;
          opts.reduce_op = op;
          b.allreduce(ts, opts)->wait();
          expect_same(t, expected_reduce(count, DType::kFloat32, 3, op), "allreduce" + mode);
        }
      }
      pg::BroadcastOptions bo;
      bo.root_rank = 2;
      Tensor bt = filled(n, DType::kFloat32, rank);
      std::vector<Tensor> bts{bt};
      b.broadcast(bts, bo)->wait();
      expect_same(bt, filled(n, DType::kFloat32, 2), "broadcast" + mode);
      // Scatter and gather of 9 MiB per rank: past their direct thresholds (4 and 8 MiB).
      pg::ScatterOptions so;
      so.root_rank = 1;
      std::vector<std::vector<Tensor>> parts(1);
      if (rank == 1) {
        for (int r = 0; r < 3; ++r) parts[0].push_back(filled(n, DType::kFloat32, r, 7));
      }
      std::vector<Tensor> mine{Tensor::empty({n}, DType::kFloat32)};
      b.scatter(mine, parts, so)->wait();
      expect_same(mine[0], filled(n, DType::kFloat32, rank, 7), "scatter" + mode);
      pg::GatherOptions go;
      go.root_rank = 0;
      std::vector<std::vector<Tensor>> gathered(1);
      if (rank == 0) {
        for (int r = 0; r < 3; ++r) gathered[0].push_back(Tensor::empty({n}, DType::kFloat32));
      }
      b.gather(gathered, mine, go)->wait();
      for (int r = 0; r < 3 && rank == 0; ++r) {
        expect_same(gathered[0][r], filled(n, DType::kFloat32, r, 7), "gather" + mode);
      }
      // Uneven alltoall of 1.6-4.8 MB per pair: the largest past the direct threshold (4 MiB).
      constexpr int64_t kRows = 200000;
      std::vector<int64_t> in_splits, out_splits;
      int64_t in_rows = 0;
      for (int j = 0; j < 3; ++j) {
        in_splits.push_back((j + 1) * kRows);
        in_rows += (j + 1) * kRows;
        out_splits.push_back((rank + 1) * kRows);
      }
      Tensor in = Tensor::empty({in_rows}, DType::kInt64);
      int64_t at = 0;
      for (int j = 0; j < 3; ++j) {
        for (int64_t i = 0; i < in_splits[j]; ++i) in.data_as<int64_t>()[at++] = 1000 * rank + j;
      }
      Tensor out = Tensor::empty({(rank + 1) * kRows * 3}, DType::kInt64);
      b.alltoall_base(out, in, out_splits, in_splits, {})->wait();
      for (int j = 0; j < 3; ++j) {
        for (int64_t i = 0; i < (rank + 1) * kRows; ++i) {
          ASSERT_EQ(out.data_as<int64_t>()[j * (rank + 1) * kRows + i], 1000 * j + rank) << mode;
        }
      }
    });
  }
  ::unsetenv("C10D_SHM_CMA");
  ::unsetenv("C10D_SHM_STREAM");
}

// With C10D_SHM_STREAM=auto, repeated allreduces of one size are probed in every mode, which
// rank 0 proposes and every rank follows one operation later: plain and streaming stores,
// and with a core per rank 256 KiB and 1 MiB chunks. Every result must stay exact
// throughout, also when the size, and so the probe, changes.
TEST(ShmBackend, ProbedModesKeepResultsExact) {
  ::setenv("C10D_SHM_STREAM", "auto", 1);
  // 2 ranks with a core each where the machine has 2 CPUs, and 3 ranks sharing one, whose
  // chunks (a third of a slot) divide none of the sizes.
  for (const RankRun run : {RankRun{2}, RankRun{.size = 3, .cpu = last_cpu()}}) {
    run_ranks(run, [size = run.size](int rank, ShmBackend& b) {
      // 400 KB, 1.2 MB and 2.4 MB + 12 bytes: one, two and three size classes, all chunked.
      for (const int64_t n : {int64_t{100000}, int64_t{300000}, int64_t{600003}}) {
        const Tensor want = expected_reduce(n, DType::kFloat32, size, ReduceOp::SUM);
        const Tensor mine = filled(n, DType::kFloat32, rank);
        // 8 held, 3 in the held mode, 4 in each of the 3 others, and some to spare.
        for (int i = 0; i < 32; ++i) {
          Tensor t = Tensor::empty({n}, DType::kFloat32);
          std::memcpy(t.data(), mine.data(), mine.nbytes());
          std::vector<Tensor> ts{t};
          b.allreduce(ts, {})->wait();
          expect_same(t, want, "allreduce n=" + std::to_string(n) + " #" + std::to_string(i));
        }
      }
    });
  }
  ::unsetenv("C10D_SHM_STREAM");
}

// Rank 0 times a cache line's round trip with rank 1 a few times a second, and every rank
// follows its verdict (far apart: streaming stores; large allreduces through the kernel from
// a smaller size) while results stay exact. The threshold decides the verdict here: 0 ns
// (every trip counts as far) or a minute (none does).
TEST(ShmBackend, PlacementWatchReachesEveryRankAndKeepsResultsExact) {
  if (::sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  ::setenv("C10D_SHM_STREAM", "auto", 1);
  for (const bool far : {true, false}) {
    ::setenv("C10D_SHM_FAR_TRIP_NS", far ? "0" : "60000000000", 1);
    run_ranks(2, [far](int rank, ShmBackend& b) {
      const int64_t n = 300000;  // 1.2 MB: the pipelined allreduce, through the slots
      const Tensor want = expected_reduce(n, DType::kFloat32, 2, ReduceOp::SUM);
      const Tensor mine = filled(n, DType::kFloat32, rank);
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      Tensor status = Tensor::empty({2}, DType::kInt64);  // ranks that heard it; expired
      std::vector<Tensor> ss{status};
      int64_t heard = 0;
      for (int i = 0; heard < 2; ++i) {
        Tensor t = Tensor::empty({n}, DType::kFloat32);
        std::memcpy(t.data(), mine.data(), mine.nbytes());
        std::vector<Tensor> ts{t};
        b.allreduce(ts, {})->wait();
        expect_same(t, want, "allreduce #" + std::to_string(i));
        status.data_as<int64_t>()[0] = b.cpus_far_apart() == std::optional<bool>(far);
        status.data_as<int64_t>()[1] = std::chrono::steady_clock::now() > deadline;
        b.allreduce(ss, {})->wait();
        heard = status.data_as<int64_t>()[0];
        if (status.data_as<int64_t>()[1] != 0) break;
      }
      EXPECT_EQ(heard, 2) << (far ? "far apart" : "close") << ", rank " << rank << " heard "
                          << (b.cpus_far_apart() ? (*b.cpus_far_apart() ? "far" : "close")
                                                 : "nothing");
      // Past the size where far apart ranks go direct (an odd count: the pieces are uneven).
      const int64_t large = (int64_t{16} << 20) / 4 + 5;
      const Tensor large_want = expected_reduce(large, DType::kFloat32, 2, ReduceOp::SUM);
      Tensor t = filled(large, DType::kFloat32, rank);
      std::vector<Tensor> ts{t};
      b.allreduce(ts, {})->wait();
      expect_same(t, large_want, far ? "16 MiB allreduce, far apart" : "16 MiB allreduce, close");
    });
  }
  ::unsetenv("C10D_SHM_FAR_TRIP_NS");
  ::unsetenv("C10D_SHM_STREAM");
}

// PREMUL_SUM scales each input before the sum on every path, the zero-copy one too: float16
// inputs of 40000 with factor 0.5 sum to 20000 per rank, while 40000 + 40000 overflows.
TEST(ShmBackend, PremulSumScalesEachInputOnEveryPath) {
  run_ranks(2, [](int, ShmBackend& b) {
    const int64_t n = 1 << 17;  // past the one-shot size, so heap tensors go zero-copy
    const uint16_t half_40000 = 0x78e2, half_40000_sum = half_40000;  // 2 * 0.5 * 40000
    for (bool heap : {false, true}) {
      Tensor t = heap ? b.empty({n}, DType::kFloat16) : Tensor::empty({n}, DType::kFloat16);
      for (int64_t i = 0; i < n; ++i) t.data_as<uint16_t>()[i] = half_40000;
      std::vector<Tensor> ts{t};
      pg::AllreduceOptions opts;
      opts.reduce_op = ReduceOp::premul_sum(0.5);
      b.allreduce(ts, opts)->wait();
      for (int64_t i = 0; i < n; i += 1021) {
        ASSERT_EQ(t.data_as<uint16_t>()[i], half_40000_sum) << "heap " << heap << " at " << i;
      }
    }
  });
}

// Collectives that only move bytes still check that the ranks agree on the dtype.
TEST(ShmBackend, MovingCollectivesRefuseDifferentDtypes) {
  for (int64_t n : {int64_t{4}, int64_t{100000}}) {  // a failure breaks the group: one each
    run_ranks(2, [n](int rank, ShmBackend& b) {
      const DType mine = rank == 0 ? DType::kFloat32 : DType::kInt32;
      Tensor in = Tensor::empty({n}, mine);
      Tensor out = Tensor::empty({2 * n}, mine);
      try {
        b.allgather_base(out, in, {})->wait();
        ADD_FAILURE() << "an all_gather of float32 and int32 passed, n " << n;
      } catch (const core::DistBackendError& e) {
        const std::string theirs = rank == 0 ? "of int32" : "of float32";
        EXPECT_NE(std::string(e.what()).find(theirs), std::string::npos) << e.what();
      }
    });
  }
}

// Every rank takes part in a reduce's steps, so ranks naming different roots fail on each.
TEST(ShmBackend, ReduceRefusesDifferentRoots) {
  for (int64_t n : {int64_t{4}, int64_t{100000}}) {
    run_ranks(2, [n](int rank, ShmBackend& b) {
      std::vector<Tensor> ts{filled(n, DType::kFloat32, rank)};
      pg::ReduceOptions opts;
      opts.root_rank = rank;  // each rank names itself
      try {
        b.reduce(ts, opts)->wait();
        ADD_FAILURE() << "a reduce with two roots passed, n " << n;
      } catch (const core::DistBackendError& e) {
        const std::string theirs = "root " + std::to_string(1 - rank);
        EXPECT_NE(std::string(e.what()).find(theirs), std::string::npos) << e.what();
      }
    });
  }
}

// Two ranks that each gather to themselves wait for each other's data: they fail naming the
// other's operation once they have waited a while, not at the timeout (60 s here).
TEST(ShmBackend, RanksWaitingForEachOtherInDifferentOperationsFail) {
  for (int64_t n : {int64_t{4}, int64_t{100000}}) {
    const auto start = std::chrono::steady_clock::now();
    run_ranks(2, [n](int rank, ShmBackend& b) {
      std::vector<std::vector<Tensor>> outs{
          {Tensor::empty({n}, DType::kInt32), Tensor::empty({n}, DType::kInt32)}};
      std::vector<Tensor> ins{filled(n, DType::kInt32, rank)};
      pg::GatherOptions opts;
      opts.root_rank = rank;
      opts.timeout = std::chrono::milliseconds(60000);
      try {
        b.gather(outs, ins, opts)->wait();
        ADD_FAILURE() << "gathers to two roots passed, n " << n;
      } catch (const core::DistBackendError& e) {
        EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(1 - rank) + " is in GATHER"),
                  std::string::npos)
            << e.what();
      }
    });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << n;
  }
}

// The root of a one-sided broadcast or scatter waits for nobody, so ranks that each name
// themselves as root pass the operation itself; they fail at the next wait that sees the peer
// past that step (the barrier after one, or within a loop of them), naming the peer's root.
TEST(ShmBackend, OneSidedRootsThatDisagreeFailAtTheNextWait) {
  // Large ones go through the kernel and wait for every rank: they fail in the operation.
  // A rank may also see its peer shut down after it failed first.
  auto expect_peer_root = [](int rank, const core::DistBackendError& e) {
    const std::string what = e.what();
    const std::string peer = std::to_string(1 - rank);
    EXPECT_TRUE(what.find("root " + peer + " at th") != std::string::npos ||
                what.find("rank " + peer + " shut down") != std::string::npos)
        << what;
  };
  for (int64_t n : {int64_t{4}, int64_t{5000}, int64_t{300000}}) {
    run_ranks(2, [&](int rank, ShmBackend& b) {
      std::vector<Tensor> ts{filled(n, DType::kFloat32, rank)};
      pg::BroadcastOptions opts;
      opts.root_rank = rank;
      try {
        b.broadcast(ts, opts)->wait();
        b.barrier({})->wait();
        ADD_FAILURE() << "broadcasts from two roots and a barrier passed, n " << n;
      } catch (const core::DistBackendError& e) {
        expect_peer_root(rank, e);
      }
    });
    run_ranks(2, [&](int rank, ShmBackend& b) {
      std::vector<Tensor> out{Tensor::empty({n}, DType::kFloat32)};
      std::vector<std::vector<Tensor>> parts{
          {filled(n, DType::kFloat32, 7), filled(n, DType::kFloat32, 8)}};
      pg::ScatterOptions opts;
      opts.root_rank = rank;
      try {
        b.scatter(out, parts, opts)->wait();
        b.barrier({})->wait();
        ADD_FAILURE() << "scatters from two roots and a barrier passed, n " << n;
      } catch (const core::DistBackendError& e) {
        expect_peer_root(rank, e);
      }
    });
  }
  run_ranks(2, [&](int rank, ShmBackend& b) {
    std::vector<Tensor> ts{filled(4, DType::kInt32, rank)};
    pg::BroadcastOptions opts;
    opts.root_rank = rank;
    try {
      for (int i = 0; i < 1000; ++i) b.broadcast(ts, opts)->wait();
      ADD_FAILURE() << "1000 broadcasts from two roots passed";
    } catch (const core::DistBackendError& e) {
      expect_peer_root(rank, e);
    }
  });
}

// Small alltoalls finish in the step that exchanges the sizes; one large part anywhere sends
// everyone through the rounds. Sizes the receiver does not expect fail on that rank after the
// exchange, in both cases, and the group stays usable.
TEST(ShmBackend, AlltoallSmallLargeMixedAndMismatchedSizes) {
  run_ranks(2, [](int rank, ShmBackend& b) {
    for (const int64_t big : {int64_t{16}, int64_t{300000}}) {  // rank 1 -> rank 0 part
      std::vector<int64_t> in_splits =
          rank == 0 ? std::vector<int64_t>{3, 5} : std::vector<int64_t>{big, 7};
      std::vector<int64_t> out_splits =
          rank == 0 ? std::vector<int64_t>{3, big} : std::vector<int64_t>{5, 7};
      Tensor in = Tensor::empty({in_splits[0] + in_splits[1]}, DType::kInt64);
      for (int64_t i = 0; i < in.numel(); ++i) in.data_as<int64_t>()[i] = 1000000 * rank + i;
      Tensor out = Tensor::empty({out_splits[0] + out_splits[1]}, DType::kInt64);
      b.alltoall_base(out, in, out_splits, in_splits, {})->wait();
      // Part j of `out` is rank j's part for this rank: elements at offset
      // (parts before this rank in j's input) onward.
      int64_t at = 0;
      for (int j = 0; j < 2; ++j) {
        const int64_t from = rank == 0 ? 0 : (j == 0 ? 3 : big);
        for (int64_t i = 0; i < out_splits[j]; ++i) {
          ASSERT_EQ(out.data_as<int64_t>()[at + i], 1000000 * j + from + i)
              << "big " << big << " part " << j << " element " << i;
        }
        at += out_splits[j];
      }
      // Rank 1 expects 2 elements fewer from rank 0 than rank 0 sends.
      std::vector<int64_t> wrong = rank == 0 ? out_splits : std::vector<int64_t>{3, 7};
      Tensor out2 = Tensor::empty({wrong[0] + wrong[1]}, DType::kInt64);
      if (rank == 1) {
        try {
          b.alltoall_base(out2, in, wrong, in_splits, {})->wait();
          ADD_FAILURE() << "a size mismatch went unnoticed";
        } catch (const core::InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("rank 0 sends 40 bytes but this rank expects 24"),
                    std::string::npos)
              << e.what();
        }
      } else {
        b.alltoall_base(out2, in, wrong, in_splits, {})->wait();
      }
    }
  });
}

// What the shared suite checks of a timeout, plus the rank it waited for, and that the failure
// sticks: the step flags no longer agree, so later collectives fail at once.
TEST(ShmBackend, TimeoutNamesMissingRankAndFailsLaterCollectives) {
  std::atomic<bool> done{false};
  run_ranks(RankRun{2, 1s}, [&](int rank, ShmBackend& b) {
    if (rank == 1) {
      wait_for(done, 60s);  // alive, but never joins
      return;
    }
    SetOnExit release{done};
    std::vector<Tensor> ts{filled(10, DType::kFloat32, rank)};
    try {
      b.allreduce(ts, {})->wait();
      ADD_FAILURE() << "allreduce passed without rank 1";
    } catch (const core::DistTimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("waiting for rank 1"), std::string::npos) << e.what();
    }
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(b.allreduce(ts, {})->wait(), core::DistBackendError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);  // not another 1 s timeout
  });
}

// With streaming stores a reduce's non-root sends its reduced piece from a private buffer;
// the root must still get every piece (sizes of one and of several chunks).
TEST(ShmBackend, StreamingReduceReachesTheRoot) {
  ::setenv("C10D_SHM_STREAM", "1", 1);
  run_ranks(2, [](int rank, ShmBackend& b) {
    for (const int64_t n : {int64_t{20000}, int64_t{300001}}) {
      const Tensor want = expected_reduce(n, DType::kFloat32, 2, ReduceOp::SUM);
      for (const int root : {0, 1}) {
        Tensor t = filled(n, DType::kFloat32, rank);
        std::vector<Tensor> ts{t};
        pg::ReduceOptions opts;
        opts.root_rank = root;
        b.reduce(ts, opts)->wait();
        if (rank == root) expect_same(t, want, "reduce n=" + std::to_string(n));
      }
    }
  });
  ::unsetenv("C10D_SHM_STREAM");
}

// The ranks agree on how many CPUs they have together (the union of their affinity masks),
// which decides the algorithms, so it must not depend on which rank asks.
TEST(ShmSegment, CpusAreTheUnionOfTheRanksAffinity) {
  if (::sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  for (const bool apart : {false, true}) {
    auto store = std::make_shared<store::HashStore>(10s);
    std::vector<int> seen(2, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        pin_to(apart ? r : 0);
        Segment seg(*store, r, 2, size_t{1} << 20, 10s);
        seen[r] = seg.cpus();
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(seen[0], apart ? 2 : 1) << (apart ? "ranks on CPUs 0 and 1" : "both on CPU 0");
    EXPECT_EQ(seen[1], seen[0]);
  }
}

// Ranks moved onto one CPU after init (which found a CPU per rank) must not spin for each
// other: every wait then spun its whole spin phase (200 us) before the waiter yielded, so in
// 4000 allreduces the two ranks burned at least ~0.8 s of CPU between them; yielding at once
// they burn a few tens of ms. CPU time, not wall time, is what tells the two apart: another
// program on CPU 0 (ctest runs tests side by side) stretches the wall time of the good case
// past the bad case's floor (a CI run: 505 ms for the 4000 calls), but not the ranks' own
// CPU time.
TEST(ShmBackend, RanksSharingACpuAfterInitDoNotSpinForEachOther) {
  if (::sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  std::atomic<int64_t> cpu_ns{0};
  const auto thread_cpu_ns = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  };
  run_ranks(2, [&](int rank, ShmBackend& b) {
    pin_to(0);
    Tensor t = filled(1, DType::kFloat32, rank);
    std::vector<Tensor> ts{t};
    pg::AllreduceOptions opts;
    opts.async_op = false;
    for (int i = 0; i < 10; ++i) b.allreduce(ts, opts);
    const int64_t start = thread_cpu_ns();
    for (int i = 0; i < 4000; ++i) b.allreduce(ts, opts);
    cpu_ns += thread_cpu_ns() - start;
  });
  EXPECT_LT(cpu_ns.load(), 400'000'000) << "CPU time of both ranks together, in ns";
}

TEST(ShmBackend, AllreduceLatency) {
  for (int size : {2, 4}) {
    run_ranks(size, [size](int rank, ShmBackend& b) {
      for (int64_t n : {int64_t{1}, int64_t{256}, int64_t{1} << 18}) {
        Tensor t = filled(n, DType::kFloat32, rank);
        std::vector<Tensor> ts{t};
        pg::AllreduceOptions opts;
        opts.async_op = false;
        const int iters = n > 1000 ? 200 : 20000;
        for (int i = 0; i < iters / 10; ++i) b.allreduce(ts, opts);
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) b.allreduce(ts, opts);
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count() /
            iters;
        if (rank == 0) {
          std::printf("[shm] allreduce %d ranks %8zu bytes: %8.2f us (busbw %.2f GB/s)\n", size,
                      static_cast<size_t>(n * 4), us, n * 4 / us / 1e3 * 2.0 * (size - 1) / size);
        }
      }
    });
  }
}

}  // namespace
}  // namespace c10d::backends::shm
