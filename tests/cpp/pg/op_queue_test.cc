// OpQueue::stop's report of a running operation, which backends act on: Gloo resets its
// connections for one (dropping what the kernel has not delivered yet), shm marks it
// abandoned. An operation whose Work a caller already saw complete must not count.
#include "c10d/pg/op_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>

namespace c10d::pg {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<OpQueue> make_queue() {
  return std::make_shared<OpQueue>(OpQueue::Config::of("test", "Test", 0, 1));
}

TEST(OpQueue, StopCountsAnOperationWhoseBodyStillRuns) {
  auto queue = make_queue();
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  auto work = queue->submit(core::OpType::kAllreduce, "allreduce", Millis(30000), /*async=*/true,
                            [&started, released](const QueuedOp&) {
                              started.set_value();
                              released.wait();
                            },
                            {});
  ASSERT_EQ(started.get_future().wait_for(30s), std::future_status::ready);
  std::optional<bool> running;
  EXPECT_TRUE(queue->stop([&running](bool r) { running = r; }));
  release.set_value();
  queue->join();
  EXPECT_EQ(running, std::optional<bool>(true));
  EXPECT_TRUE(work->is_completed());
}

TEST(OpQueue, StopDoesNotCountAnOperationWhoseWorkCompleted) {
  auto queue = make_queue();
  std::promise<void> go, completed, release;
  std::shared_future<void> going = go.get_future().share();
  std::shared_future<void> released = release.get_future().share();
  auto work = queue->submit(core::OpType::kAllreduce, "allreduce", Millis(30000), /*async=*/true,
                            [going](const QueuedOp&) { going.wait(); }, {});
  // The Work's callbacks run on the worker as it completes the Work, before the queue counts
  // the operation as finished: the worker is held there while stop() looks.
  work->get_future()->add_callback([&completed, released](core::Future&) {
    completed.set_value();
    released.wait();
  });
  go.set_value();
  ASSERT_EQ(completed.get_future().wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(work->is_completed());
  std::optional<bool> running;
  EXPECT_TRUE(queue->stop([&running](bool r) { running = r; }));
  release.set_value();
  queue->join();
  EXPECT_EQ(running, std::optional<bool>(false));
}

}  // namespace
}  // namespace c10d::pg
