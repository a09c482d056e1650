// GlooBackend with ranks as threads: every rank builds its own backend on its own thread over
// one shared HashStore and a shared loopback device, as Gloo's own tests do.
#include "c10d/backends/gloo/gloo_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <complex>
#include <cstring>
#include <numeric>
#include <thread>

#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>

#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"
#include "c10d/store/hash_store.h"

namespace c10d::backends::gloo {
namespace {

using core::DType;
using core::ReduceOp;
using core::Tensor;
using namespace std::chrono_literals;

const DevicePtr& loopback() {
  static DevicePtr device = GlooBackend::create_device_for_hostname("127.0.0.1");
  return device;
}

struct RankRun {
  int size = 2;
  pg::Millis timeout = 10s;
  int threads = 2;
};

// Runs fn(rank, backend) on one thread per rank; failures are reported with the rank.
template <typename Fn>
void run_ranks(const RankRun& run, Fn fn) {
  auto store = std::make_shared<store::HashStore>(10s);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(run.size);
  for (int r = 0; r < run.size; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooOptions opts;
        opts.devices = {loopback()};
        opts.timeout = run.timeout;
        opts.threads = run.threads;
        GlooBackend backend(store, r, run.size, opts);
        fn(r, backend);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < run.size; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r << " of " << run.size;
  }
}

template <typename Fn>
void run_ranks(int size, Fn fn) {
  run_ranks(RankRun{size}, fn);
}

// Small integers, exact in every dtype (products of four stay below 256).
double value_at(int rank, int64_t i) { return static_cast<double>((rank + i) % 3 + 1); }

void fill(Tensor& t, int rank, int seed = 0) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = value_at(rank + seed, i);
    switch (t.dtype()) {
      case DType::kFloat32:
        t.data_as<float>()[i] = static_cast<float>(v);
        break;
      case DType::kFloat64:
        t.data_as<double>()[i] = v;
        break;
      case DType::kFloat16:
        t.data_as<uint16_t>()[i] = core::float_to_half(static_cast<float>(v));
        break;
      case DType::kBFloat16:
        t.data_as<uint16_t>()[i] = core::float_to_bfloat16(static_cast<float>(v));
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
      case DType::kComplex64:
        t.data_as<std::complex<float>>()[i] = {static_cast<float>(v), static_cast<float>(-v)};
        break;
      default:
        FAIL() << "fill: unhandled dtype";
    }
  }
}

Tensor make(DType dtype, int64_t n, int rank, int seed = 0) {
  Tensor t = Tensor::empty({n}, dtype);
  fill(t, rank, seed);
  return t;
}

// What an allreduce of every rank's make(dtype, n, r) must produce.
Tensor reference(DType dtype, int64_t n, int size, const ReduceOp& op) {
  Tensor acc = make(dtype, n, 0);
  core::apply_premul(acc.data(), n, dtype, op);
  for (int r = 1; r < size; ++r) {
    Tensor other = make(dtype, n, r);
    core::apply_premul(other.data(), n, dtype, op);
    core::reduce(acc.data(), other.data(), n, dtype, op);
  }
  core::apply_postdiv(acc.data(), n, dtype, op, size);
  return acc;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

const int64_t kCounts[] = {0, 1, 7, 1000};

TEST(GlooBackend, AllreduceEveryDtypeAndOp) {
  const DType dtypes[] = {DType::kFloat32, DType::kInt32, DType::kFloat16, DType::kBFloat16,
                          DType::kComplex64};
  std::vector<ReduceOp> ops;
  for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
    if (k == ReduceOp::PREMUL_SUM) {
      ops.push_back(ReduceOp::premul_sum(2.0));
    } else if (k != ReduceOp::UNUSED) {
      ops.push_back(ReduceOp(static_cast<ReduceOp::Kind>(k)));
    }
  }
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [&](int rank, GlooBackend& backend) {
      for (DType dtype : dtypes) {
        for (const ReduceOp& op : ops) {
          if (!core::is_valid_reduce_op(dtype, op)) continue;
          for (int64_t n : kCounts) {
            std::vector<Tensor> tensors{make(dtype, n, rank)};
            pg::AllreduceOptions opts;
            opts.reduce_op = op;
            backend.allreduce(tensors, opts)->wait();
            EXPECT_TRUE(same_bytes(tensors[0], reference(dtype, n, size, op)))
                << core::dtype_name(dtype) << " " << op.name() << " n=" << n << " size=" << size;
          }
        }
      }
    });
  }
}

TEST(GlooBackend, AllreduceManyAsyncInFlight) {
  run_ranks(3, [](int rank, GlooBackend& backend) {
    std::vector<std::vector<Tensor>> tensors;
    std::vector<pg::WorkPtr> works;
    for (int i = 0; i < 40; ++i) tensors.push_back({make(DType::kFloat32, 1 + i % 5, rank)});
    for (auto& t : tensors) works.push_back(backend.allreduce(t, pg::AllreduceOptions{}));
    for (size_t i = 0; i < works.size(); ++i) {
      works[i]->wait();
      EXPECT_TRUE(works[i]->is_success());
      EXPECT_TRUE(
          same_bytes(tensors[i][0], reference(DType::kFloat32, 1 + i % 5, 3, ReduceOp::SUM)));
    }
    EXPECT_EQ(backend.next_sequence(), 40u);
  });
}

TEST(GlooBackend, AllreduceInlineMixedWithAsync) {
  run_ranks(3, [](int rank, GlooBackend& backend) {
    std::vector<Tensor> queued{make(DType::kInt32, 7, rank)};
    std::vector<Tensor> inline_tensors{make(DType::kFloat32, 7, rank)};
    auto first = backend.allreduce(queued, pg::AllreduceOptions{});
    pg::AllreduceOptions opts;
    opts.reduce_op = ReduceOp::AVG;
    opts.async_op = false;
    auto second = backend.allreduce(inline_tensors, opts);
    EXPECT_TRUE(second->is_completed());
    EXPECT_TRUE(same_bytes(inline_tensors[0], reference(DType::kFloat32, 7, 3, ReduceOp::AVG)));
    first->wait();
    EXPECT_TRUE(same_bytes(queued[0], reference(DType::kInt32, 7, 3, ReduceOp::SUM)));
  });
}

TEST(GlooBackend, AllreduceSeveralLocalTensors) {
  run_ranks(2, [](int rank, GlooBackend& backend) {
    std::vector<Tensor> tensors{make(DType::kFloat32, 5, rank), make(DType::kFloat32, 5, rank)};
    backend.allreduce(tensors, pg::AllreduceOptions{})->wait();
    Tensor expected = reference(DType::kFloat32, 5, 2, ReduceOp::SUM);
    core::reduce(expected.data(), expected.data(), 5, DType::kFloat32, ReduceOp::SUM);
    EXPECT_TRUE(same_bytes(tensors[0], expected));
    EXPECT_TRUE(same_bytes(tensors[1], expected));
  });
}

TEST(GlooBackend, AllreduceCoalesced) {
  run_ranks(3, [](int rank, GlooBackend& backend) {
    std::vector<Tensor> tensors{make(DType::kInt32, 3, rank), make(DType::kInt32, 0, rank),
                                make(DType::kInt32, 8, rank)};
    pg::AllreduceCoalescedOptions opts;
    opts.reduce_op = ReduceOp::MAX;
    backend.allreduce_coalesced(tensors, opts)->wait();
    EXPECT_TRUE(same_bytes(tensors[0], reference(DType::kInt32, 3, 3, ReduceOp::MAX)));
    EXPECT_TRUE(same_bytes(tensors[2], reference(DType::kInt32, 8, 3, ReduceOp::MAX)));
  });
}

TEST(GlooBackend, BroadcastFromEachRoot) {
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [size](int rank, GlooBackend& backend) {
      for (int root = 0; root < size; ++root) {
        for (int64_t n : kCounts) {
          std::vector<Tensor> tensors{make(DType::kFloat64, n, rank)};
          pg::BroadcastOptions opts;
          opts.root_rank = root;
          backend.broadcast(tensors, opts)->wait();
          EXPECT_TRUE(same_bytes(tensors[0], make(DType::kFloat64, n, root)))
              << "root " << root << " n " << n;
        }
      }
    });
  }
}

TEST(GlooBackend, BroadcastInline) {
  run_ranks(2, [](int rank, GlooBackend& backend) {
    std::vector<Tensor> tensors{make(DType::kInt64, 9, rank)};
    pg::BroadcastOptions opts;
    opts.root_rank = 1;
    opts.async_op = false;
    auto work = backend.broadcast(tensors, opts);
    EXPECT_TRUE(work->is_completed());  // ran on this thread
    work->wait();
    EXPECT_TRUE(same_bytes(tensors[0], make(DType::kInt64, 9, 1)));
  });
}

TEST(GlooBackend, ReduceToEachRoot) {
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [size](int rank, GlooBackend& backend) {
      const ReduceOp ops[] = {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::premul_sum(2.0),
                              ReduceOp::MIN};
      for (int root = 0; root < size; ++root) {
        for (const ReduceOp& op : ops) {
          for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{1000}}) {
            std::vector<Tensor> tensors{make(DType::kFloat32, n, rank)};
            pg::ReduceOptions opts;
            opts.reduce_op = op;
            opts.root_rank = root;
            backend.reduce(tensors, opts)->wait();
            if (rank == root) {
              EXPECT_TRUE(same_bytes(tensors[0], reference(DType::kFloat32, n, size, op)))
                  << op.name() << " root " << root << " n " << n;
            } else {
              EXPECT_TRUE(same_bytes(tensors[0], make(DType::kFloat32, n, rank)))
                  << "non-root input changed";
            }
          }
        }
      }
    });
  }
}

TEST(GlooBackend, AllgatherListsAndBase) {
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [size](int rank, GlooBackend& backend) {
      for (int64_t n : kCounts) {
        // List form with two inputs per rank.
        std::vector<Tensor> inputs{make(DType::kInt32, n, rank), make(DType::kInt32, n, rank, 7)};
        std::vector<std::vector<Tensor>> outputs(2);
        for (auto& list : outputs) {
          for (int r = 0; r < size; ++r) list.push_back(Tensor::empty({n}, DType::kInt32));
        }
        backend.allgather(outputs, inputs, pg::AllgatherOptions{})->wait();
        for (int r = 0; r < size; ++r) {
          EXPECT_TRUE(same_bytes(outputs[0][r], make(DType::kInt32, n, r))) << "n " << n;
          EXPECT_TRUE(same_bytes(outputs[1][r], make(DType::kInt32, n, r, 7))) << "n " << n;
        }
        // Flat form.
        Tensor input = make(DType::kBFloat16, n, rank);
        Tensor output = Tensor::empty({n * size}, DType::kBFloat16);
        backend.allgather_base(output, input, pg::AllgatherOptions{})->wait();
        for (int r = 0; r < size; ++r) {
          EXPECT_TRUE(same_bytes(output.flat_slice(r * n, n), make(DType::kBFloat16, n, r)));
        }
      }
    });
  }
}

TEST(GlooBackend, GatherAndScatterEachRoot) {
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [size](int rank, GlooBackend& backend) {
      for (int root = 0; root < size; ++root) {
        for (int64_t n : kCounts) {
          std::vector<Tensor> inputs{make(DType::kFloat16, n, rank)};
          std::vector<std::vector<Tensor>> outputs(1);
          if (rank == root) {
            for (int r = 0; r < size; ++r)
              outputs[0].push_back(Tensor::empty({n}, DType::kFloat16));
          }
          pg::GatherOptions gopts;
          gopts.root_rank = root;
          backend.gather(outputs, inputs, gopts)->wait();
          if (rank == root) {
            for (int r = 0; r < size; ++r) {
              EXPECT_TRUE(same_bytes(outputs[0][r], make(DType::kFloat16, n, r)));
            }
          }

          std::vector<Tensor> received{Tensor::empty({n}, DType::kUInt8)};
          std::vector<std::vector<Tensor>> sources(1);
          if (rank == root) {
            for (int r = 0; r < size; ++r) sources[0].push_back(make(DType::kUInt8, n, r, 5));
          }
          pg::ScatterOptions sopts;
          sopts.root_rank = root;
          backend.scatter(received, sources, sopts)->wait();
          EXPECT_TRUE(same_bytes(received[0], make(DType::kUInt8, n, rank, 5)))
              << "root " << root << " n " << n;
        }
      }
    });
  }
}

TEST(GlooBackend, ReduceScatterBothForms) {
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [size](int rank, GlooBackend& backend) {
      const ReduceOp ops[] = {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX};
      for (const ReduceOp& op : ops) {
        for (int64_t n : kCounts) {
          // Input block r (n elements) is what rank r ends up with: reference over the big
          // tensor, sliced.
          Tensor whole_ref = reference(DType::kFloat32, n * size, size, op);
          Tensor mine_ref = whole_ref.flat_slice(rank * n, n);

          Tensor input = make(DType::kFloat32, n * size, rank);
          Tensor input_copy = input.contiguous_copy();
          Tensor output = Tensor::empty({n}, DType::kFloat32);
          backend.reduce_scatter_base(output, input, pg::ReduceScatterOptions{op})->wait();
          EXPECT_TRUE(same_bytes(output, mine_ref)) << op.name() << " n " << n;
          EXPECT_TRUE(same_bytes(input, input_copy)) << "input modified";

          std::vector<std::vector<Tensor>> pieces(1);
          for (int r = 0; r < size; ++r)
            pieces[0].push_back(input.flat_slice(r * n, n).contiguous_copy());
          std::vector<Tensor> outputs{Tensor::empty({n}, DType::kFloat32)};
          backend.reduce_scatter(outputs, pieces, pg::ReduceScatterOptions{op})->wait();
          EXPECT_TRUE(same_bytes(outputs[0], mine_ref)) << op.name() << " n " << n;
        }
      }
    });
  }
}

// Rank s sends (s + d + 1) rows of 3 int64 to rank d, each row filled with 100 * s + d.
TEST(GlooBackend, AlltoallBaseEvenAndUneven) {
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [size](int rank, GlooBackend& backend) {
      // Even: 2 rows per destination.
      Tensor in = Tensor::empty({2 * size, 3}, DType::kInt64);
      for (int d = 0; d < size; ++d) {
        for (int i = 0; i < 6; ++i) in.data_as<int64_t>()[d * 6 + i] = 100 * rank + d;
      }
      Tensor out = Tensor::empty({2 * size, 3}, DType::kInt64);
      std::vector<int64_t> none;
      backend.alltoall_base(out, in, none, none, pg::AllToAllOptions{})->wait();
      for (int s = 0; s < size; ++s) {
        for (int i = 0; i < 6; ++i) EXPECT_EQ(out.data_as<int64_t>()[s * 6 + i], 100 * s + rank);
      }

      // Uneven, including empty splits: rank s sends (s + d) % 3 rows to d.
      std::vector<int64_t> in_splits(size), out_splits(size);
      for (int d = 0; d < size; ++d) in_splits[d] = (rank + d) % 3;
      for (int s = 0; s < size; ++s) out_splits[s] = (s + rank) % 3;
      const int64_t in_rows = std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0});
      const int64_t out_rows = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
      Tensor uin = Tensor::empty({in_rows, 3}, DType::kInt64);
      int64_t row = 0;
      for (int d = 0; d < size; ++d) {
        for (int64_t k = 0; k < in_splits[d] * 3; ++k)
          uin.data_as<int64_t>()[row * 3 + k] = 100 * rank + d;
        row += in_splits[d];
      }
      Tensor uout = Tensor::empty({out_rows, 3}, DType::kInt64);
      backend.alltoall_base(uout, uin, out_splits, in_splits, pg::AllToAllOptions{})->wait();
      row = 0;
      for (int s = 0; s < size; ++s) {
        for (int64_t k = 0; k < out_splits[s] * 3; ++k) {
          EXPECT_EQ(uout.data_as<int64_t>()[row * 3 + k], 100 * s + rank) << "from " << s;
        }
        row += out_splits[s];
      }
    });
  }
}

TEST(GlooBackend, AlltoallLists) {
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [size](int rank, GlooBackend& backend) {
      std::vector<Tensor> inputs, outputs;
      for (int d = 0; d < size; ++d) inputs.push_back(make(DType::kFloat32, d + rank, rank, d));
      for (int s = 0; s < size; ++s) outputs.push_back(Tensor::empty({s + rank}, DType::kFloat32));
      backend.alltoall(outputs, inputs, pg::AllToAllOptions{})->wait();
      for (int s = 0; s < size; ++s) {
        EXPECT_TRUE(same_bytes(outputs[s], make(DType::kFloat32, s + rank, s, rank)));
      }
    });
  }
}

TEST(GlooBackend, SendRecvRing) {
  for (int size = 2; size <= 4; ++size) {
    run_ranks(size, [size](int rank, GlooBackend& backend) {
      for (int64_t n : kCounts) {
        std::vector<Tensor> out{make(DType::kComplex64, n, rank)};
        std::vector<Tensor> in{Tensor::empty({n}, DType::kComplex64)};
        const int from = (rank + size - 1) % size;
        auto recv = backend.recv(in, from, 3);
        auto send = backend.send(out, (rank + 1) % size, 3);
        send->wait();
        recv->wait();
        EXPECT_EQ(recv->source_rank(), from);
        EXPECT_TRUE(same_bytes(in[0], make(DType::kComplex64, n, from)));
      }
    });
  }
}

TEST(GlooBackend, RecvAnySourceReportsSender) {
  run_ranks(3, [](int rank, GlooBackend& backend) {
    if (rank == 0) {
      std::vector<int> senders;
      for (int i = 0; i < 2; ++i) {
        std::vector<Tensor> in{Tensor::empty({4}, DType::kInt32)};
        auto work = backend.recv_anysource(in, 11);
        work->wait();
        const int src = work->source_rank();
        EXPECT_TRUE(same_bytes(in[0], make(DType::kInt32, 4, src)));
        senders.push_back(src);
      }
      std::sort(senders.begin(), senders.end());
      EXPECT_EQ(senders, (std::vector<int>{1, 2}));
    } else {
      std::vector<Tensor> out{make(DType::kInt32, 4, rank)};
      backend.send(out, 0, 11)->wait();
    }
  });
}

TEST(GlooBackend, Barrier) {
  for (int size = 1; size <= 4; ++size) {
    run_ranks(size, [](int, GlooBackend& backend) {
      for (int i = 0; i < 3; ++i) backend.barrier(pg::BarrierOptions{})->wait();
      pg::BarrierOptions opts;
      opts.timeout = 5s;
      backend.monitored_barrier(opts, true);
    });
  }
}

TEST(GlooBackend, MonitoredBarrierNamesMissingRanks) {
  for (bool wait_all : {true, false}) {
    RankRun run{4, 10s};
    run_ranks(run, [wait_all](int rank, GlooBackend& backend) {
      pg::BarrierOptions opts;
      opts.timeout = 500ms;
      if (rank == 2 || rank == 3) {
        std::this_thread::sleep_for(800ms);  // alive, but never arrives in time
        return;  // (its connections stay open until ranks 0 and 1 are done)
      }
      const auto start = std::chrono::steady_clock::now();
      auto ping_after = [&] {  // ranks 0 and 1 can still talk afterwards
        std::vector<Tensor> t{make(DType::kInt32, 2, rank)};
        auto work = rank == 0 ? backend.send(t, 1, 77) : backend.recv(t, 0, 77);
        work->wait();
        EXPECT_TRUE(same_bytes(t[0], make(DType::kInt32, 2, 0)));
      };
      try {
        backend.monitored_barrier(opts, wait_all);
        ADD_FAILURE() << "rank " << rank << ": monitored_barrier passed";
      } catch (const core::DistError& e) {
        const std::string what = e.what();
        if (rank == 0) {
          EXPECT_NE(what.find(wait_all ? "Ranks 2, 3 failed to pass monitoredBarrier in 500 ms"
                                       : "Rank 2 failed to pass monitoredBarrier in 500 ms"),
                    std::string::npos)
              << what;
        }
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms) << "rank " << rank;
      ping_after();  // a failed monitored barrier leaves the connections usable
    });
  }
}

TEST(GlooBackend, RecvWithoutSenderTimesOut) {
  RankRun run{2, 300ms};
  run_ranks(run, [](int rank, GlooBackend& backend) {
    if (rank == 0) {
      std::vector<Tensor> in{Tensor::empty({4}, DType::kFloat32)};
      const auto start = std::chrono::steady_clock::now();
      auto work = backend.recv(in, 1, 5);
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
      EXPECT_LT(elapsed, 1300ms);
    }
    // Both ranks leave together so rank 1's connections outlive rank 0's wait.
    std::this_thread::sleep_for(rank == 1 ? 600ms : 0ms);
  });
}

TEST(GlooBackend, DeadPeerFailsInsteadOfHanging) {
  RankRun run{2, 20s};
  run_ranks(run, [](int rank, GlooBackend& backend) {
    if (rank == 1) {
      backend.shutdown();  // its connections close; rank 0 must notice
      return;
    }
    std::vector<Tensor> tensors{make(DType::kFloat32, 1000, rank)};
    const auto start = std::chrono::steady_clock::now();
    try {
      backend.allreduce(tensors, pg::AllreduceOptions{})->wait();
      ADD_FAILURE() << "allreduce with a dead peer succeeded";
    } catch (const core::DistBackendError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
      EXPECT_NE(what.find("sequence 0"), std::string::npos) << what;
      EXPECT_NE(what.find("peer rank 1"), std::string::npos) << what;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  });
}

TEST(GlooBackend, ShutdownDoesNotWaitForPeers) {
  RankRun run{2, 20s};
  run_ranks(run, [](int rank, GlooBackend& backend) {
    if (rank == 1) {
      std::this_thread::sleep_for(300ms);  // never joins the allreduce
      return;
    }
    std::vector<Tensor> tensors{make(DType::kFloat32, 4, rank)};
    auto running = backend.allreduce(tensors, pg::AllreduceOptions{});
    std::vector<Tensor> more{make(DType::kFloat32, 4, rank)};
    std::this_thread::sleep_for(50ms);
    const auto start = std::chrono::steady_clock::now();
    backend.shutdown();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    EXPECT_THROW(running->wait(), core::DistBackendError);  // failed by shutdown, not at 20 s
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    EXPECT_THROW(backend.allreduce(more, pg::AllreduceOptions{})->wait(), core::DistBackendError);
  });
}

TEST(GlooBackend, FutureCompletesFromWorker) {
  run_ranks(2, [](int rank, GlooBackend& backend) {
    std::vector<Tensor> tensors{make(DType::kFloat32, 3, rank)};
    auto work = backend.allreduce(tensors, pg::AllreduceOptions{});
    const auto& value = work->get_future()->value();
    ASSERT_EQ(value.tensors.size(), 1u);
    EXPECT_TRUE(same_bytes(value.tensors[0], reference(DType::kFloat32, 3, 2, ReduceOp::SUM)));
  });
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Not a correctness test: prints the median time of a small and a large float32 allreduce at
// 2 ranks for plain Gloo (same device, our reduce kernel), this backend through its worker
// threads (async_op = true), and this backend on the caller's thread (async_op = false).
TEST(GlooBackend, AllreduceLatency) {
  for (int64_t bytes : {int64_t{4}, int64_t{1} << 20}) {
    const int iters = bytes == 4 ? 1000 : 30;
    const int64_t n = bytes / 4;
    std::vector<double> raw(iters), async(iters), inline_(iters);
    run_ranks(2, [&](int rank, GlooBackend& backend) {
      // Plain Gloo, rendezvoused through a Gloo HashStore shared by the two rank threads.
      static ::gloo::rendezvous::HashStore gloo_store;
      auto context = std::make_shared<::gloo::rendezvous::Context>(rank, 2);
      ::gloo::rendezvous::PrefixStore prefixed(std::to_string(bytes), gloo_store);
      context->connectFullMesh(prefixed, const_cast<DevicePtr&>(loopback()));
      std::vector<Tensor> tensors{Tensor::empty({n}, DType::kFloat32)};
      std::memset(tensors[0].data(), 0, bytes);
      auto time_one = [](auto&& fn) {
        const auto start = std::chrono::steady_clock::now();
        fn();
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count();
      };
      pg::AllreduceOptions async_opts, inline_opts;
      inline_opts.async_op = false;
      for (int i = 0; i < iters + 10; ++i) {
        const int k = i - 10;
        double t = time_one([&] {
          ::gloo::AllreduceOptions g(context);
          g.setOutput(tensors[0].data_as<float>(), n);
          g.setReduceFunction([](void* o, const void* a, const void* b, size_t count) {
            core::reduce_into(o, a, b, count, DType::kFloat32, ReduceOp::SUM);
          });
          g.setTag(i);
          ::gloo::allreduce(g);
        });
        if (k >= 0 && rank == 0) raw[k] = t;
        t = time_one([&] { backend.allreduce(tensors, async_opts)->wait(); });
        if (k >= 0 && rank == 0) async[k] = t;
        t = time_one([&] { backend.allreduce(tensors, inline_opts)->wait(); });
        if (k >= 0 && rank == 0) inline_[k] = t;
      }
    });
    std::printf(
        "[ perf ] allreduce %7lld bytes, 2 ranks, median us: gloo %.1f, "
        "backend async %.1f, backend inline %.1f\n",
        static_cast<long long>(bytes), median(raw), median(async), median(inline_));
  }
}

}  // namespace
}  // namespace c10d::backends::gloo
