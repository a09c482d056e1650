// StoreCollectives with ranks as threads over one HashStore, world sizes 1..4.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "c10d/control/store_collectives.h"
#include "c10d/core/exception.h"
#include "c10d/store/hash_store.h"

namespace c10d::control {
namespace {

using namespace std::chrono_literals;
using store::to_bytes;
using store::to_string;

constexpr Millis kTimeout = 10s;

// Runs fn(collectives of rank r) on one thread per rank; rethrows the first failure.
void run_ranks(int world_size, const std::function<void(StoreCollectives&)>& fn) {
  auto store = std::make_shared<store::HashStore>();
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        StoreCollectives c(store, r, world_size);
        fn(c);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

class StoreCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(StoreCollectivesTest, Barrier) {
  run_ranks(GetParam(), [](StoreCollectives& c) {
    c.barrier("b1", kTimeout);
    c.barrier("b2", kTimeout);
  });
}

TEST_P(StoreCollectivesTest, AllSum) {
  const int n = GetParam();
  run_ranks(n, [n](StoreCollectives& c) {
    EXPECT_EQ(c.all_sum("sum", c.rank() + 1, kTimeout), n * (n + 1) / 2);
    EXPECT_EQ(c.all_sum("neg", -7, kTimeout), -7 * n);
  });
}

TEST_P(StoreCollectivesTest, Broadcast) {
  run_ranks(GetParam(), [](StoreCollectives& c) {
    const int root = c.world_size() - 1;
    if (c.rank() == root) {
      c.broadcast_send("bc", to_bytes("hello"), kTimeout);
    } else {
      EXPECT_EQ(to_string(c.broadcast_recv("bc", kTimeout)), "hello");
    }
  });
}

TEST_P(StoreCollectivesTest, GatherIncludesOwnDataInRankOrder) {
  run_ranks(GetParam(), [](StoreCollectives& c) {
    auto mine = to_bytes("r" + std::to_string(c.rank()));
    if (c.rank() == 0) {
      auto all = c.gather_recv("g", mine, kTimeout);
      ASSERT_EQ(all.size(), static_cast<size_t>(c.world_size()));
      for (int r = 0; r < c.world_size(); ++r)
        EXPECT_EQ(to_string(all[r]), "r" + std::to_string(r));
    } else {
      c.gather_send("g", mine, kTimeout);
    }
  });
}

TEST_P(StoreCollectivesTest, Scatter) {
  run_ranks(GetParam(), [](StoreCollectives& c) {
    if (c.rank() == 0) {
      std::vector<Bytes> data;
      for (int r = 0; r < c.world_size(); ++r) data.push_back(to_bytes(std::string(r, 'x')));
      EXPECT_EQ(to_string(c.scatter_send("s", data, kTimeout)), "");
    } else {
      EXPECT_EQ(to_string(c.scatter_recv("s", kTimeout)), std::string(c.rank(), 'x'));
    }
  });
}

TEST_P(StoreCollectivesTest, AllGather) {
  run_ranks(GetParam(), [](StoreCollectives& c) {
    for (const char* key : {"ag1", "ag2"}) {
      auto all = c.all_gather(key, to_bytes(key + std::to_string(c.rank())), kTimeout);
      ASSERT_EQ(all.size(), static_cast<size_t>(c.world_size()));
      for (int r = 0; r < c.world_size(); ++r) {
        EXPECT_EQ(to_string(all[r]), key + std::to_string(r));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, StoreCollectivesTest, ::testing::Range(1, 5));

// Expects `fn` to throw a timeout whose message contains every fragment.
template <typename Fn>
void expect_timeout(Fn fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    FAIL() << "expected a timeout";
  } catch (const core::DistStoreTimeoutError& e) {
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(StoreCollectivesTimeout, BarrierNamesMissingRanks) {
  auto store = std::make_shared<store::HashStore>();
  StoreCollectives r0(store, 0, 4), r2(store, 2, 4);
  r2.barrier("b", 50ms, /*block=*/false);  // arrives, does not wait
  expect_timeout([&] { r0.barrier("b", 50ms); },
                 {"barrier(key='b')", "rank 0 of 4", "50ms", "rank(s) [1, 3] did not arrive"});
}

TEST(StoreCollectivesTimeout, AllSumAllGatherAndGatherNameMissingRanks) {
  auto store = std::make_shared<store::HashStore>();
  StoreCollectives r0(store, 0, 3), r1(store, 1, 3);
  expect_timeout([&] { r0.all_sum("s", 1, 30ms); }, {"all_sum(key='s')", "[1, 2]"});
  r1.gather_send("g", to_bytes("x"));
  expect_timeout([&] { r0.gather_recv("g", to_bytes("y"), 30ms); },
                 {"gather_recv(key='g')", "rank(s) [2] did not arrive"});
  expect_timeout([&] { r0.all_gather("ag", to_bytes("y"), 30ms); },
                 {"all_gather(key='ag')", "rank(s) [1, 2] did not arrive"});
}

TEST(StoreCollectivesTimeout, ReceiversSayNothingWasSent) {
  auto store = std::make_shared<store::HashStore>();
  StoreCollectives r1(store, 1, 2);
  expect_timeout([&] { r1.broadcast_recv("bc", 30ms); },
                 {"broadcast_recv(key='bc')", "no rank called broadcast_send"});
  expect_timeout([&] { r1.scatter_recv("sc", 30ms); },
                 {"scatter_recv(key='sc')", "no rank called scatter_send"});
}

TEST(StoreCollectivesErrors, KeyReuseIsRejected) {
  auto store = std::make_shared<store::HashStore>();
  StoreCollectives c(store, 0, 1);
  c.barrier("k");
  try {
    c.all_sum("k", 1);
    FAIL() << "reusing a key must throw";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("key 'k' was already used"), std::string::npos);
  }
}

TEST(StoreCollectivesErrors, BadArguments) {
  auto store = std::make_shared<store::HashStore>();
  EXPECT_THROW(StoreCollectives(store, 2, 2), core::InvalidArgument);
  EXPECT_THROW(StoreCollectives(store, 0, 0), core::InvalidArgument);
  EXPECT_THROW(StoreCollectives(nullptr, 0, 1), core::InvalidArgument);
  StoreCollectives c(store, 0, 2);
  EXPECT_THROW(c.scatter_send("s", {to_bytes("only one")}), core::InvalidArgument);
}

}  // namespace
}  // namespace c10d::control
