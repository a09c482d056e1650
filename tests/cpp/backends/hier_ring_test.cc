// The hierarchical backend's ring between hosts on its own: members as threads over loopback.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "c10d/backends/hier/ring.h"
#include "c10d/core/exception.h"
#include "c10d/store/hash_store.h"
#include "rank_threads.h"

namespace c10d::backends::hier {
namespace {

using core::DType;
using core::ReduceOp;
using rank_threads::expect_same;
using rank_threads::expected_reduce;
using rank_threads::filled;
using namespace std::chrono_literals;

// Runs fn(member, ring) on one thread per member of a ring of `size` over 127.0.0.1 (global
// ranks 10, 11, ...); returns what each member threw ("" for nothing).
template <typename Fn>
std::vector<std::string> run_members(int size, pg::Millis timeout, Fn fn) {
  store::HashStore store(10s);
  std::vector<int> ranks;
  for (int m = 0; m < size; ++m) ranks.push_back(10 + m);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int m = 0; m < size; ++m) {
    threads.emplace_back([&, m] {
      try {
        CrossRing ring(store, m, ranks, "127.0.0.1", timeout);
        fn(m, ring);
      } catch (const std::exception& e) {
        errors[m] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(CrossRing, AllreduceIsExactAndTheSameOnEveryMember) {
  for (int size : {2, 3}) {
    // Uneven chunks, several fold pieces per chunk, and fewer elements than members.
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{300001}}) {
      for (const ReduceOp& op : {ReduceOp(ReduceOp::SUM), ReduceOp(ReduceOp::MAX)}) {
        const auto errors = run_members(size, 10s, [&](int m, CrossRing& ring) {
          for (DType dtype : {DType::kFloat64, DType::kInt32, DType::kFloat16}) {
            core::Tensor t = filled(n, dtype, m);
            ring.allreduce(t.data(), static_cast<size_t>(n), dtype, op, 10s, 7);
            expect_same(t, expected_reduce(n, dtype, size, op),
                        "size " + std::to_string(size) + " n " + std::to_string(n));
          }
        });
        for (const auto& e : errors) EXPECT_EQ(e, "");
      }
    }
  }
}

TEST(CrossRing, MembersInDifferentCollectivesFailAndTheRingStaysBroken) {
  const auto errors = run_members(3, 1s, [](int m, CrossRing& ring) {
    std::vector<double> data(m == 0 ? 10 : 12, 1.0);
    try {
      ring.allreduce(data.data(), data.size(), DType::kFloat64, ReduceOp(ReduceOp::SUM), 1s, 4);
      ADD_FAILURE() << "member " << m << " finished a mismatched allreduce";
    } catch (const core::DistError&) {
    }
    ring.allreduce(data.data(), data.size(), DType::kFloat64, ReduceOp(ReduceOp::SUM), 1s, 5);
  });
  // Members 0 and 1 read a header of the other size; member 2 then waits for member 1's data.
  for (int m = 0; m < 2; ++m) {
    EXPECT_NE(errors[m].find("called different collectives"), std::string::npos) << errors[m];
    EXPECT_NE(errors[m].find("sequence 4"), std::string::npos) << errors[m];
  }
  for (const auto& e : errors) {
    EXPECT_NE(e.find("allreduce (sequence 5"), std::string::npos) << e;
    EXPECT_NE(e.find("the ring broke earlier"), std::string::npos) << e;
  }
}

TEST(CrossRing, TimeoutNamesTheMemberWaitedFor) {
  std::atomic<bool> done{false};
  const auto errors = run_members(2, 10s, [&](int m, CrossRing& ring) {
    if (m == 1) {
      rank_threads::wait_for(done, 30s);  // connected, but never joins
      return;
    }
    rank_threads::SetOnExit release{done};
    std::vector<float> data(100, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(ring.allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp(ReduceOp::SUM),
                                300ms, 0),
                 core::DistTimeoutError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
    try {
      ring.allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp(ReduceOp::SUM), 300ms, 1);
    } catch (const core::DistError& e) {
      throw std::runtime_error(e.what());  // for the message checks below
    }
  });
  EXPECT_NE(errors[0].find("rank 11 on host 127.0.0.1 (ring member 1, port "), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("timed out after 300ms"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

TEST(CrossRing, AbortEndsABlockedOperationAtOnce) {
  std::atomic<bool> done{false};
  const auto errors = run_members(2, 30s, [&](int m, CrossRing& ring) {
    if (m == 1) {
      rank_threads::wait_for(done, 30s);
      return;
    }
    rank_threads::SetOnExit release{done};
    std::thread aborter([&] {
      std::this_thread::sleep_for(100ms);
      ring.abort();
    });
    std::vector<float> data(100, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(
        ring.allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp(ReduceOp::SUM), 30s, 0),
        core::DistBackendError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    aborter.join();
  });
  EXPECT_EQ(errors[0], "");
}

TEST(CrossRing, AMemberThatNeverConnectsTimesOutNamingIt) {
  store::HashStore store(2s);
  const auto start = std::chrono::steady_clock::now();
  try {
    CrossRing ring(store, 0, {4, 5}, "127.0.0.1", 500ms);
    ADD_FAILURE() << "a ring without its second member connected";
  } catch (const core::DistTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("the addresses of ranks 5 did not arrive"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace c10d::backends::hier
