// One behavioural suite run against every backend whose ranks can be threads (typed tests):
// Gloo and shm. MPI's conformance is covered by the Python suite (tests/python/test_collectives.py
// runs every case on mpi), as its ranks are processes started by mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"
#include "rank_threads.h"
#ifdef C10D_TEST_GLOO
#include "c10d/backends/gloo/gloo_backend.h"
#endif
#ifdef C10D_TEST_SHM
#include "c10d/backends/shm/shm_backend.h"
#endif
#ifdef C10D_TEST_HIER
#include "c10d/backends/hier/hier_backend.h"
#endif

namespace c10d::backends {
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

// Each factory builds one rank's backend over the store all ranks share.
#ifdef C10D_TEST_GLOO
struct GlooFactory {
  using Backend = gloo::GlooBackend;
  static std::unique_ptr<Backend> make(std::shared_ptr<store::Store> store, int rank, int size,
                                       pg::Millis timeout) {
    static const gloo::DevicePtr loopback = Backend::create_device_for_hostname("127.0.0.1");
    gloo::GlooOptions opts;
    opts.devices = {loopback};
    opts.timeout = timeout;
    return std::make_unique<Backend>(std::move(store), rank, size, opts);
  }
};
#endif
#ifdef C10D_TEST_SHM
struct ShmFactory {
  using Backend = shm::ShmBackend;
  static std::unique_ptr<Backend> make(std::shared_ptr<store::Store> store, int rank, int size,
                                       pg::Millis timeout) {
    shm::ShmOptions opts;
    opts.timeout = timeout;
    opts.heap_bytes = size_t{64} << 20;
    return std::make_unique<Backend>(std::move(store), rank, size, opts);
  }
};
#endif
#ifdef C10D_TEST_HIER
// Two hosts of the ranks' first and second half (one host for a single rank): shm inside
// each, the ring and Gloo between them, all on this machine.
struct HierFactory {
  using Backend = hier::HierBackend;
  static std::unique_ptr<Backend> make(std::shared_ptr<store::Store> store, int rank, int size,
                                       pg::Millis timeout) {
    hier::Topology t;
    const int first = (size + 1) / 2;
    t.hosts.resize(size > 1 ? 2 : 1);
    for (int r = 0; r < size; ++r) t.hosts[r < first ? 0 : 1].push_back(r);
    t.host = rank < first ? 0 : 1;
    t.local_rank = rank < first ? rank : rank - first;
    return std::make_unique<Backend>(std::move(store), rank, size, std::move(t), timeout);
  }
};
#endif

struct RankRun {
  int size = 2;
  pg::Millis timeout = 10s;  // the backends' own (rendezvous and operations)
};

template <typename Factory>
class BackendConformance : public ::testing::Test {
 protected:
  // Runs fn(rank, backend) on one thread per rank, each building its own backend.
  template <typename Fn>
  static void run_ranks(const RankRun& run, Fn fn) {
    rank_threads::run_rank_threads(
        run.size,
        [&run](std::shared_ptr<store::Store> store, int rank) {
          return Factory::make(std::move(store), rank, run.size, run.timeout);
        },
        fn);
  }
  template <typename Fn>
  static void run_ranks(int size, Fn fn) {
    run_ranks(RankRun{size}, fn);
  }
};

#if defined(C10D_TEST_HIER)
using Factories = ::testing::Types<GlooFactory, ShmFactory, HierFactory>;
#elif defined(C10D_TEST_GLOO) && defined(C10D_TEST_SHM)
using Factories = ::testing::Types<GlooFactory, ShmFactory>;
#elif defined(C10D_TEST_GLOO)
using Factories = ::testing::Types<GlooFactory>;
#else
using Factories = ::testing::Types<ShmFactory>;
#endif
TYPED_TEST_SUITE(BackendConformance, Factories);

const int64_t kCounts[] = {0, 1, 7, 1000, 70001};

std::string at(int64_t n, int root = -1) {
  return " n " + std::to_string(n) + (root >= 0 ? " root " + std::to_string(root) : "");
}

// Async operations go to the backend's worker, sync ones run on the caller's thread: the
// tests alternate between the two.
TYPED_TEST(BackendConformance, AllreduceEveryDtypeAndOp) {
  std::vector<ReduceOp> ops;
  for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
    if (k == ReduceOp::PREMUL_SUM) {
      ops.push_back(ReduceOp::premul_sum(2.0));
    } else if (k != ReduceOp::UNUSED) {
      ops.push_back(ReduceOp(static_cast<ReduceOp::Kind>(k)));
    }
  }
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [&](int rank, auto& b) {
      for (int d = 0; d < core::kNumDTypes; ++d) {
        const auto dtype = static_cast<DType>(d);
        for (const ReduceOp& op : ops) {
          if (!core::is_valid_reduce_op(dtype, op)) continue;
          for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{8193}}) {
            std::vector<Tensor> ts{filled(n, dtype, rank)};
            pg::AllreduceOptions opts;
            opts.reduce_op = op;
            opts.async_op = n % 2 == 1;
            b.allreduce(ts, opts)->wait();
            expect_same(ts[0], expected_reduce(n, dtype, size, op),
                        std::string(core::dtype_name(dtype)) + " " + std::string(op.name()) +
                            at(n) + " size " + std::to_string(size));
          }
        }
      }
    });
  }
}

TYPED_TEST(BackendConformance, AllreduceManyAsyncInFlight) {
  this->run_ranks(3, [](int rank, auto& b) {
    std::vector<std::vector<Tensor>> tensors;
    std::vector<pg::WorkPtr> works;
    for (int i = 0; i < 40; ++i) tensors.push_back({filled(1 + i % 5, DType::kFloat32, rank)});
    for (auto& t : tensors) works.push_back(b.allreduce(t, pg::AllreduceOptions{}));
    for (size_t i = 0; i < works.size(); ++i) {
      works[i]->wait();
      EXPECT_TRUE(works[i]->is_success());
      expect_same(tensors[i][0], expected_reduce(1 + i % 5, DType::kFloat32, 3, ReduceOp::SUM),
                  "allreduce " + std::to_string(i));
    }
    if constexpr (requires { b.next_sequence(); }) {  // hier's sub-backends count their own
      EXPECT_EQ(b.next_sequence(), 40u);
    }
  });
}

// Operations run in submission order whoever runs them: the caller (synchronous ones), a
// worker thread, or a caller waiting for a queued one. Ranks wait in different orders:
// forward, backward, only the last, or from a second thread while the first one waits too.
TYPED_TEST(BackendConformance, AsyncOperationsCompleteInOrder) {
  this->run_ranks(4, [](int rank, auto& b) {
    for (int round = 0; round < 3; ++round) {
      std::vector<Tensor> tensors;
      std::vector<pg::WorkPtr> works;
      for (int i = 0; i < 20; ++i) {
        tensors.push_back(filled(i * 1000, DType::kFloat32, rank, i));
        std::vector<Tensor> ts{tensors.back()};
        pg::AllreduceOptions opts;
        opts.async_op = i % 3 != 0;  // sync ones between pending async ones
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

// An asynchronous operation nobody waits for still runs: rank 0 only waits for a message that
// rank 1 sends after the collective. Also after a pause (a worker that went to sleep).
TYPED_TEST(BackendConformance, AsyncOperationRunsWithoutWait) {
  this->run_ranks(2, [](int rank, auto& b) {
    for (int round = 0; round < 3; ++round) {
      if (round == 2) std::this_thread::sleep_for(400ms);
      Tensor t = filled(1000, DType::kFloat32, rank, round);
      std::vector<Tensor> ts{t};
      std::vector<Tensor> flag{Tensor::empty({1}, DType::kInt32)};
      pg::AllreduceOptions opts;
      if (rank == 0) {
        opts.async_op = true;
        pg::WorkPtr work = b.allreduce(ts, opts);
        b.recv(flag, 1, 5)->wait();
        work->wait();
      } else {
        opts.async_op = false;
        b.allreduce(ts, opts)->wait();
        b.send(flag, 0, 5)->wait();
      }
      expect_same(t, expected_reduce(1000, DType::kFloat32, 2, ReduceOp::SUM, round),
                  "round " + std::to_string(round));
    }
  });
}

TYPED_TEST(BackendConformance, FutureCompletesFromWorker) {
  this->run_ranks(2, [](int rank, auto& b) {
    std::vector<Tensor> ts{filled(3, DType::kFloat32, rank)};
    auto work = b.allreduce(ts, pg::AllreduceOptions{});
    const auto& value = work->get_future()->value();
    ASSERT_EQ(value.tensors.size(), 1u);
    expect_same(value.tensors[0], expected_reduce(3, DType::kFloat32, 2, ReduceOp::SUM), "future");
  });
}

TYPED_TEST(BackendConformance, BroadcastFromEachRoot) {
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [size](int rank, auto& b) {
      for (int root = 0; root < size; ++root) {
        for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{300000}}) {
          std::vector<Tensor> ts{filled(n, DType::kFloat64, rank)};
          pg::BroadcastOptions opts;
          opts.root_rank = root;
          opts.async_op = n % 2 == 0;
          b.broadcast(ts, opts)->wait();
          expect_same(ts[0], filled(n, DType::kFloat64, root), "broadcast" + at(n, root));
        }
      }
    });
  }
}

// A synchronous operation has finished when the call returns.
TYPED_TEST(BackendConformance, BroadcastInline) {
  this->run_ranks(2, [](int rank, auto& b) {
    std::vector<Tensor> ts{filled(9, DType::kInt64, rank)};
    pg::BroadcastOptions opts;
    opts.root_rank = 1;
    opts.async_op = false;
    auto work = b.broadcast(ts, opts);
    EXPECT_TRUE(work->is_completed());
    work->wait();
    expect_same(ts[0], filled(9, DType::kInt64, 1), "inline broadcast");
  });
}

// The root gets the result; the other ranks' inputs stay as they were.
TYPED_TEST(BackendConformance, ReduceToEachRoot) {
  const std::vector<std::pair<DType, ReduceOp>> cases = {
      {DType::kFloat32, ReduceOp::SUM},
      {DType::kFloat32, ReduceOp::AVG},
      {DType::kFloat32, ReduceOp::premul_sum(2.0)},
      {DType::kFloat32, ReduceOp::MIN},
      {DType::kInt32, ReduceOp::MAX}};
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [&, size](int rank, auto& b) {
      for (const auto& [dtype, op] : cases) {
        for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{1000}, int64_t{300000}}) {
          const Tensor want = expected_reduce(n, dtype, size, op);
          for (int root = 0; root < size; ++root) {
            std::vector<Tensor> ts{filled(n, dtype, rank)};
            pg::ReduceOptions opts;
            opts.reduce_op = op;
            opts.root_rank = root;
            opts.async_op = root % 2 == 0;
            b.reduce(ts, opts)->wait();
            expect_same(ts[0], rank == root ? want : filled(n, dtype, rank),
                        std::string(op.name()) + " " + std::string(core::dtype_name(dtype)) +
                            at(n, root) + (rank == root ? "" : " (a non-root's input)"));
          }
        }
      }
    });
  }
}

TYPED_TEST(BackendConformance, AllgatherListsAndBase) {
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [size](int rank, auto& b) {
      for (int64_t n : kCounts) {
        // List form with two inputs per rank.
        std::vector<Tensor> ins{filled(n, DType::kInt32, rank), filled(n, DType::kInt32, rank, 7)};
        std::vector<std::vector<Tensor>> outs(2);
        for (auto& list : outs) {
          for (int r = 0; r < size; ++r) list.push_back(Tensor::empty({n}, DType::kInt32));
        }
        b.allgather(outs, ins, pg::AllgatherOptions{})->wait();
        for (int r = 0; r < size; ++r) {
          expect_same(outs[0][r], filled(n, DType::kInt32, r), "allgather" + at(n));
          expect_same(outs[1][r], filled(n, DType::kInt32, r, 7), "allgather" + at(n));
        }
        // Flat form.
        Tensor in = filled(n, DType::kBFloat16, rank);
        Tensor out = Tensor::empty({n * size}, DType::kBFloat16);
        b.allgather_base(out, in, pg::AllgatherOptions{})->wait();
        for (int r = 0; r < size; ++r) {
          expect_same(out.flat_slice(r * n, n), filled(n, DType::kBFloat16, r),
                      "allgather_base" + at(n));
        }
      }
    });
  }
}

TYPED_TEST(BackendConformance, GatherAndScatterEachRoot) {
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [size](int rank, auto& b) {
      for (int root = 0; root < size; ++root) {
        for (int64_t n : kCounts) {
          std::vector<Tensor> ins{filled(n, DType::kFloat16, rank)};
          std::vector<std::vector<Tensor>> outs(1);
          if (rank == root) {
            for (int r = 0; r < size; ++r) outs[0].push_back(Tensor::empty({n}, DType::kFloat16));
          }
          pg::GatherOptions gopts;
          gopts.root_rank = root;
          b.gather(outs, ins, gopts)->wait();
          for (int r = 0; r < size && rank == root; ++r) {
            expect_same(outs[0][r], filled(n, DType::kFloat16, r), "gather" + at(n, root));
          }

          std::vector<Tensor> received{Tensor::empty({n}, DType::kUInt8)};
          std::vector<std::vector<Tensor>> sources(1);
          if (rank == root) {
            for (int r = 0; r < size; ++r) sources[0].push_back(filled(n, DType::kUInt8, r, 5));
          }
          pg::ScatterOptions sopts;
          sopts.root_rank = root;
          b.scatter(received, sources, sopts)->wait();
          expect_same(received[0], filled(n, DType::kUInt8, rank, 5), "scatter" + at(n, root));
        }
      }
    });
  }
}

TYPED_TEST(BackendConformance, ReduceScatterBothForms) {
  const std::vector<std::pair<DType, ReduceOp>> cases = {{DType::kFloat32, ReduceOp::SUM},
                                                         {DType::kFloat32, ReduceOp::AVG},
                                                         {DType::kFloat32, ReduceOp::MAX},
                                                         {DType::kInt32, ReduceOp::SUM}};
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [&, size](int rank, auto& b) {
      for (const auto& [dtype, op] : cases) {
        const std::string what =
            std::string(op.name()) + " " + std::string(core::dtype_name(dtype));
        for (int64_t n : kCounts) {
          // Rank r ends up with block r (n elements) of the reduced whole.
          Tensor whole = expected_reduce(n * size, dtype, size, op);
          Tensor mine = whole.flat_slice(rank * n, n);

          Tensor in = filled(n * size, dtype, rank);
          Tensor in_copy = in.contiguous_copy();
          Tensor out = Tensor::empty({n}, dtype);
          b.reduce_scatter_base(out, in, pg::ReduceScatterOptions{op})->wait();
          expect_same(out, mine, "reduce_scatter_base " + what + at(n));
          expect_same(in, in_copy, "reduce_scatter_base's input" + at(n));

          std::vector<std::vector<Tensor>> pieces(1);
          for (int r = 0; r < size; ++r) {
            pieces[0].push_back(in.flat_slice(r * n, n).contiguous_copy());
          }
          std::vector<Tensor> outs{Tensor::empty({n}, dtype)};
          b.reduce_scatter(outs, pieces, pg::ReduceScatterOptions{op})->wait();
          expect_same(outs[0], mine, "reduce_scatter " + what + at(n));
        }
      }
    });
  }
}

// Rows of 3 int64, each row from rank s to rank d filled with 100 * s + d: `scale` rows per
// unit, even (2 units to everyone) and uneven ((s + d) % 3 units, some empty).
TYPED_TEST(BackendConformance, AlltoallBaseEvenAndUneven) {
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [size](int rank, auto& b) {
      for (int64_t scale : {int64_t{1}, int64_t{1000}}) {
        for (bool even : {true, false}) {
          std::vector<int64_t> in_splits(size), out_splits(size);
          for (int d = 0; d < size; ++d) in_splits[d] = scale * (even ? 2 : (rank + d) % 3);
          for (int s = 0; s < size; ++s) out_splits[s] = scale * (even ? 2 : (s + rank) % 3);
          const int64_t in_rows = std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0});
          const int64_t out_rows =
              std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
          Tensor in = Tensor::empty({in_rows, 3}, DType::kInt64);
          int64_t row = 0;
          for (int d = 0; d < size; ++d) {
            for (int64_t k = 0; k < in_splits[d] * 3; ++k) {
              in.data_as<int64_t>()[row * 3 + k] = 100 * rank + d;
            }
            row += in_splits[d];
          }
          Tensor out = Tensor::empty({out_rows, 3}, DType::kInt64);
          std::vector<int64_t> none;
          b.alltoall_base(out, in, even ? none : out_splits, even ? none : in_splits,
                          pg::AllToAllOptions{})
              ->wait();
          row = 0;
          for (int s = 0; s < size; ++s) {
            for (int64_t k = 0; k < out_splits[s] * 3; ++k) {
              ASSERT_EQ(out.data_as<int64_t>()[row * 3 + k], 100 * s + rank)
                  << "from " << s << " scale " << scale << (even ? " even" : " uneven");
            }
            row += out_splits[s];
          }
        }
      }
    });
  }
}

TYPED_TEST(BackendConformance, AlltoallLists) {
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [size](int rank, auto& b) {
      std::vector<Tensor> ins, outs;
      for (int d = 0; d < size; ++d) ins.push_back(filled(d + rank, DType::kFloat32, rank, d));
      for (int s = 0; s < size; ++s) outs.push_back(Tensor::empty({s + rank}, DType::kFloat32));
      b.alltoall(outs, ins, pg::AllToAllOptions{})->wait();
      for (int s = 0; s < size; ++s) {
        expect_same(outs[s], filled(s + rank, DType::kFloat32, s, rank),
                    "alltoall from " + std::to_string(s));
      }
    });
  }
}

// Receives posted before and after the matching sends (the latter deadlocks blocking calls).
TYPED_TEST(BackendConformance, SendRecvRing) {
  for (int size = 2; size <= 4; ++size) {
    this->run_ranks(size, [size](int rank, auto& b) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100000}}) {
        for (bool send_first : {false, true}) {
          std::vector<Tensor> out{filled(n, DType::kComplex64, rank)};
          std::vector<Tensor> in{Tensor::empty({n}, DType::kComplex64)};
          const int from = (rank + size - 1) % size;
          pg::WorkPtr send, recv;
          if (send_first) send = b.send(out, (rank + 1) % size, 3);
          recv = b.recv(in, from, 3);
          if (!send_first) send = b.send(out, (rank + 1) % size, 3);
          send->wait();
          recv->wait();
          EXPECT_EQ(recv->source_rank(), from);
          expect_same(in[0], filled(n, DType::kComplex64, from),
                      "ring" + at(n) + (send_first ? " send first" : " recv first"));
        }
      }
    });
  }
}

// Rank 0 sends tag 7 then tag 3; rank 1 waits for tag 3 first.
TYPED_TEST(BackendConformance, SendRecvMatchesTags) {
  this->run_ranks(2, [](int rank, auto& b) {
    if (rank == 0) {
      std::vector<Tensor> seven{filled(4, DType::kInt32, 7)}, three{filled(4, DType::kInt32, 3)};
      b.send(seven, 1, 7)->wait();
      b.send(three, 1, 3)->wait();
    } else {
      std::vector<Tensor> seven{Tensor::empty({4}, DType::kInt32)};
      std::vector<Tensor> three{Tensor::empty({4}, DType::kInt32)};
      auto w3 = b.recv(three, 0, 3);
      auto w7 = b.recv(seven, 0, 7);
      w3->wait();
      w7->wait();
      expect_same(three[0], filled(4, DType::kInt32, 3), "tag 3");
      expect_same(seven[0], filled(4, DType::kInt32, 7), "tag 7");
    }
    b.barrier({})->wait();
  });
}

TYPED_TEST(BackendConformance, RecvAnySourceReportsSender) {
  this->run_ranks(3, [](int rank, auto& b) {
    if (rank == 0) {
      std::vector<int> senders;
      for (int i = 0; i < 2; ++i) {
        std::vector<Tensor> in{Tensor::empty({4}, DType::kInt32)};
        auto work = b.recv_anysource(in, 11);
        work->wait();
        const int src = work->source_rank();
        expect_same(in[0], filled(4, DType::kInt32, src), "from " + std::to_string(src));
        senders.push_back(src);
      }
      std::sort(senders.begin(), senders.end());
      EXPECT_EQ(senders, (std::vector<int>{1, 2}));
    } else {
      std::vector<Tensor> out{filled(4, DType::kInt32, rank)};
      b.send(out, 0, 11)->wait();
    }
  });
}

TYPED_TEST(BackendConformance, Barrier) {
  for (int size = 1; size <= 4; ++size) {
    this->run_ranks(size, [](int, auto& b) {
      for (int i = 0; i < 3; ++i) b.barrier(pg::BarrierOptions{})->wait();
      pg::BarrierOptions opts;
      opts.timeout = 5s;
      b.monitored_barrier(opts, true);
    });
  }
}

// Ranks 2 and 3 are alive but never arrive: rank 0 names them (all, or the first), rank 1
// hears of it from rank 0, both soon after the barrier's timeout, and can still talk.
TYPED_TEST(BackendConformance, MonitoredBarrierNamesMissingRanks) {
  for (bool wait_all : {true, false}) {
    std::atomic<int> finished{0};
    this->run_ranks(4, [wait_all, &finished](int rank, auto& b) {
      pg::BarrierOptions opts;
      opts.timeout = 500ms;
      if (rank >= 2) {  // alive until ranks 0 and 1 are done, ping included
        const auto until = std::chrono::steady_clock::now() + 60s;
        while (finished.load() < 2 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(1ms);
        }
        return;
      }
      struct Count {
        std::atomic<int>& n;
        ~Count() { ++n; }
      } count{finished};
      const auto start = std::chrono::steady_clock::now();
      try {
        b.monitored_barrier(opts, wait_all);
        ADD_FAILURE() << "rank " << rank << ": monitored_barrier passed";
      } catch (const core::DistError& e) {
        const std::string what = e.what();
        if (rank == 0) {
          EXPECT_NE(what.find(wait_all ? "Ranks 2, 3 failed to pass monitoredBarrier in 500 ms"
                                       : "Rank 2 failed to pass monitoredBarrier in 500 ms"),
                    std::string::npos)
              << what;
        } else {
          EXPECT_EQ(what.rfind(pg::monitored_barrier_failure_on(rank), 0), 0u) << what;
        }
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "rank " << rank;
      std::vector<Tensor> t{filled(2, DType::kInt32, rank)};
      (rank == 0 ? b.send(t, 1, 77) : b.recv(t, 0, 77))->wait();
      expect_same(t[0], filled(2, DType::kInt32, 0), "ping after the failed barrier");
    });
  }
}

TYPED_TEST(BackendConformance, RecvWithoutSenderTimesOut) {
  std::atomic<bool> done{false};
  this->run_ranks(RankRun{2, 300ms}, [&](int rank, auto& b) {
    if (rank == 1) {
      wait_for(done, 60s);  // alive until rank 0 gave up
      return;
    }
    SetOnExit release{done};
    if (rank == 0) {
      std::vector<Tensor> in{Tensor::empty({4}, DType::kFloat32)};
      const auto start = std::chrono::steady_clock::now();
      auto work = b.recv(in, 1, 5);
      try {
        work->wait();
        ADD_FAILURE() << "recv completed without a sender";
      } catch (const core::DistTimeoutError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("recv"), std::string::npos) << what;
        EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
      }
      const auto elapsed = std::chrono::steady_clock::now() - start;
      EXPECT_GE(elapsed, 250ms);
      EXPECT_LT(elapsed, 5s);
    }
  });
}

// (Which rank it waited for, the shm backend names; Gloo's timeouts do not tell.)
TYPED_TEST(BackendConformance, CollectiveTimeoutNamesOperationAndSequence) {
  std::atomic<bool> done{false};
  this->run_ranks(RankRun{2, 300ms}, [&](int rank, auto& b) {
    if (rank == 1) {
      wait_for(done, 60s);  // alive, but never joins
      return;
    }
    SetOnExit release{done};
    std::vector<Tensor> ts{filled(10, DType::kFloat32, rank)};
    const auto start = std::chrono::steady_clock::now();
    try {
      b.allreduce(ts, {})->wait();
      ADD_FAILURE() << "allreduce passed without rank 1";
    } catch (const core::DistTimeoutError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
      EXPECT_NE(what.find("sequence 0"), std::string::npos) << what;
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, 250ms);
    EXPECT_LT(elapsed, 5s);
  });
}

// Backend::set_timeout applies to the operations submitted afterwards: a 500 ms allreduce on
// a backend built with 30 s.
TYPED_TEST(BackendConformance, SetTimeoutAppliesToLaterOperations) {
  std::atomic<bool> done{false};
  this->run_ranks(RankRun{2, 30s}, [&](int rank, auto& b) {
    if (rank == 1) {
      wait_for(done, 60s);  // alive, but never joins
      b.shutdown();
      return;
    }
    SetOnExit release{done};
    b.set_timeout(500ms);
    EXPECT_EQ(b.timeout(), 500ms);
    std::vector<Tensor> ts{filled(10, DType::kFloat32, rank)};
    const auto start = std::chrono::steady_clock::now();
    try {
      b.allreduce(ts, {})->wait();
      ADD_FAILURE() << "allreduce passed without rank 1";
    } catch (const core::DistTimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a timeout: " << e.what();
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, 450ms);
    EXPECT_LT(elapsed, 10s);  // not the 30 s the backend was built with
  });
}

// A peer that shuts down (before the operation, or while it waits) fails the operation soon,
// naming the peer, and not at the timeout (20 s).
TYPED_TEST(BackendConformance, PeerShutdownFailsWaitersFast) {
  for (pg::Millis delay : {0ms, 100ms}) {
    this->run_ranks(RankRun{2, 20s}, [delay](int rank, auto& b) {
      if (rank == 1) {
        std::this_thread::sleep_for(delay);
        b.shutdown();
        return;
      }
      std::vector<Tensor> ts{filled(1000, DType::kFloat32, rank)};
      const auto start = std::chrono::steady_clock::now();
      try {
        b.allreduce(ts, pg::AllreduceOptions{})->wait();
        ADD_FAILURE() << "allreduce with a dead peer succeeded";
      } catch (const core::DistBackendError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
        EXPECT_NE(what.find("sequence 0"), std::string::npos) << what;
        EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "delay " << delay.count();
    });
  }
}

// Shutdown fails a running operation at once, though its peer is alive and the timeout long,
// and every later one.
TYPED_TEST(BackendConformance, ShutdownDoesNotWaitForPeers) {
  std::atomic<bool> done{false};
  this->run_ranks(RankRun{2, 20s}, [&](int rank, auto& b) {
    if (rank == 1) {
      wait_for(done, 60s);  // never joins the allreduce
      return;
    }
    SetOnExit release{done};
    std::vector<Tensor> ts{filled(4, DType::kFloat32, rank)};
    auto running = b.allreduce(ts, pg::AllreduceOptions{});
    std::this_thread::sleep_for(50ms);
    const auto start = std::chrono::steady_clock::now();
    b.shutdown();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    EXPECT_THROW(running->wait(), core::DistBackendError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    std::vector<Tensor> more{filled(4, DType::kFloat32, rank)};
    EXPECT_THROW(b.allreduce(more, pg::AllreduceOptions{})->wait(), core::DistBackendError);
  });
}

// The operation queue's rules (pg/op_queue.h), the same on every backend that runs on it.

// After shutdown an operation is refused through its Work, not by throwing at the call.
TYPED_TEST(BackendConformance, OperationsAfterShutdownReturnFailedWork) {
  this->run_ranks(2, [](int rank, auto& b) {
    b.shutdown();
    for (bool async : {false, true}) {
      std::vector<Tensor> ts{filled(4, DType::kFloat32, rank)};
      pg::AllreduceOptions opts;
      opts.async_op = async;
      pg::WorkPtr work;
      ASSERT_NO_THROW(work = b.allreduce(ts, opts));
      try {
        work->wait();
        ADD_FAILURE() << "an allreduce after shutdown succeeded";
      } catch (const core::DistBackendError& e) {
        EXPECT_NE(std::string(e.what()).find("shut down"), std::string::npos) << e.what();
      }
    }
  });
}

// A synchronous operation runs after the asynchronous ones submitted before it: when it is
// done, so are they.
TYPED_TEST(BackendConformance, SyncOperationEndsAfterEarlierAsyncOnes) {
  this->run_ranks(3, [](int rank, auto& b) {
    std::vector<Tensor> tensors;
    std::vector<pg::WorkPtr> works;
    for (int i = 0; i < 8; ++i) {
      tensors.push_back(filled(1000 * (i + 1), DType::kFloat32, rank, i));
      std::vector<Tensor> ts{tensors.back()};
      works.push_back(b.allreduce(ts, pg::AllreduceOptions{}));
    }
    std::vector<Tensor> last{filled(3, DType::kFloat32, rank)};
    pg::AllreduceOptions sync;
    sync.async_op = false;
    b.allreduce(last, sync)->wait();
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(works[i]->is_completed()) << "async allreduce " << i;
      expect_same(tensors[i], expected_reduce(1000 * (i + 1), DType::kFloat32, 3, ReduceOp::SUM, i),
                  "async " + std::to_string(i));
    }
  });
}

// finish_pending runs what is queued to its end without anyone waiting on the Works.
TYPED_TEST(BackendConformance, FinishPendingCompletesQueuedOperations) {
  this->run_ranks(2, [](int rank, auto& b) {
    std::vector<Tensor> tensors;
    std::vector<pg::WorkPtr> works;
    for (int i = 0; i < 6; ++i) {
      tensors.push_back(filled(500, DType::kFloat32, rank, i));
      std::vector<Tensor> ts{tensors.back()};
      works.push_back(b.allreduce(ts, pg::AllreduceOptions{}));
    }
    b.finish_pending(10s);
    for (int i = 0; i < 6; ++i) {
      EXPECT_TRUE(works[i]->is_completed()) << "async allreduce " << i;
      expect_same(tensors[i], expected_reduce(500, DType::kFloat32, 2, ReduceOp::SUM, i),
                  "async " + std::to_string(i));
    }
  });
}

}  // namespace
}  // namespace c10d::backends
