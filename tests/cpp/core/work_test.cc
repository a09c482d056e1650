#include "c10d/core/work.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "c10d/core/exception.h"

namespace c10d::core {
namespace {

using namespace std::chrono_literals;

TEST(Future, CompletesOnAnotherThreadAndRunsCallbacks) {
  auto f = std::make_shared<Future>();
  int calls = 0;
  f->add_callback([&](Future& done) {
    EXPECT_TRUE(done.completed());
    ++calls;
  });
  std::thread t([&] { f->mark_completed({{Tensor::empty({4}, DType::kFloat32)}, nullptr}); });
  EXPECT_EQ(f->value().tensors.size(), 1u);
  t.join();
  EXPECT_EQ(calls, 1);
  // Late callbacks run at once.
  f->add_callback([&](Future&) { ++calls; });
  EXPECT_EQ(calls, 2);
  EXPECT_THROW(f->mark_completed({}), DistError);
}

TEST(Future, ThenChainsValuesAndErrors) {
  auto f = std::make_shared<Future>();
  auto child = f->then([](Future& parent) {
    FutureValue v = parent.value_now();
    v.tensors.push_back(Tensor::empty({1}, DType::kInt8));
    return v;
  });
  auto failing = f->then([](Future&) -> FutureValue { throw DistBackendError("boom"); });
  f->mark_completed({});
  EXPECT_EQ(child->value().tensors.size(), 1u);
  EXPECT_THROW(failing->wait(), DistBackendError);

  auto g = std::make_shared<Future>();
  auto g_child = g->then([](Future&) { return FutureValue{}; });
  g->set_error(std::make_exception_ptr(DistNetworkError("peer 3 went away")));
  EXPECT_THROW(g_child->wait(), DistNetworkError);
}

TEST(Future, WaitRunsTheDriverAndThenChildrenInheritIt) {
  auto f = std::make_shared<Future>();
  std::vector<Millis> driven;
  f->set_driver([&](Millis timeout) {
    driven.push_back(timeout);
    if (!f->completed()) f->mark_completed({});
  });
  auto child = f->then([](Future&) { return FutureValue{}; });
  // Nobody else completes f: only the driver, which the child's wait runs too.
  child->wait(5s, "child");
  EXPECT_TRUE(f->completed());
  ASSERT_EQ(driven.size(), 1u);
  EXPECT_EQ(driven[0], Millis(5000));
  f->wait();  // completed: no driving
  EXPECT_EQ(driven.size(), 1u);
}

TEST(Future, WaitTimeoutNamesWhat) {
  Future f;
  try {
    f.wait(50ms, "allreduce seq 7");
    FAIL();
  } catch (const DistTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce seq 7"), std::string::npos);
  }
}

TEST(Work, ErrorSetOnBackgroundThreadIsRethrownByWait) {
  auto work = std::make_shared<Work>(OpType::kAllreduce, "allreduce #3");
  EXPECT_FALSE(work->is_completed());
  std::thread t(
      [&] { work->finish_with_error(std::make_exception_ptr(DistBackendError("rank 1 died"))); });
  EXPECT_THROW(work->wait(), DistBackendError);
  t.join();
  EXPECT_TRUE(work->is_completed());
  EXPECT_FALSE(work->is_success());
  EXPECT_NE(work->exception(), nullptr);
}

TEST(Work, SuccessResultSourceRankAndFromFuture) {
  Work w(OpType::kRecv);
  EXPECT_THROW(w.source_rank(), DistError);
  w.set_source_rank(2);
  w.finish({Tensor::empty({3}, DType::kInt64)});
  EXPECT_TRUE(w.wait(1s));
  EXPECT_TRUE(w.is_success());
  EXPECT_EQ(w.source_rank(), 2);
  EXPECT_EQ(w.result().size(), 1u);
  EXPECT_EQ(w.get_future()->value().tensors.size(), 1u);
  EXPECT_EQ(op_type_name(w.op_type()), "RECV");

  auto f = std::make_shared<Future>();
  auto from = Work::from_future(f);
  EXPECT_FALSE(from->is_completed());
  EXPECT_TRUE(from->is_success());  // pending without an error, as torch answers
  EXPECT_THROW(from->wait(20ms), DistTimeoutError);
  f->mark_completed({});
  EXPECT_TRUE(from->is_success());
}

// A work that finishes only inside wait(), as sends and receives do.
class FinishesInWait : public Work {
 public:
  FinishesInWait() : Work(OpType::kSend, "send to rank 1") {}
  bool wait(Millis timeout) override {
    if (!is_completed()) finish({});
    return Work::wait(timeout);
  }
  bool progresses_in_wait() const override { return true; }
};

TEST(Work, FutureOfAWorkThatProgressesInWaitNeedsTheWaitFirst) {
  auto work = std::make_shared<FinishesInWait>();
  try {
    Work::future_of(work);  // waiting on it would hang: nothing else completes it
    ADD_FAILURE() << "future_of an unfinished send passed";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("send to rank 1"), std::string::npos) << e.what();
  }
  work->wait(Millis(1000));
  EXPECT_TRUE(Work::future_of(work)->completed());
  auto collective = std::make_shared<Work>(OpType::kAllreduce);
  EXPECT_EQ(Work::future_of(collective), collective->get_future());  // its backend completes it
}

}  // namespace
}  // namespace c10d::core
