// The DDP pieces over a real backend: ranks are threads of one process, each with a
// ProcessGroup on the shared-memory backend over one HashStore.
#include "c10d/ddp/reducer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "c10d/backends/shm/shm_backend.h"
#include "c10d/core/exception.h"
#include "c10d/ddp/bucket_assignment.h"
#include "c10d/ddp/comm.h"
#include "c10d/store/hash_store.h"
#include "c10d/store/prefix_store.h"

namespace c10d::ddp {
namespace {

using core::DType;
using namespace std::chrono_literals;

// heap_bytes: each rank's shared heap (0: the default).
template <typename Fn>
void run_ranks(int size, Fn fn, size_t heap_bytes = 0) {
  auto store = std::make_shared<store::HashStore>(10s);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        pg::ProcessGroupOptions opts;
        opts.backend = "shm";
        opts.timeout = 10s;
        auto group = std::make_shared<pg::ProcessGroup>(store, r, size, opts);
        backends::shm::ShmOptions shm;
        shm.timeout = 10s;
        shm.heap_bytes = heap_bytes;
        group->register_backend(core::DeviceType::kCPU,
                                std::make_shared<backends::shm::ShmBackend>(store, r, size, shm));
        fn(r, group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

Tensor filled(std::vector<int64_t> sizes, DType dtype, double value) {
  Tensor t = Tensor::empty(std::move(sizes), dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kFloat32) t.data_as<float>()[i] = static_cast<float>(value + i);
    if (dtype == DType::kFloat64) t.data_as<double>()[i] = value + i;
  }
  return t;
}

// Starts a pass with every gradient set to filled(..., 10 * rank + iteration): the mean over
// ranks is 5 + iteration + i at element i (2 ranks).
void start_pass(Reducer& reducer, const std::vector<Tensor>& grads, int rank, int iteration) {
  reducer.prepare_for_backward();
  for (const Tensor& g : grads) {
    Tensor fresh = filled(g.sizes(), g.dtype(), 10.0 * rank + iteration);
    std::memcpy(g.data(), fresh.data(), fresh.nbytes());
  }
}

TEST(BucketAssignment, ClosesBucketsAtTheLimitsAndSortsByFirstIndex) {
  std::vector<Tensor> t;
  for (int i = 0; i < 6; ++i) t.push_back(Tensor::empty({25}, DType::kFloat32));  // 100 B each
  t.push_back(Tensor::empty({10}, DType::kFloat64));
  // First bucket closes at >= 150 B (2 tensors), then at >= 250 B (3 tensors).
  BucketAssignment a = compute_bucket_assignment_by_size(t, {150, 250});
  ASSERT_EQ(a.buckets.size(), 4u);
  EXPECT_EQ(a.buckets[0], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(a.buckets[1], (std::vector<size_t>{2, 3, 4}));
  EXPECT_EQ(a.buckets[2], (std::vector<size_t>{5}));
  EXPECT_EQ(a.buckets[3], (std::vector<size_t>{6}));  // float64 goes alone
  EXPECT_EQ(a.size_limits, (std::vector<size_t>{150, 250, 250, 150}));
}

TEST(BucketAssignment, SparseGetsItsOwnBucketAndIndicesKeepReadyOrder) {
  std::vector<Tensor> t(3, Tensor::empty({4}, DType::kFloat32));
  BucketAssignment a = compute_bucket_assignment_by_size(t, {1 << 20}, {false, true, false});
  ASSERT_EQ(a.buckets.size(), 2u);
  EXPECT_EQ(a.buckets[0], (std::vector<size_t>{0, 2}));
  EXPECT_EQ(a.buckets[1], (std::vector<size_t>{1}));
  EXPECT_EQ(a.size_limits[1], 0u);
  BucketAssignment b = compute_bucket_assignment_by_size(t, {16}, {}, {2, 1, 0});
  ASSERT_EQ(b.buckets.size(), 3u);
  EXPECT_EQ(b.buckets[0], (std::vector<size_t>{2}));
  EXPECT_EQ(b.buckets[2], (std::vector<size_t>{0}));
  EXPECT_THROW(compute_bucket_assignment_by_size({}, {1}), core::InvalidArgument);
  EXPECT_THROW(compute_bucket_assignment_by_size(t, {}), core::InvalidArgument);
}

TEST(Reducer, AveragesGradientsBucketByBucket) {
  run_ranks(2, [](int rank, std::shared_ptr<pg::ProcessGroup> group) {
    std::vector<Tensor> grads{filled({3}, DType::kFloat32, 0), filled({2, 2}, DType::kFloat32, 0),
                              filled({5}, DType::kFloat64, 0)};
    Reducer reducer(grads, {{2}, {1, 0}}, {}, group);
    for (int iteration = 0; iteration < 3; ++iteration) {
      reducer.prepare_for_backward();
      for (size_t i = 0; i < grads.size(); ++i) {
        Tensor fresh = filled(grads[i].sizes(), grads[i].dtype(), 10.0 * rank + iteration);
        std::memcpy(grads[i].data(), fresh.data(), fresh.nbytes());
      }
      reducer.mark_ready(2);
      reducer.mark_ready(1);
      EXPECT_TRUE(reducer.in_backward());
      reducer.mark_ready(0);  // completes the last bucket: waits for every reduction
      EXPECT_FALSE(reducer.in_backward());
      // mean over ranks of 10 * rank + iteration + i = 5 + iteration + i
      for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(grads[0].data_as<float>()[i], 5 + iteration + i);
      for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(grads[1].data_as<float>()[i], 5 + iteration + i);
      for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(grads[2].data_as<double>()[i], 5 + iteration + i);
    }
    EXPECT_EQ(reducer.num_iterations(), 3);
    for (int64_t ns : reducer.backward_stats()) EXPECT_GE(ns, 0);
  });
}

// The buckets live in the shm backend's shared heap, where an allreduce reads and writes the
// peers' buckets directly; with the heap full they take plain memory. Averages exact either way.
TEST(Reducer, BucketsLiveInTheShmHeapUnlessItIsFull) {
  for (size_t heap : {size_t{0}, size_t{4096}}) {
    run_ranks(
        2,
        [heap](int rank, std::shared_ptr<pg::ProcessGroup> group) {
          auto shm = std::dynamic_pointer_cast<backends::shm::ShmBackend>(
              group->get_backend(core::DeviceType::kCPU));
          ASSERT_NE(shm, nullptr);
          std::vector<Tensor> grads{filled({1 << 16}, DType::kFloat32, 0),
                                    filled({3}, DType::kFloat64, 0)};
          Reducer reducer(grads, {{0}, {1}}, {}, group);
          for (size_t i = 0; i < grads.size(); ++i) {
            const Tensor view = reducer.bucket_view(i);
            // A heap of 4 KiB holds the small bucket only.
            EXPECT_EQ(shm->in_shared_heap(view.data(), view.nbytes()), heap == 0 || i == 1)
                << "heap " << heap << ", parameter " << i;
          }
          for (int iteration = 0; iteration < 3; ++iteration) {
            start_pass(reducer, grads, rank, iteration);
            reducer.mark_ready(0);
            reducer.mark_ready(1);
            for (int64_t i = 0; i < grads[0].numel(); i += 4099) {
              ASSERT_EQ(grads[0].data_as<float>()[i], 5 + iteration + i) << "element " << i;
            }
            for (int64_t i = 0; i < 3; ++i)
              EXPECT_EQ(grads[1].data_as<double>()[i], 5 + iteration + i);
          }
        },
        heap);
  }
}

// After a full pass the buckets are regrouped once, in the order rank 0 marked the gradients
// ready (rank 1 marks them in another order and takes rank 0's grouping); bucket contents
// are kept, later passes average exactly, and find_unused_parameters never rebuilds.
TEST(Reducer, RebuildsBucketsInRankZerosReadyOrderOnce) {
  run_ranks(2, [](int rank, std::shared_ptr<pg::ProcessGroup> group) {
    std::vector<Tensor> grads;
    for (int i = 0; i < 4; ++i) grads.push_back(filled({4}, DType::kFloat32, 0));
    ReducerOptions opts;
    opts.first_bucket_bytes_cap = 16;  // one parameter
    opts.bucket_bytes_cap = 32;        // two
    Reducer reducer(grads, {{0, 1, 2, 3}}, {}, group, opts);
    EXPECT_FALSE(reducer.rebuild_buckets());  // no pass yet
    const std::vector<size_t> order =
        rank == 0 ? std::vector<size_t>{3, 1, 2, 0} : std::vector<size_t>{0, 1, 2, 3};
    auto pass = [&](int iteration) {
      start_pass(reducer, grads, rank, iteration);
      for (size_t i : order) reducer.mark_ready(i);
      for (const Tensor& g : grads) {
        for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(g.data_as<float>()[i], 5 + iteration + i);
      }
    };
    pass(0);
    ASSERT_TRUE(reducer.rebuild_buckets());
    const std::vector<std::vector<size_t>> want{{3}, {1, 2}, {0}};
    EXPECT_EQ(reducer.bucket_indices(), want);
    EXPECT_TRUE(reducer.has_rebuilt_buckets());
    for (size_t i = 0; i < 4; ++i) {  // the last pass's averages, copied over
      EXPECT_EQ(reducer.bucket_view(i).data_as<float>()[1], 6) << "parameter " << i;
    }
    pass(1);
    pass(2);
    EXPECT_FALSE(reducer.rebuild_buckets());

    ReducerOptions unused;
    unused.find_unused_parameters = true;
    Reducer detecting(grads, {{0, 1, 2, 3}}, {}, group, unused);
    detecting.prepare_for_backward();
    for (size_t i : order) detecting.mark_ready(i);
    detecting.finalize_backward();
    EXPECT_FALSE(detecting.rebuild_buckets());
  });
}

// A reducer moved to another group reduces over it (its buckets now in that group's heap,
// contents kept) and may rebuild its buckets once more.
TEST(Reducer, UpdateProcessGroupMovesTheBucketsAndAllowsAnotherRebuild) {
  run_ranks(2, [](int rank, std::shared_ptr<pg::ProcessGroup> group) {
    auto store = std::make_shared<store::PrefixStore>("second", group->store());
    pg::ProcessGroupOptions opts;
    opts.backend = "shm";
    opts.timeout = 10s;
    auto second = std::make_shared<pg::ProcessGroup>(store, rank, 2, opts);
    backends::shm::ShmOptions shm;
    shm.timeout = 10s;
    auto second_shm = std::make_shared<backends::shm::ShmBackend>(store, rank, 2, shm);
    second->register_backend(core::DeviceType::kCPU, second_shm);

    std::vector<Tensor> grads{filled({4}, DType::kFloat32, 0), filled({4}, DType::kFloat32, 0)};
    Reducer reducer(grads, {{0, 1}}, {}, group);
    auto pass = [&](int iteration) {
      start_pass(reducer, grads, rank, iteration);
      reducer.mark_ready(1);
      reducer.mark_ready(0);
      for (const Tensor& g : grads) {
        for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(g.data_as<float>()[i], 5 + iteration + i);
      }
    };
    pass(0);
    ASSERT_TRUE(reducer.rebuild_buckets());
    reducer.update_process_group(second);
    EXPECT_EQ(reducer.process_group(), second);
    EXPECT_FALSE(reducer.has_rebuilt_buckets());
    const Tensor view = reducer.bucket_view(0);
    EXPECT_TRUE(second_shm->in_shared_heap(view.data(), view.nbytes()));
    EXPECT_EQ(view.data_as<float>()[2], 7);  // pass 0's average, kept
    pass(1);
    EXPECT_TRUE(reducer.rebuild_buckets());
    pass(2);
  });
}

TEST(Reducer, UnusedParametersAreZeroAndUntouchedWhenNoRankUsedThem) {
  run_ranks(2, [](int rank, std::shared_ptr<pg::ProcessGroup> group) {
    std::vector<Tensor> grads{filled({2}, DType::kFloat32, 1), filled({2}, DType::kFloat32, 1),
                              filled({2}, DType::kFloat32, 7)};
    ReducerOptions opts;
    opts.find_unused_parameters = true;
    Reducer reducer(grads, {{0, 1}, {2}}, {}, group, opts);
    reducer.prepare_for_backward();
    reducer.mark_ready(0);
    if (rank == 0) reducer.mark_ready(1);  // rank 1 did not use parameter 1; nobody used 2
    reducer.finalize_backward();
    EXPECT_EQ(grads[0].data_as<float>()[1], 2.0f);
    EXPECT_EQ(grads[1].data_as<float>()[1], 1.0f);  // (2 + 0) / 2 on both ranks
    EXPECT_EQ(grads[2].data_as<float>()[0], 7.0f);  // untouched
    EXPECT_EQ(reducer.local_used_map()[1], rank == 0);
  });
}

TEST(Reducer, UnfinishedPassNamesTheUnreadyParameters) {
  run_ranks(1, [](int, std::shared_ptr<pg::ProcessGroup> group) {
    std::vector<Tensor> grads{filled({2}, DType::kFloat32, 1), filled({2}, DType::kFloat32, 1)};
    Reducer reducer(grads, {{1}, {0}}, {}, group);
    reducer.prepare_for_backward();
    reducer.mark_ready(1);
    EXPECT_THROW(reducer.mark_ready(1), core::DistError);
    try {
      reducer.prepare_for_backward();
      ADD_FAILURE() << "a second pass started";
    } catch (const core::DistError& e) {
      EXPECT_NE(std::string(e.what()).find("parameters 0 were never marked"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(reducer.finalize_backward(), core::DistError);
    EXPECT_FALSE(reducer.in_backward());
    // Outside a pass gradients stay local (no_sync).
    reducer.mark_ready(0);
    EXPECT_EQ(grads[0].data_as<float>()[0], 1.0f);
    EXPECT_THROW(reducer.mark_ready(2), core::InvalidArgument);
  });
}

TEST(Reducer, CommHooksReplaceTheAllreduce) {
  run_ranks(2, [](int rank, std::shared_ptr<pg::ProcessGroup> group) {
    std::vector<Tensor> grads{filled({4}, DType::kFloat32, 2.0 * rank)};
    Reducer reducer(grads, {{0}}, {}, group);
    reducer.register_builtin_comm_hook(BuiltinCommHookType::kFp16Compress);
    EXPECT_THROW(reducer.register_builtin_comm_hook(BuiltinCommHookType::kAllreduce),
                 core::DistError);
    reducer.prepare_for_backward();
    reducer.mark_ready(0);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(grads[0].data_as<float>()[i], 1.0f + i);

    // A hook whose future resolves to another tensor: its values are what lands.
    Reducer custom(grads, {{0}}, {}, group);
    custom.register_comm_hook([](GradBucket& bucket) {
      EXPECT_TRUE(bucket.is_last());
      EXPECT_EQ(bucket.gradients().size(), 1u);
      auto future = std::make_shared<Future>();
      future->mark_completed({{filled(bucket.buffer().sizes(), DType::kFloat32, 100)}, nullptr});
      return future;
    });
    custom.prepare_for_backward();
    custom.mark_ready(0);
    EXPECT_EQ(grads[0].data_as<float>()[3], 103.0f);
  });
}

TEST(DdpComm, BroadcastCoalescedAndParameterCheck) {
  run_ranks(3, [](int rank, std::shared_ptr<pg::ProcessGroup> group) {
    std::vector<Tensor> state{filled({5}, DType::kFloat32, rank),
                              filled({3}, DType::kFloat64, rank),
                              filled({300}, DType::kFloat32, rank)};
    broadcast_coalesced(group, state, 64, 1);
    EXPECT_EQ(state[0].data_as<float>()[4], 5.0f);
    EXPECT_EQ(state[1].data_as<double>()[0], 1.0);
    EXPECT_EQ(state[2].data_as<float>()[299], 300.0f);
    verify_params_across_processes(group, state);
    std::vector<Tensor> odd = state;
    if (rank == 2) odd[2] = Tensor::empty({10, 30}, DType::kFloat32);
    try {
      verify_params_across_processes(group, odd);
      ADD_FAILURE() << "rank 2's different shape passed on rank " << rank;
    } catch (const core::DistError& e) {
      const std::string want = rank == 2 ? "sizes [10, 30]" : "rank 2's parameters differ";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    std::vector<Tensor> fewer = state;
    if (rank == 0) fewer.pop_back();
    EXPECT_THROW(verify_params_across_processes(group, fewer), core::DistError);
  });
}

}  // namespace
}  // namespace c10d::ddp
