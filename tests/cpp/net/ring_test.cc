// The ring all_reduce runs on (Gloo and hier backends), on its own: members as threads over
// loopback.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../backends/rank_threads.h"
#include "c10d/core/exception.h"
#include "c10d/net/ring.h"
#include "c10d/store/hash_store.h"

namespace c10d::net {
namespace {

namespace rank_threads = backends::rank_threads;
using core::DType;
using core::ReduceOp;
using rank_threads::expect_same;
using rank_threads::expected_reduce;
using rank_threads::filled;
using namespace std::chrono_literals;

pg::Signature allreduce_call(uint64_t seq) { return pg::Signature(core::OpType::kAllreduce, seq); }

// Runs fn(member, ring) on one thread per member of a ring of `size` over 127.0.0.1 (global
// ranks 10, 11, ...); returns what each member threw ("" for nothing).
template <typename Fn>
std::vector<std::string> run_members(int size, pg::Millis timeout, Fn fn) {
  auto store = std::make_shared<store::HashStore>(10s);
  std::vector<int> ranks;
  for (int m = 0; m < size; ++m) ranks.push_back(10 + m);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int m = 0; m < size; ++m) {
    threads.emplace_back([&, m] {
      try {
        Ring ring(store, m, ranks, "127.0.0.1", timeout, Ring::Label{"test", " in the test"});
        fn(m, ring);
      } catch (const std::exception& e) {
        errors[m] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(Ring, AllreduceIsExactAndTheSameOnEveryMember) {
  for (int size : {2, 3}) {
    // Uneven chunks, several fold pieces per chunk, and fewer elements than members.
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{300001}}) {
      for (const ReduceOp& op : {ReduceOp(ReduceOp::SUM), ReduceOp(ReduceOp::MAX)}) {
        const auto errors = run_members(size, 10s, [&](int m, Ring& ring) {
          for (DType dtype : {DType::kFloat64, DType::kInt32, DType::kFloat16}) {
            core::Tensor t = filled(n, dtype, m);
            ring.allreduce(t.data(), static_cast<size_t>(n), dtype, op, 10s, allreduce_call(7));
            expect_same(t, expected_reduce(n, dtype, size, op),
                        "size " + std::to_string(size) + " n " + std::to_string(n));
          }
        });
        for (const auto& e : errors) EXPECT_EQ(e, "");
      }
    }
  }
}

TEST(Ring, AllgatherAndBroadcastReachEveryMember) {
  for (int size : {2, 3}) {
    // One byte, and several poll rounds' worth.
    for (size_t bytes : {size_t{1}, size_t{3} << 20}) {
      const auto errors = run_members(size, 10s, [&](int m, Ring& ring) {
        std::vector<unsigned char> blocks(bytes * size, 0);
        for (size_t i = 0; i < bytes; ++i)
          blocks[m * bytes + i] = static_cast<unsigned char>(m + i);
        ring.allgather(blocks.data(), bytes, 10s, pg::Signature(core::OpType::kAllgatherBase, 1));
        for (int from = 0; from < size; ++from) {
          for (size_t i = 0; i < bytes; ++i) {
            ASSERT_EQ(blocks[from * bytes + i], static_cast<unsigned char>(from + i))
                << "allgather, member " << m << ", block " << from << ", byte " << i;
          }
        }
        for (int root = 0; root < size; ++root) {
          std::vector<unsigned char> data(bytes, 0);
          if (m == root) {
            for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(7 * root + i);
          }
          ring.broadcast(data.data(), bytes, root, 10s,
                         pg::Signature(core::OpType::kBroadcast, 2 + root).from(root));
          for (size_t i = 0; i < bytes; ++i) {
            ASSERT_EQ(data[i], static_cast<unsigned char>(7 * root + i))
                << "broadcast from " << root << ", member " << m << ", byte " << i;
          }
        }
      });
      for (const auto& e : errors) EXPECT_EQ(e, "");
    }
  }
}

TEST(Ring, BroadcastsFromDifferentRootsFailNamingTheOther) {
  const auto errors = run_members(2, 1s, [](int m, Ring& ring) {
    std::vector<char> data(16);
    ring.broadcast(data.data(), data.size(), m, 1s,
                   pg::Signature(core::OpType::kBroadcast, 3).of(DType::kUInt8, 16).from(10 + m));
  });
  EXPECT_NE(errors[0].find("rank 11 on host 127.0.0.1 (ring member 1, port "), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("runs broadcast sequence 3 of 16 uint8 elements from root 11 where this "
                           "rank runs broadcast sequence 3 of 16 uint8 elements from root 10"),
            std::string::npos)
      << errors[0];
}

TEST(Ring, MembersInDifferentCollectivesFailAndTheRingStaysBroken) {
  const auto errors = run_members(3, 1s, [](int m, Ring& ring) {
    std::vector<double> data(m == 0 ? 10 : 12, 1.0);
    try {
      ring.allreduce(data.data(), data.size(), DType::kFloat64, ReduceOp(ReduceOp::SUM), 1s,
                     allreduce_call(4));
      ADD_FAILURE() << "member " << m << " finished a mismatched allreduce";
    } catch (const core::DistError&) {
    }
    ring.allreduce(data.data(), data.size(), DType::kFloat64, ReduceOp(ReduceOp::SUM), 1s,
                   allreduce_call(5));
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

TEST(Ring, TimeoutNamesTheMemberWaitedFor) {
  std::atomic<bool> done{false};
  const auto errors = run_members(2, 10s, [&](int m, Ring& ring) {
    if (m == 1) {
      rank_threads::wait_for(done, 30s);  // connected, but never joins
      return;
    }
    rank_threads::SetOnExit release{done};
    std::vector<float> data(100, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(ring.allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp(ReduceOp::SUM),
                                300ms, allreduce_call(0)),
                 core::DistTimeoutError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
    try {
      ring.allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp(ReduceOp::SUM), 300ms,
                     allreduce_call(1));
    } catch (const core::DistError& e) {
      throw std::runtime_error(e.what());  // for the message checks below
    }
  });
  EXPECT_NE(errors[0].find("rank 11 on host 127.0.0.1 (ring member 1, port "), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find(" Timed out after 300ms "), std::string::npos) << errors[0];
  // The second operation refuses, quoting the first's failure; both carry the ring's label.
  EXPECT_EQ(errors[0].rfind("test allreduce (sequence 1, rank 10, 400 bytes) in the test: the "
                            "ring broke earlier: test allreduce (sequence 0, rank 10, 400 bytes) "
                            "in the test: Timed out",
                            0),
            0)
      << errors[0];
  EXPECT_EQ(errors[1], "");
}

TEST(Ring, AbortEndsABlockedOperationAtOnce) {
  std::atomic<bool> done{false};
  const auto errors = run_members(2, 30s, [&](int m, Ring& ring) {
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
    EXPECT_THROW(ring.allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp(ReduceOp::SUM),
                                30s, allreduce_call(0)),
                 core::DistBackendError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    aborter.join();
  });
  EXPECT_EQ(errors[0], "");
}

// A member whose operation failed and whose backend then shut down (destroy_process_group
// right after the error) leaves the failure, not the shutdown, for a slower neighbour to read.
TEST(Ring, AShutdownAfterAFailureLeavesTheFailureForTheNeighbours) {
  std::atomic<bool> failed{false};
  const auto errors = run_members(2, 10s, [&](int m, Ring& ring) {
    std::vector<float> data(100, 1.0f);
    if (m == 0) {
      rank_threads::SetOnExit release{failed};
      EXPECT_THROW(ring.allreduce(data.data(), data.size(), DType::kFloat32,
                                  ReduceOp(ReduceOp::SUM), 300ms, allreduce_call(0)),
                   core::DistTimeoutError);
      ring.abort();
      return;
    }
    rank_threads::wait_for(failed, 30s);
    ring.allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp(ReduceOp::SUM), 5s,
                   allreduce_call(0));
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("rank 10 on host 127.0.0.1 (ring member 0, port "), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("after it failed: test allreduce (sequence 0, rank 10, 400 bytes) in "
                           "the test: Timed out after 300ms"),
            std::string::npos)
      << errors[1];
  EXPECT_EQ(errors[1].find("the backend was shut down"), std::string::npos) << errors[1];
}

TEST(Ring, AMemberThatNeverConnectsTimesOutNamingIt) {
  auto store = std::make_shared<store::HashStore>(2s);
  const auto start = std::chrono::steady_clock::now();
  try {
    Ring ring(store, 0, {4, 5}, "127.0.0.1", 500ms, Ring::Label{"test", ""});
    ADD_FAILURE() << "a ring without its second member connected";
  } catch (const core::DistTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("the addresses of ranks 5 did not arrive"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace c10d::net
