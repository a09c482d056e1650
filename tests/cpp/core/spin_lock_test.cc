#include "c10d/core/spin_lock.h"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>
#include <vector>

namespace c10d::core {
namespace {

TEST(SpinLock, TryLockFailsWhileHeldAndSucceedsAfter) {
  SpinLock lock;
  ASSERT_TRUE(lock.try_lock());
  EXPECT_FALSE(lock.try_lock());
  lock.unlock();
  EXPECT_TRUE(lock.try_lock());
  lock.unlock();
}

// More threads than this machine's cores, each taking the lock many times: a lost update
// (two holders at once) shows as a short count, a lost wake-up as a hang (ctest's timeout).
TEST(SpinLock, ExcludesUnderContentionWithMoreThreadsThanCores) {
  SpinLock lock;
  constexpr int kThreads = 6;
  constexpr int kRounds = 50000;
  int64_t counter = 0;  // guarded by lock
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard guard(lock);
        const int64_t seen = counter;
        if (i % 1024 == 0) std::this_thread::yield();  // a holder that loses its CPU
        counter = seen + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, int64_t{kThreads} * kRounds);
}

}  // namespace
}  // namespace c10d::core
