// ShmBackend with ranks as threads of one process over one HashStore: each thread builds its
// own backend, which maps the other ranks' segments exactly as separate processes would.
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

namespace c10d::backends::shm {
namespace {

using core::DType;
using core::ReduceOp;
using core::Tensor;
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

template <typename Fn>
void run_ranks(const RankRun& run, Fn fn) {
  auto store = std::make_shared<store::HashStore>(10s);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(run.size);
  for (int r = 0; r < run.size; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (run.cpu >= 0) pin_to(run.cpu);
        ShmOptions opts;
        opts.timeout = run.timeout;
        opts.heap_bytes = size_t{64} << 20;
        ShmBackend backend(store, r, run.size, opts);
        fn(r, backend);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < run.size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " of " << run.size;
}

template <typename Fn>
void run_ranks(int size, Fn fn) {
  run_ranks(RankRun{size}, fn);
}

double value_at(int rank, int64_t i) { return static_cast<double>((rank + i) % 3 + 1); }

void set_value(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kFloat32:
      t.data_as<float>()[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      t.data_as<double>()[i] = v;
      break;
    case DType::kInt32:
      t.data_as<int32_t>()[i] = static_cast<int32_t>(v);
      break;
    case DType::kInt64:
      t.data_as<int64_t>()[i] = static_cast<int64_t>(v);
      break;
    case DType::kUInt8:
      t.data_as<uint8_t>()[i] = static_cast<uint8_t>(v);
      break;
    case DType::kInt8:
      t.data_as<int8_t>()[i] = static_cast<int8_t>(v);
      break;
    case DType::kBool:
      t.data_as<uint8_t>()[i] = static_cast<int64_t>(v) % 2;
      break;
    case DType::kFloat16:
      t.data_as<uint16_t>()[i] = core::float_to_half(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      t.data_as<uint16_t>()[i] = core::float_to_bfloat16(static_cast<float>(v));
      break;
    default:
      FAIL() << "unsupported dtype in test";
  }
}

Tensor filled(int64_t n, DType dtype, int rank, int seed = 0) {
  Tensor t = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) set_value(t, i, value_at(rank + seed, i));
  return t;
}

// What every rank should hold after reducing every rank's filled() input.
Tensor expected_reduce(int64_t n, DType dtype, int size, const ReduceOp& op, int seed = 0) {
  Tensor acc = filled(n, dtype, 0, seed);
  core::apply_premul(acc.data(), n, dtype, op);
  for (int r = 1; r < size; ++r) {
    Tensor t = filled(n, dtype, r, seed);
    core::apply_premul(t.data(), n, dtype, op);
    core::reduce(acc.data(), t.data(), n, dtype, op);
  }
  core::apply_postdiv(acc.data(), n, dtype, op, size);
  return acc;
}

void expect_same(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.nbytes(), expected.nbytes()) << what;
  if (actual.nbytes() == 0) return;
  const auto* a = actual.data_as<unsigned char>();
  const auto* e = expected.data_as<unsigned char>();
  for (size_t i = 0; i < actual.nbytes(); ++i) {
    if (a[i] != e[i]) {
      FAIL() << what << ": first difference at byte " << i;
    }
  }
}

TEST(ShmBackend, AllreduceDtypesOpsAndSizes) {
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
      // 0, 1, odd, the float32 mailbox boundary (one_shot_mailbox), one-shot boundary,
      // several pipelined chunks with a ragged tail.
      constexpr auto kMailboxFloats = static_cast<int64_t>(Mailbox::kBytes / sizeof(float));
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, kMailboxFloats, kMailboxFloats + 1,
                        int64_t{1000}, int64_t{8193}, int64_t{600001}}) {
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

TEST(ShmBackend, BroadcastReduceEachRoot) {
  run_ranks(3, [](int rank, ShmBackend& b) {
    for (int64_t n : {0, 5, 300000}) {
      for (int root = 0; root < 3; ++root) {
        Tensor t = filled(n, DType::kFloat64, rank);
        std::vector<Tensor> ts{t};
        pg::BroadcastOptions bo;
        bo.root_rank = root;
        bo.async_op = false;
        b.broadcast(ts, bo)->wait();
        expect_same(t, filled(n, DType::kFloat64, root), "broadcast");
        Tensor r = filled(n, DType::kInt32, rank);
        std::vector<Tensor> rs{r};
        pg::ReduceOptions ro;
        ro.root_rank = root;
        ro.reduce_op = ReduceOp::MAX;
        b.reduce(rs, ro)->wait();
        expect_same(r,
                    rank == root ? expected_reduce(n, DType::kInt32, 3, ReduceOp::MAX)
                                 : filled(n, DType::kInt32, rank),
                    "reduce");
      }
    }
  });
}

// A root may run kRingDepth - 1 broadcasts ahead of a late rank, further than the step
// signatures reach (kSignatureDepth): the late rank checks those steps against the full
// descriptions instead, accepts the matching ones and still names a mismatch after them.
TEST(ShmBackend, RootFarAheadOfALateRank) {
  static_assert(kRingDepth - 1 > kSignatureDepth);
  constexpr int kAhead = static_cast<int>(kRingDepth) - 1;
  std::atomic<int> sent{0};
  run_ranks(2, [&](int rank, ShmBackend& b) {
    auto bcast = [&](int i, int64_t n) {
      Tensor t = filled(n, DType::kInt32, rank == 0 ? i : 100 + i);
      std::vector<Tensor> ts{t};
      pg::BroadcastOptions bo;
      bo.root_rank = 0;
      b.broadcast(ts, bo)->wait();
      return t;
    };
    if (rank == 0) {
      for (int i = 0; i < kAhead; ++i) bcast(i, 7);
      sent = kAhead;  // all of them published without waiting for rank 1
      bcast(kAhead, 9);
      return;
    }
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (sent.load() < kAhead && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_EQ(sent.load(), kAhead) << "the root waited for the late rank";
    for (int i = 0; i < kAhead; ++i) {
      expect_same(bcast(i, 7), filled(7, DType::kInt32, i), "broadcast " + std::to_string(i));
    }
    try {
      bcast(kAhead, 8);  // the root sent 9 elements
      ADD_FAILURE() << "a broadcast of another shape passed";
    } catch (const core::DistBackendError& e) {
      EXPECT_NE(std::string(e.what()).find("9 elements of int32"), std::string::npos) << e.what();
    }
  });
}

TEST(ShmBackend, GathersScatterReduceScatterAlltoall) {
  for (int size : {2, 4}) {
    run_ranks(size, [size](int rank, ShmBackend& b) {
      for (int64_t n : {0, 3, 70001}) {
        Tensor in = filled(n, DType::kInt32, rank);
        std::vector<Tensor> ins{in};
        std::vector<std::vector<Tensor>> outs(1);
        for (int r = 0; r < size; ++r) outs[0].push_back(Tensor::empty({n}, DType::kInt32));
        b.allgather(outs, ins, {})->wait();
        for (int r = 0; r < size; ++r)
          expect_same(outs[0][r], filled(n, DType::kInt32, r), "allgather");
        Tensor flat = Tensor::empty({n * size}, DType::kInt32);
        b.allgather_base(flat, in, {})->wait();
        for (int r = 0; r < size; ++r)
          expect_same(flat.flat_slice(r * n, n), filled(n, DType::kInt32, r), "allgather_base");
        pg::GatherOptions go;
        go.root_rank = size - 1;
        std::vector<std::vector<Tensor>> gouts(1);
        if (rank == size - 1) gouts[0] = outs[0];
        for (auto& t : outs[0]) std::memset(t.data(), 0, t.nbytes());
        b.gather(gouts, ins, go)->wait();
        if (rank == size - 1) {
          for (int r = 0; r < size; ++r)
            expect_same(gouts[0][r], filled(n, DType::kInt32, r), "gather");
        }
        pg::ScatterOptions so;
        so.root_rank = 1;
        std::vector<std::vector<Tensor>> sins(1);
        if (rank == 1) {
          for (int r = 0; r < size; ++r) sins[0].push_back(filled(n, DType::kInt32, r, 5));
        }
        Tensor sout = Tensor::empty({n}, DType::kInt32);
        std::vector<Tensor> souts{sout};
        b.scatter(souts, sins, so)->wait();
        expect_same(sout, filled(n, DType::kInt32, rank, 5), "scatter");
        // reduce_scatter_base: rank r's input is filled(n * size); output slice r of the sum.
        Tensor rs_in = filled(n * size, DType::kInt32, rank);
        Tensor rs_out = Tensor::empty({n}, DType::kInt32);
        pg::ReduceScatterOptions rso;
        rso.reduce_op = ReduceOp::SUM;
        b.reduce_scatter_base(rs_out, rs_in, rso)->wait();
        Tensor full = expected_reduce(n * size, DType::kInt32, size, ReduceOp::SUM);
        expect_same(rs_out, full.flat_slice(rank * n, n), "reduce_scatter_base");
      }
      // Uneven alltoall: rank r sends j + 1 rows to rank j.
      std::vector<int64_t> in_splits, out_splits;
      int64_t in_rows = 0;
      for (int j = 0; j < size; ++j) {
        in_splits.push_back((j + 1) * 1000);
        in_rows += (j + 1) * 1000;
        out_splits.push_back((rank + 1) * 1000);
      }
      Tensor in = Tensor::empty({in_rows}, DType::kInt64);
      int64_t at = 0;
      for (int j = 0; j < size; ++j) {
        for (int64_t i = 0; i < in_splits[j]; ++i) in.data_as<int64_t>()[at++] = 1000 * rank + j;
      }
      Tensor out = Tensor::empty({(rank + 1) * 1000 * size}, DType::kInt64);
      b.alltoall_base(out, in, out_splits, in_splits, {})->wait();
      for (int j = 0; j < size; ++j) {
        for (int64_t i = 0; i < (rank + 1) * 1000; ++i) {
          ASSERT_EQ(out.data_as<int64_t>()[j * (rank + 1) * 1000 + i], 1000 * j + rank);
        }
      }
    });
  }
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

// Small alltoalls finish in the step that exchanges the sizes; one large part anywhere sends
// everyone through the rounds. Sizes the receiver does not expect fail on that rank after the
// exchange, in both cases, and the group stays usable.
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
        EXPECT_NE(
            std::string(e.what()).find("rank " + std::to_string(1 - rank) + " waits in GATHER"),
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

TEST(ShmBackend, SendRecvAnySourceAndTags) {
  run_ranks(3, [](int rank, ShmBackend& b) {
    const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
    // Larger than a channel, posted in the order that deadlocks blocking calls.
    Tensor out = filled(100000, DType::kFloat32, rank);
    Tensor in = Tensor::empty({100000}, DType::kFloat32);
    std::vector<Tensor> outs{out}, ins{in};
    auto s = b.send(outs, next, 0);
    auto r = b.recv(ins, prev, 0);
    s->wait();
    r->wait();
    EXPECT_EQ(r->source_rank(), prev);
    expect_same(in, filled(100000, DType::kFloat32, prev), "ring");
    // Tags: rank 0 sends tag 7 then 3; rank 1 receives 3 first.
    if (rank == 0) {
      Tensor a = filled(4, DType::kInt32, 7), c = filled(4, DType::kInt32, 3);
      std::vector<Tensor> as{a}, cs{c};
      b.send(as, 1, 7)->wait();
      b.send(cs, 1, 3)->wait();
    } else if (rank == 1) {
      Tensor a = Tensor::empty({4}, DType::kInt32), c = Tensor::empty({4}, DType::kInt32);
      std::vector<Tensor> as{a}, cs{c};
      auto w3 = b.recv(cs, 0, 3);
      auto w7 = b.recv(as, 0, 7);
      w3->wait();
      w7->wait();
      expect_same(c, filled(4, DType::kInt32, 3), "tag 3");
      expect_same(a, filled(4, DType::kInt32, 7), "tag 7");
    }
    if (rank == 0) {
      std::vector<int> seen;
      for (int i = 0; i < 2; ++i) {
        Tensor t = Tensor::empty({1}, DType::kInt64);
        std::vector<Tensor> ts{t};
        auto w = b.recv_anysource(ts, 9);
        w->wait();
        EXPECT_EQ(t.data_as<int64_t>()[0], w->source_rank() * 11);
        seen.push_back(w->source_rank());
      }
      std::sort(seen.begin(), seen.end());
      EXPECT_EQ(seen, (std::vector<int>{1, 2}));
    } else {
      Tensor t = Tensor::empty({1}, DType::kInt64);
      t.data_as<int64_t>()[0] = rank * 11;
      std::vector<Tensor> ts{t};
      b.send(ts, 0, 9)->wait();
    }
    b.barrier({})->wait();
  });
}

// Operations run in submission order whoever runs them: the caller (synchronous ones), the
// worker thread, or a caller waiting for a queued one (which runs everything queued before it
// first). Ranks wait in different orders: forward, backward, only the last, or from a second
// thread while the first one waits too.
TEST(ShmBackend, AsyncOperationsCompleteInOrder) {
  run_ranks(4, [](int rank, ShmBackend& b) {
    for (int round = 0; round < 3; ++round) {
      std::vector<Tensor> tensors;
      std::vector<pg::WorkPtr> works;
      for (int i = 0; i < 20; ++i) {
        tensors.push_back(filled(i * 1000, DType::kFloat32, rank, i));
        std::vector<Tensor> ts{tensors.back()};
        pg::AllreduceOptions opts;
        opts.async_op = i % 3 != 0;  // inline ones must queue behind pending async ones
        works.push_back(b.allreduce(ts, opts));
      }
      const int order = (rank + round) % 4;
      if (order == 1) {
        for (int i = 19; i >= 0; --i) works[i]->wait();
      } else if (order == 2) {
        works[19]->wait();
      } else if (order == 3) {
        std::thread other([&] { works[12]->wait(); });
        works[19]->wait();
        other.join();
      }
      for (int i = 0; i < 20; ++i) {
        works[i]->wait();
        expect_same(tensors[i], expected_reduce(i * 1000, DType::kFloat32, 4, ReduceOp::SUM, i),
                    "async " + std::to_string(i) + " wait order " + std::to_string(order));
      }
    }
  });
}

// An asynchronous operation nobody waits for still runs: here rank 0 only waits for a message
// that rank 1 sends after the collective. Both with the worker polling (async operations in
// recent use) and asleep (after a pause).
TEST(ShmBackend, AsyncOperationRunsWithoutWait) {
  run_ranks(2, [](int rank, ShmBackend& b) {
    for (int round = 0; round < 3; ++round) {
      if (round == 2) std::this_thread::sleep_for(400ms);  // past the polling window
      Tensor t = filled(1000, DType::kFloat32, rank, round);
      std::vector<Tensor> ts{t};
      Tensor flag = Tensor::empty({1}, DType::kInt32);
      std::vector<Tensor> fs{flag};
      pg::AllreduceOptions opts;
      if (rank == 0) {
        opts.async_op = true;
        pg::WorkPtr work = b.allreduce(ts, opts);
        b.recv(fs, 1, 5)->wait();
        work->wait();
      } else {
        opts.async_op = false;
        b.allreduce(ts, opts)->wait();
        b.send(fs, 0, 5)->wait();
      }
      expect_same(t, expected_reduce(1000, DType::kFloat32, 2, ReduceOp::SUM, round),
                  "round " + std::to_string(round));
    }
  });
}

TEST(ShmBackend, MonitoredBarrierNamesMissingRank) {
  run_ranks(3, [](int rank, ShmBackend& b) {
    if (rank == 2) {
      std::this_thread::sleep_for(1500ms);
      return;
    }
    pg::BarrierOptions opts;
    opts.timeout = 500ms;
    try {
      b.monitored_barrier(opts, true);
      ADD_FAILURE() << "monitored_barrier passed with rank 2 missing";
    } catch (const core::DistError& e) {
      EXPECT_NE(std::string(e.what()).find("Rank 2"), std::string::npos) << e.what();
    }
  });
}

TEST(ShmBackend, TimeoutNamesOperationAndMissingRank) {
  run_ranks(RankRun{2, 300ms}, [](int rank, ShmBackend& b) {
    if (rank == 1) {
      std::this_thread::sleep_for(800ms);
      return;
    }
    Tensor t = filled(10, DType::kFloat32, rank);
    std::vector<Tensor> ts{t};
    try {
      b.allreduce(ts, {})->wait();
      ADD_FAILURE() << "allreduce passed without rank 1";
    } catch (const core::DistTimeoutError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
      EXPECT_NE(what.find("sequence 0"), std::string::npos) << what;
      EXPECT_NE(what.find("waiting for rank 1"), std::string::npos) << what;
    }
    // The failure sticks: later collectives fail at once.
    EXPECT_THROW(b.allreduce(ts, {})->wait(), core::DistBackendError);
  });
}

TEST(ShmBackend, PeerShutdownFailsWaitersFast) {
  run_ranks(2, [](int rank, ShmBackend& b) {
    if (rank == 1) {
      std::this_thread::sleep_for(100ms);
      b.shutdown();
      return;
    }
    Tensor t = filled(10, DType::kFloat32, rank);
    std::vector<Tensor> ts{t};
    const auto start = std::chrono::steady_clock::now();
    try {
      b.allreduce(ts, {})->wait();
      ADD_FAILURE() << "allreduce passed without rank 1";
    } catch (const core::DistBackendError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  });
}

TEST(ShmBackend, ShutdownDoesNotWaitForPeers) {
  run_ranks(2, [](int rank, ShmBackend& b) {
    if (rank == 1) return;
    Tensor t = filled(10, DType::kFloat32, rank);
    std::vector<Tensor> ts{t};
    auto work = b.allreduce(ts, {});  // async; rank 1 never joins (its backend is gone)
    const auto start = std::chrono::steady_clock::now();
    b.shutdown();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
    EXPECT_THROW(work->wait(), core::DistError);
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
