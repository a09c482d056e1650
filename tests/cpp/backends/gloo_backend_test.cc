// GlooBackend tests beyond the shared suite (backend_conformance_test.cc): several local
// tensors, sync calls between queued ones, coalesced allreduce, error wording, latency.
#include "c10d/backends/gloo/gloo_backend.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "c10d/backends/gloo/loop_waker.h"

#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"
#include "rank_threads.h"

namespace c10d::backends::gloo {
namespace {

using core::DType;
using core::ReduceOp;
using core::Tensor;
using rank_threads::expect_same;
using rank_threads::expected_reduce;
using rank_threads::filled;
using namespace std::chrono_literals;

const DevicePtr& loopback() {
  static DevicePtr device = GlooBackend::create_device_for_hostname("127.0.0.1");
  return device;
}

// Runs fn(rank, backend) on one thread per rank, every rank on the shared loopback device.
template <typename Fn>
void run_ranks(int size, Fn fn, pg::Millis timeout = 10s, GlooOptions opts = {}) {
  opts.devices = {loopback()};
  opts.timeout = timeout;
  rank_threads::run_rank_threads(
      size,
      [&](std::shared_ptr<store::Store> store, int rank) {
        return std::make_unique<GlooBackend>(std::move(store), rank, size, opts);
      },
      fn);
}

TEST(GlooBackend, AllreduceInlineMixedWithAsync) {
  run_ranks(3, [](int rank, GlooBackend& backend) {
    std::vector<Tensor> queued{filled(7, DType::kInt32, rank)};
    std::vector<Tensor> inline_tensors{filled(7, DType::kFloat32, rank)};
    auto first = backend.allreduce(queued, pg::AllreduceOptions{});
    pg::AllreduceOptions opts;
    opts.reduce_op = ReduceOp::AVG;
    opts.async_op = false;
    // The synchronous one runs after the queued one (the caller waits for its turn).
    backend.allreduce(inline_tensors, opts)->wait();
    EXPECT_TRUE(first->is_completed());
    expect_same(inline_tensors[0], expected_reduce(7, DType::kFloat32, 3, ReduceOp::AVG),
                "sync allreduce");
    first->wait();
    expect_same(queued[0], expected_reduce(7, DType::kInt32, 3, ReduceOp::SUM), "queued allreduce");
  });
}

// On the ring and on Gloo's own allreduce (GlooOptions::ring).
GlooOptions with_ring(bool ring) {
  GlooOptions opts;
  opts.ring = ring;
  return opts;
}

TEST(GlooBackend, AllreduceSeveralLocalTensors) {
  for (bool ring : {true, false}) {
    run_ranks(
        2,
        [](int rank, GlooBackend& backend) {
          std::vector<Tensor> tensors{filled(5, DType::kFloat32, rank),
                                      filled(5, DType::kFloat32, rank)};
          backend.allreduce(tensors, pg::AllreduceOptions{})->wait();
          Tensor expected = expected_reduce(5, DType::kFloat32, 2, ReduceOp::SUM);
          core::reduce(expected.data(), expected.data(), 5, DType::kFloat32, ReduceOp::SUM);
          expect_same(tensors[0], expected, "tensor 0");
          expect_same(tensors[1], expected, "tensor 1");
        },
        10s, with_ring(ring));
  }
}

TEST(GlooBackend, AllreduceCoalesced) {
  for (bool ring : {true, false}) {
    run_ranks(
        3,
        [](int rank, GlooBackend& backend) {
          std::vector<Tensor> tensors{filled(3, DType::kInt32, rank),
                                      filled(0, DType::kInt32, rank),
                                      filled(8, DType::kInt32, rank)};
          pg::AllreduceCoalescedOptions opts;
          opts.reduce_op = ReduceOp::MAX;
          backend.allreduce_coalesced(tensors, opts)->wait();
          expect_same(tensors[0], expected_reduce(3, DType::kInt32, 3, ReduceOp::MAX), "tensor 0");
          expect_same(tensors[2], expected_reduce(8, DType::kInt32, 3, ReduceOp::MAX), "tensor 2");
        },
        10s, with_ring(ring));
  }
}

// Gloo names the peer whose connection closed as "peer rank N", the ring as "rank N on host
// ..." (the shared suite checks the operation, its sequence and the rank).
TEST(GlooBackend, DeadPeerErrorNamesThePeer) {
  // reduce runs on Gloo after its call's check: on the ring, or without one a Gloo all-gather,
  // whose error Gloo words.
  for (bool ring : {true, false}) {
    run_ranks(
        2,
        [ring](int rank, GlooBackend& backend) {
          if (rank == 1) {
            backend.shutdown();
            return;
          }
          std::vector<Tensor> tensors{filled(1000, DType::kFloat32, rank)};
          try {
            backend.reduce(tensors, pg::ReduceOptions{})->wait();
            ADD_FAILURE() << "reduce with a dead peer succeeded";
          } catch (const core::DistBackendError& e) {
            EXPECT_NE(
                std::string(e.what()).find(
                    ring ? "Gloo reduce (sequence 0, rank 0): rank 1 on host " : "peer rank 1"),
                std::string::npos)
                << e.what();
          }
          if (!ring) return;
          try {
            backend.allreduce(tensors, pg::AllreduceOptions{})->wait();
            ADD_FAILURE() << "allreduce with a dead peer succeeded";
          } catch (const core::DistBackendError& e) {
            EXPECT_NE(std::string(e.what()).find("Gloo allreduce (sequence 1, rank 0, 4000 bytes)"),
                      std::string::npos)
                << e.what();
            EXPECT_NE(std::string(e.what()).find("rank 1 on host 127.0.0.1"), std::string::npos)
                << e.what();
          }
        },
        20s, with_ring(ring));
  }
}

// all_reduce and reduce_scatter share one ring: asynchronous operations and synchronous ones
// between them meet their peers' in the same order, and give exact results.
TEST(GlooBackend, RingOperationsFromSeveralThreadsKeepTheirOrder) {
  GlooOptions opts = with_ring(true);
  opts.threads = 3;
  run_ranks(
      3,
      [](int rank, GlooBackend& backend) {
        const int64_t n = 3 * 20000;  // several fold pieces per ring chunk
        std::vector<std::vector<Tensor>> sums;
        std::vector<Tensor> scattered;
        std::vector<WorkPtr> works;
        pg::AllreduceOptions inline_opts;
        inline_opts.async_op = false;
        for (int i = 0; i < 12; ++i) {
          sums.push_back({filled(n + i, DType::kFloat64, rank, i)});
          works.push_back(backend.allreduce(sums.back(), pg::AllreduceOptions{}));
          Tensor input = filled(n, DType::kInt64, rank);
          scattered.push_back(Tensor::empty({n / 3}, DType::kInt64));
          works.push_back(
              backend.reduce_scatter_base(scattered.back(), input, pg::ReduceScatterOptions{}));
          if (i % 4 == 3) {
            std::vector<Tensor> now{filled(n, DType::kInt32, rank)};
            backend.allreduce(now, inline_opts)->wait();
            expect_same(now[0], expected_reduce(n, DType::kInt32, 3, ReduceOp::SUM), "inline");
          }
        }
        for (auto& w : works) w->wait();
        const Tensor full = expected_reduce(n, DType::kInt64, 3, ReduceOp::SUM);
        for (int i = 0; i < 12; ++i) {
          expect_same(sums[i][0], expected_reduce(n + i, DType::kFloat64, 3, ReduceOp::SUM, i),
                      "async allreduce " + std::to_string(i));
          expect_same(scattered[i], full.flat_slice(rank * (n / 3), n / 3),
                      "reduce_scatter " + std::to_string(i));
        }
      },
      20s, opts);
}

// An operation waiting for its turn behind one blocked on the ring times out at its own
// timeout, naming the operation that holds the queue.
TEST(GlooBackend, WaitingBehindABlockedOperationTimesOutNamingIt) {
  GlooOptions opts = with_ring(true);
  std::atomic<bool> done{false};
  run_ranks(
      2,
      [&](int rank, GlooBackend& backend) {
        if (rank == 1) {
          rank_threads::wait_for(done, 30s);  // never joins the allreduces
          return;
        }
        rank_threads::SetOnExit release{done};
        std::vector<Tensor> a{filled(100, DType::kFloat32, rank)};
        std::vector<Tensor> b{filled(100, DType::kFloat32, rank)};
        auto first = backend.allreduce(a, pg::AllreduceOptions{});
        std::this_thread::sleep_for(100ms);  // the worker takes the ring first
        pg::AllreduceOptions second_opts;
        second_opts.async_op = false;
        second_opts.timeout = 300ms;
        const auto start = std::chrono::steady_clock::now();
        try {
          backend.allreduce(b, second_opts)->wait();
          ADD_FAILURE() << "an allreduce behind a blocked one returned";
        } catch (const core::DistTimeoutError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("Gloo allreduce (sequence 1, rank 0 of 2): timed out after 300ms "
                              "waiting for the operations submitted before it"),
                    std::string::npos)
              << what;
          EXPECT_NE(what.find("(running: allreduce, sequence 0)"), std::string::npos) << what;
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
        backend.shutdown();
        EXPECT_THROW(first->wait(), core::DistBackendError);
      },
      30s, opts);
}

// shutdown() ends an operation blocked on the ring and one waiting for its turn behind it.
TEST(GlooBackend, ShutdownEndsRingOperationsRunningAndWaiting) {
  GlooOptions opts = with_ring(true);
  opts.threads = 2;
  std::atomic<bool> done{false};
  run_ranks(
      2,
      [&](int rank, GlooBackend& backend) {
        if (rank == 1) {
          rank_threads::wait_for(done, 30s);  // never joins the allreduces
          return;
        }
        rank_threads::SetOnExit release{done};
        std::vector<Tensor> a{filled(100, DType::kFloat32, rank)};
        std::vector<Tensor> b{filled(100, DType::kFloat32, rank)};
        auto first = backend.allreduce(a, pg::AllreduceOptions{});
        auto second = backend.allreduce(b, pg::AllreduceOptions{});
        std::this_thread::sleep_for(200ms);
        const auto start = std::chrono::steady_clock::now();
        backend.shutdown();
        EXPECT_THROW(first->wait(), core::DistBackendError);
        EXPECT_THROW(second->wait(), core::DistBackendError);
        EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
      },
      30s, opts);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Gloo makes a thread that leaves a device's event loop wait for the loop's next turn, and an
// idle loop turns every 10 ms; with a waker, leaving takes a poke period (0.1 ms). The median of
// 21 leaves is 5 ms on average without one, so a 3 ms bound separates the two with room for a
// loaded machine.
TEST(GlooBackend, LoopWakerEndsWaitsForTheLoopsTurn) {
  struct Idle : ::gloo::transport::tcp::Handler {
    void handleEvents(int) override {}
  } idle;
  auto device = GlooBackend::create_device_for_hostname("127.0.0.1");
  auto* tcp = dynamic_cast<::gloo::transport::tcp::Device*>(device.get());
  ASSERT_NE(tcp, nullptr);
  const int fd = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<double> leaves;
  {
    LoopWaker waker(device);
    for (int i = 0; i < 21; ++i) {
      tcp->registerDescriptor(fd, EPOLLIN, &idle);
      const auto start = std::chrono::steady_clock::now();
      tcp->unregisterDescriptor(fd, &idle);
      leaves.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
  }
  ::close(fd);
  EXPECT_LT(median(leaves), 3.0) << "leaving the loop waited for its idle period";
  // The device is destroyed while a released waker pokes its loop, and the waker then has
  // nothing to leave.
  {
    LoopWaker waker(device);
    waker.release_device();
    device.reset();
  }
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
