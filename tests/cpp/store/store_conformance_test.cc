// One behavioural suite run against every Store implementation (typed tests).
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "c10d/core/exception.h"
#include "c10d/store/file_store.h"
#include "c10d/store/hash_store.h"
#include "c10d/store/prefix_store.h"
#include "c10d/store/tcp_store.h"

namespace c10d::store {
namespace {

using namespace std::chrono_literals;

std::string temp_path() {
  static std::atomic<int> counter{0};
  auto dir = std::filesystem::temp_directory_path();
  return (dir /
          ("c10d_conformance_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
      .string();
}

// Each fixture owns whatever keeps its store alive (a server, a file) and hands out the store.
struct HashFactory {
  static constexpr bool kFileBacked = false;
  std::shared_ptr<Store> make() { return std::make_shared<HashStore>(); }
};
struct FileFactory {
  // A leftover of an earlier run under the same name (pids repeat) is not this test's file;
  // as the only worker, the store removes its file when it closes.
  std::shared_ptr<Store> make() {
    const std::string path = temp_path();
    std::filesystem::remove(path);
    return std::make_shared<FileStore>(path, 1);
  }
};
struct TCPFactory {
  std::shared_ptr<Store> make() {
    TCPStoreOptions opts;
    opts.port = 0;
    opts.is_server = true;
    opts.wait_workers = false;
    opts.timeout = 10s;
    return std::make_shared<TCPStore>("127.0.0.1", opts);
  }
};
// A client connected to a separate server instance.
struct TCPClientFactory {
  std::shared_ptr<TCPStore> server;
  std::shared_ptr<Store> make() {
    server = std::static_pointer_cast<TCPStore>(TCPFactory().make());
    TCPStoreOptions opts;
    opts.port = server->port();
    opts.timeout = 10s;
    return std::make_shared<TCPStore>("127.0.0.1", opts);
  }
};
template <typename Inner>
struct PrefixFactory {
  Inner inner;
  std::shared_ptr<Store> make() { return std::make_shared<PrefixStore>("pre", inner.make()); }
};

template <typename Factory>
class StoreConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = factory_.make();
    store_->set_timeout(10s);
  }
  Factory factory_;
  std::shared_ptr<Store> store_;
};

using Factories = ::testing::Types<HashFactory, FileFactory, TCPFactory, TCPClientFactory,
                                   PrefixFactory<HashFactory>, PrefixFactory<FileFactory>,
                                   PrefixFactory<TCPClientFactory>>;
TYPED_TEST_SUITE(StoreConformance, Factories);

Bytes b(std::string_view s) { return to_bytes(s); }

TYPED_TEST(StoreConformance, SetGetOverwrite) {
  auto& s = *this->store_;
  s.set("k", b("v1"));
  EXPECT_EQ(s.get("k"), b("v1"));
  s.set("k", b("v2"));
  EXPECT_EQ(s.get("k"), b("v2"));
  s.set("empty", b(""));
  EXPECT_EQ(s.get("empty"), b(""));
  Bytes binary = {0, 255, 10, 0, 7};
  s.set("bin", binary);
  EXPECT_EQ(s.get("bin"), binary);
}

TYPED_TEST(StoreConformance, AddAccumulates) {
  auto& s = *this->store_;
  EXPECT_EQ(s.add("counter", 1), 1);
  EXPECT_EQ(s.add("counter", 6), 7);
  EXPECT_EQ(s.add("counter", -10), -3);
  EXPECT_EQ(s.add("counter", 0), -3);
  EXPECT_EQ(s.get("counter"), b("-3"));
  s.set("text", b("abc"));
  // TCPStore servers (ours and PyTorch's) drop a client that adds to a non-counter (a
  // DistError); the other stores raise InvalidArgument (ValueError in Python, as torch's).
  try {
    s.add("text", 1);
    ADD_FAILURE() << "add on a value that is not a counter passed";
  } catch (const core::DistError&) {
  } catch (const core::InvalidArgument&) {
  }
}

TYPED_TEST(StoreConformance, CompareSetFourCases) {
  auto& s = *this->store_;
  // Missing key, empty expected: created.
  EXPECT_EQ(s.compare_set("cs", b(""), b("first")), b("first"));
  EXPECT_EQ(s.get("cs"), b("first"));
  // Existing key, expected matches: replaced.
  EXPECT_EQ(s.compare_set("cs", b("first"), b("second")), b("second"));
  EXPECT_EQ(s.get("cs"), b("second"));
  // Existing key, expected differs: unchanged, current value returned.
  EXPECT_EQ(s.compare_set("cs", b("wrong"), b("third")), b("second"));
  EXPECT_EQ(s.get("cs"), b("second"));
  // Missing key, non-empty expected: nothing stored, expected returned.
  EXPECT_EQ(s.compare_set("missing", b("exp"), b("des")), b("exp"));
  EXPECT_FALSE(s.check({"missing"}));
}

TYPED_TEST(StoreConformance, CheckDeleteAndNumKeys) {
  auto& s = *this->store_;
  const int64_t base = s.num_keys();
  s.set("a", b("1"));
  s.set("b", b("2"));
  EXPECT_TRUE(s.check({"a", "b"}));
  EXPECT_FALSE(s.check({"a", "nope"}));
  EXPECT_EQ(s.num_keys(), base + 2);
  EXPECT_TRUE(s.delete_key("a"));
  EXPECT_FALSE(s.delete_key("a"));
  EXPECT_FALSE(s.check({"a"}));
  EXPECT_EQ(s.num_keys(), base + 1);
}

TYPED_TEST(StoreConformance, AppendMultiGetMultiSet) {
  auto& s = *this->store_;
  s.append("ap", b("po"));
  s.append("ap", b("tato"));
  EXPECT_EQ(s.get("ap"), b("potato"));
  s.multi_set({"m1", "m2", "m3"}, {b("x"), b(""), b("zz")});
  EXPECT_EQ(s.multi_get({"m3", "m1", "m2"}), (std::vector<Bytes>{b("zz"), b("x"), b("")}));
  EXPECT_THROW(s.multi_set({"a"}, {}), core::InvalidArgument);
}

TYPED_TEST(StoreConformance, WaitSucceedsForPresentKeys) {
  auto& s = *this->store_;
  s.set("w1", b("1"));
  s.set("w2", b("2"));
  s.wait({"w1", "w2"});
  s.wait({"w1"}, 100ms);
}

TYPED_TEST(StoreConformance, WaitTimesOutNamingKeys) {
  auto& s = *this->store_;
  s.set("present", b("1"));
  auto start = core::Clock::now();
  try {
    s.wait({"present", "absent_key"}, 200ms);
    FAIL() << "wait did not time out";
  } catch (const core::DistStoreTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("absent_key"), std::string::npos) << e.what();
  }
  auto elapsed = core::Clock::now() - start;
  EXPECT_GE(elapsed, 150ms);
  EXPECT_LT(elapsed, 5s);
  // The store stays usable after a timed-out wait.
  s.set("after", b("ok"));
  EXPECT_EQ(s.get("after"), b("ok"));
}

TYPED_TEST(StoreConformance, GetOnMissingKeyTimesOut) {
  auto& s = *this->store_;
  s.set_timeout(200ms);
  EXPECT_THROW(s.get("never_set"), core::DistStoreTimeoutError);
  s.set_timeout(10s);
  s.set("x", b("y"));
  EXPECT_EQ(s.get("x"), b("y"));
}

// A waiter in another thread is woken by each kind of write.
TYPED_TEST(StoreConformance, NegativeTimeoutHasRunOut) {
  auto& s = *this->store_;
  s.set("here", b("1"));
  const auto start = core::Clock::now();
  s.wait({"here"}, -1000ms);  // present keys still pass
  EXPECT_THROW(s.wait({"here", "absent"}, -1000ms), core::DistStoreTimeoutError);
  s.set_timeout(-1000ms);
  EXPECT_EQ(s.get("here"), b("1"));
  EXPECT_THROW(s.get("absent"), core::DistStoreTimeoutError);
  EXPECT_THROW(s.multi_get({"here", "absent"}), core::DistStoreTimeoutError);
  EXPECT_LT(core::Clock::now() - start, 5s);
  s.set_timeout(5s);
  s.set("after", b("ok"));
  EXPECT_EQ(s.get("after"), b("ok"));
}

TYPED_TEST(StoreConformance, WaitWokenByEveryWrite) {
  auto& s = *this->store_;
  const std::vector<std::function<void(const std::string&)>> writers = {
      [&](const std::string& k) { s.set(k, b("v")); },
      [&](const std::string& k) { s.add(k, 3); },
      [&](const std::string& k) { s.append(k, b("tail")); },
      [&](const std::string& k) { s.compare_set(k, b(""), b("cs")); },
      [&](const std::string& k) { s.multi_set({k}, {b("ms")}); },
  };
  for (size_t i = 0; i < writers.size(); ++i) {
    const std::string key = "wake" + std::to_string(i);
    std::atomic<bool> woke{false};
    std::thread waiter([&] {
      s.wait({key}, 10s);
      woke = true;
    });
    // The waiter has no way to signal "I am now blocked"; writing after a short pause covers
    // both orders (wait-then-write and write-then-wait), and the assertion holds in either.
    std::this_thread::sleep_for(20ms);
    writers[i](key);
    waiter.join();
    EXPECT_TRUE(woke) << "writer " << i;
  }
}

TYPED_TEST(StoreConformance, ConcurrentAddsFromThreads) {
  auto& s = *this->store_;
  constexpr int kThreads = 4, kAdds = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) s.add("shared", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(s.add("shared", 0), kThreads * kAdds);
}

TYPED_TEST(StoreConformance, TimeoutAccessors) {
  auto& s = *this->store_;
  s.set_timeout(1234ms);
  EXPECT_EQ(s.timeout(), 1234ms);
  EXPECT_TRUE(s.has_extended_api());
}

TEST(PrefixStore, KeysAreNamespaced) {
  auto inner = std::make_shared<HashStore>();
  PrefixStore a("a", inner), b_store("b", inner);
  a.set("k", b("from a"));
  b_store.set("k", b("from b"));
  EXPECT_EQ(inner->get("a/k"), b("from a"));
  EXPECT_EQ(inner->get("b/k"), b("from b"));
  auto nested = std::make_shared<PrefixStore>("outer", std::make_shared<PrefixStore>("mid", inner));
  nested->set("k", b("deep"));
  EXPECT_EQ(inner->get("mid/outer/k"), b("deep"));
  EXPECT_EQ(nested->underlying_non_prefix_store(), inner);
  EXPECT_THROW(PrefixStore("x", nullptr), core::InvalidArgument);
}

TEST(HashStore, QueueOps) {
  HashStore s;
  s.set_timeout(200ms);
  EXPECT_EQ(s.queue_len("q"), 0);
  s.queue_push("q", b("1"));
  s.queue_push("q", b("2"));
  EXPECT_EQ(s.queue_len("q"), 2);
  EXPECT_TRUE(s.check({"q"}));
  EXPECT_EQ(s.queue_pop("q", true), b("1"));
  EXPECT_EQ(s.queue_pop("q", false), b("2"));
  EXPECT_THROW(s.queue_pop("q", false), core::DistQueueEmptyError);
  EXPECT_THROW(s.queue_pop("q", true), core::DistStoreTimeoutError);
}

TEST(HashStore, NoTimeoutMeansWaitForever) {
  HashStore s;
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    s.set("late", b("1"));
  });
  s.wait({"late"}, core::kNoTimeout);
  writer.join();
  EXPECT_TRUE(s.check({"late"}));
}

}  // namespace
}  // namespace c10d::store
