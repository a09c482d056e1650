#include "c10d/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "c10d/core/exception.h"

namespace c10d::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Each test gets its own directory, so no test depends on another's leftovers.
class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "c10d_file_store_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (fs::path(dir_) / "store").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  bool file_exists() const { return fs::exists(path_); }

  std::string dir_;
  std::string path_;
};

Bytes b(std::string_view s) { return to_bytes(s); }

TEST_F(FileStoreTest, BasicSemantics) {
  FileStore store(path_);
  EXPECT_EQ(store.path(), path_);
  EXPECT_EQ(store.describe(), "FileStore(" + path_ + ")");
  EXPECT_TRUE(store.has_extended_api());
  EXPECT_EQ(store.num_keys(), 1);  // as torch counts: the open handles' "refcount/"

  store.set("a", b("1"));
  EXPECT_EQ(store.get("a"), b("1"));
  store.set("a", b("two"));
  EXPECT_EQ(store.get("a"), b("two"));
  store.set("empty", {});
  EXPECT_EQ(store.get("empty"), Bytes{});
  EXPECT_TRUE(store.check({"a", "empty"}));
  EXPECT_FALSE(store.check({"a", "missing"}));

  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -7), -2);
  EXPECT_EQ(store.get("n"), b("-2"));
  EXPECT_THROW(store.add("a", 1), core::InvalidArgument);

  store.append("log", b("x"));
  store.append("log", b("yz"));
  EXPECT_EQ(store.get("log"), b("xyz"));

  store.multi_set({"m1", "m2"}, {b("v1"), b("v2")});
  EXPECT_EQ(store.multi_get({"m2", "m1"}), (std::vector<Bytes>{b("v2"), b("v1")}));
  EXPECT_THROW(store.multi_set({"m1"}, {}), core::InvalidArgument);

  EXPECT_EQ(store.num_keys(), 7);
  EXPECT_EQ(store.list_keys(), (std::vector<std::string>{"a", "empty", "log", "m1", "m2", "n"}));
}

TEST_F(FileStoreTest, HeldFileLockTimesOutNamingTheLock) {
  FileStore store(path_, -1, 10s);
  store.set("k", b("v"));
  // Another holder of the file lock (as a stuck process would be).
  int fd = ::open(path_.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  store.set_timeout(200ms);
  auto start = std::chrono::steady_clock::now();
  try {
    store.set("k", b("w"));
    FAIL() << "set with the file lock held elsewhere did not time out";
  } catch (const core::DistStoreTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("file lock"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  ::flock(fd, LOCK_UN);
  ::close(fd);
  store.set_timeout(10s);
  store.set("k", b("w"));
  EXPECT_EQ(store.get("k"), b("w"));
}

TEST_F(FileStoreTest, CompareSet) {
  FileStore store(path_);
  // Missing key, non-empty expected: stays missing, returns expected.
  EXPECT_EQ(store.compare_set("k", b("x"), b("y")), b("x"));
  EXPECT_FALSE(store.check({"k"}));
  // Missing key, empty expected: created.
  EXPECT_EQ(store.compare_set("k", {}, b("first")), b("first"));
  EXPECT_EQ(store.get("k"), b("first"));
  // Existing key, wrong expected: unchanged, current value returned.
  EXPECT_EQ(store.compare_set("k", b("nope"), b("second")), b("first"));
  EXPECT_EQ(store.get("k"), b("first"));
  // Existing key, matching expected: replaced.
  EXPECT_EQ(store.compare_set("k", b("first"), b("second")), b("second"));
  EXPECT_EQ(store.get("k"), b("second"));
}

TEST_F(FileStoreTest, TwoInstancesSeeEachOther) {
  FileStore a(path_);
  FileStore b1(path_);
  a.set("from_a", b("1"));
  EXPECT_EQ(b1.get("from_a"), b("1"));
  EXPECT_EQ(b1.add("counter", 2), 2);
  EXPECT_EQ(a.add("counter", 3), 5);

  // A waiter on one handle wakes when the other handle sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(30ms);
    a.set("late", b("here"));
  });
  b1.wait({"late"}, 10s);
  EXPECT_EQ(b1.get("late"), b("here"));
  setter.join();

  // A handle opened later replays everything written before it.
  FileStore c(path_);
  EXPECT_EQ(c.get("counter"), b("5"));
  EXPECT_EQ(c.num_keys(), 4);
}

// Waiter and writer on the same handle: the write lands in the shared cache and moves the
// synced size along, so the waiter must look at the cache, not only at the file size.
TEST_F(FileStoreTest, WaiterWokenByWriteOnSameHandle) {
  FileStore s(path_, -1, 10s);
  for (int round = 0; round < 3; ++round) {
    const std::string key = "k" + std::to_string(round);
    std::thread waiter([&] {
      if (round == 0) s.wait({key});
      if (round == 1) EXPECT_EQ(s.get(key), b("v"));
      if (round == 2) EXPECT_EQ(s.queue_pop(key, true), b("v"));
    });
    std::this_thread::sleep_for(20ms);
    if (round == 2) {
      s.queue_push(key, b("v"));
    } else {
      s.set(key, b("v"));
    }
    waiter.join();
  }
}

TEST_F(FileStoreTest, DeleteWritesTombstone) {
  FileStore a(path_);
  FileStore other(path_);
  a.set("k", b("v"));
  a.set("keep", b("v"));
  EXPECT_TRUE(other.check({"k"}));
  EXPECT_TRUE(a.delete_key("k"));
  EXPECT_FALSE(a.delete_key("k"));
  EXPECT_FALSE(a.check({"k"}));
  EXPECT_FALSE(other.check({"k"}));
  EXPECT_EQ(other.num_keys(), 2);
  EXPECT_THROW(other.wait({"k"}, 20ms), core::DistStoreTimeoutError);

  FileStore late(path_);
  EXPECT_FALSE(late.check({"k"}));
  EXPECT_EQ(late.list_keys(), std::vector<std::string>{"keep"});
  late.set("k", b("again"));
  EXPECT_EQ(a.get("k"), b("again"));
}

TEST_F(FileStoreTest, WaitTimeoutNamesKeys) {
  FileStore store(path_, -1, 50ms);
  store.set("present", b("1"));
  try {
    store.wait({"present", "absent_one", "absent_two"}, 40ms);
    FAIL() << "wait did not time out";
  } catch (const core::DistStoreTimeoutError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("absent_one"), std::string::npos) << msg;
    EXPECT_NE(msg.find("absent_two"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path_), std::string::npos) << msg;
    EXPECT_NE(msg.find("40ms"), std::string::npos) << msg;
  }
  try {
    store.get("nothing_here");
    FAIL() << "get did not time out";
  } catch (const core::DistStoreTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("nothing_here"), std::string::npos) << e.what();
  }
  EXPECT_THROW(store.multi_get({"present", "nothing_here"}), core::DistStoreTimeoutError);
}

TEST_F(FileStoreTest, QueueOps) {
  FileStore a(path_, -1, 2s);
  FileStore other(path_, -1, 2s);
  EXPECT_EQ(a.queue_len("q"), 0);
  a.queue_push("q", b("1"));
  a.queue_push("q", b("2"));
  other.queue_push("q", b("3"));
  EXPECT_EQ(a.queue_len("q"), 3);
  EXPECT_TRUE(a.check({"q"}));  // a non-empty queue is present, as in the other stores
  EXPECT_EQ(a.num_keys(), 1);   // queues are not keys
  EXPECT_EQ(other.queue_pop("q", false), b("1"));
  EXPECT_EQ(a.queue_pop("q", true), b("2"));
  EXPECT_EQ(other.queue_pop("q", false), b("3"));
  EXPECT_EQ(a.queue_len("q"), 0);
  EXPECT_THROW(a.queue_pop("q", false), core::DistQueueEmptyError);

  // A blocking pop waits for a push from another handle.
  std::thread pusher([&] {
    std::this_thread::sleep_for(30ms);
    other.queue_push("q", b("late"));
  });
  EXPECT_EQ(a.queue_pop("q", true), b("late"));
  pusher.join();

  a.set_timeout(30ms);
  try {
    a.queue_pop("q", true);
    FAIL() << "queue_pop did not time out";
  } catch (const core::DistStoreTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("wait timeout after 30ms, keys: q"), std::string::npos)
        << e.what();
  }
}

TEST_F(FileStoreTest, LastUserRemovesFile) {
  {
    // Without a fixed number of workers the file stays (torch's FileStore keeps it too), so
    // processes that use it one after another see what the earlier ones wrote.
    auto a = std::make_unique<FileStore>(path_);
    auto b1 = std::make_unique<FileStore>(path_);
    a->set("kept", b("yes"));
    a.reset();
    b1.reset();
    EXPECT_TRUE(file_exists());
    FileStore later(path_);
    EXPECT_EQ(later.get("kept"), b("yes"));
  }
  fs::remove(path_);
  {
    // A clone is one more user: the file outlives the original while the clone is alive.
    auto a = std::make_unique<FileStore>(path_, 1);
    std::shared_ptr<Store> c = a->clone();
    a->set("k", b("v"));
    EXPECT_EQ(c->get("k"), b("v"));
    EXPECT_EQ(c->describe(), a->describe());
    a.reset();
    EXPECT_TRUE(file_exists());
    EXPECT_EQ(c->get("k"), b("v"));
    c.reset();
    EXPECT_FALSE(file_exists());
  }
  {
    // With num_workers, the file stays until that many workers have left, so a fast worker
    // does not erase what it wrote before the others arrive.
    auto w0 = std::make_unique<FileStore>(path_, 2);
    w0->set("k", b("from w0"));
    w0.reset();
    EXPECT_TRUE(file_exists());
    auto w1 = std::make_unique<FileStore>(path_, 2);
    EXPECT_EQ(w1->get("k"), b("from w0"));
    w1.reset();
    EXPECT_FALSE(file_exists());
  }
  // After removal the path starts over as an empty store.
  FileStore fresh(path_);
  EXPECT_EQ(fresh.num_keys(), 1);
}

TEST_F(FileStoreTest, ExtraWorkersAndClonesShareTheStore) {
  // As torch's FileStore: num_workers decides when the file goes, not who may open it.
  auto w0 = std::make_unique<FileStore>(path_, 2);
  auto w1 = std::make_unique<FileStore>(path_, 2);
  auto w2 = std::make_unique<FileStore>(path_, 2);
  w2->set("k", b("v"));
  auto c = w0->clone();
  EXPECT_EQ(c->get("k"), b("v"));
  c.reset();
  w0.reset();
  w1.reset();
  EXPECT_TRUE(file_exists());  // w2 still holds it
  w2.reset();
  EXPECT_FALSE(file_exists());
}

TEST_F(FileStoreTest, OpenErrorsNamePathAndErrno) {
  const std::string bad = dir_ + "/no/such/dir/store";
  try {
    FileStore store(bad);
    FAIL() << "opened a file in a missing directory";
  } catch (const core::DistStoreError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  { std::ofstream(path_) << "this is somebody's notes file"; }
  try {
    FileStore store(path_);
    FAIL() << "accepted a file that is not a FileStore";
  } catch (const core::DistStoreError& e) {
    EXPECT_NE(std::string(e.what()).find("not a FileStore file"), std::string::npos) << e.what();
  }
  // The foreign file is left untouched.
  std::ifstream in(path_);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "this is somebody's notes file");
}

TEST_F(FileStoreTest, AFileInTheEarlierFormatIsRefusedSayingSo) {
  { std::ofstream(path_, std::ios::binary) << std::string("c10dFS1\n\6\0\0\0\0\1", 14); }
  try {
    FileStore store(path_);
    FAIL() << "opened a file of the earlier format";
  } catch (const core::DistStoreError& e) {
    EXPECT_NE(std::string(e.what()).find("an earlier c10d wrote it"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fs::file_size(path_), 14u);  // left as it was
}

TEST_F(FileStoreTest, TornRecordIsCutOff) {
  FileStore a(path_);
  a.set("before", b("1"));
  {
    // Simulate a writer that died after writing part of a record header.
    int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    const unsigned char partial[3] = {1, 9, 0};
    ASSERT_EQ(::write(fd, partial, sizeof(partial)), 3);
    ::close(fd);
  }
  FileStore b1(path_);
  EXPECT_EQ(b1.get("before"), b("1"));
  b1.set("after", b("2"));
  EXPECT_EQ(a.get("after"), b("2"));
  FileStore c(path_);
  EXPECT_EQ(c.list_keys(), (std::vector<std::string>{"after", "before"}));
}

TEST_F(FileStoreTest, ThreadsShareOneHandle) {
  FileStore a(path_);
  FileStore other(path_);
  constexpr int kThreads = 4;
  constexpr int kAdds = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Store& s = (t % 2 == 0) ? static_cast<Store&>(a) : static_cast<Store&>(other);
      for (int i = 0; i < kAdds; ++i) s.add("count", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(a.add("count", 0), kThreads * kAdds);
}

TEST_F(FileStoreTest, ForkedProcessesAddConcurrently) {
  constexpr int kChildren = 8;
  constexpr int kAdds = 1000;
  // The parent is the ninth worker; it keeps the file alive until everyone is done.
  auto parent = std::make_unique<FileStore>(path_, kChildren + 1);
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        // The inherited handle must not be used here; the child opens its own.
        try {
          parent->check({"x"});
          code = 3;
        } catch (const core::DistStoreError&) {
        }
        FileStore mine(path_, kChildren + 1);
        mine.add("ready", 1);
        mine.wait({"go"}, 60s);
        for (int i = 0; i < kAdds; ++i) mine.add("count", 1);
        mine.queue_push("done", to_bytes(std::to_string(c)));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", c, e.what());
        code = 2;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  // Start all children at once so the adds really interleave.
  while (parent->add("ready", 0) < kChildren) std::this_thread::sleep_for(1ms);
  parent->set("go", b("1"));
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  EXPECT_EQ(parent->add("count", 0), kChildren * kAdds);
  EXPECT_EQ(parent->queue_len("done"), kChildren);
  // All nine workers have joined and left; one more may still open the store, as with torch's
  // FileStore, and sees its keys. The file goes when the last handle does.
  {
    FileStore extra(path_, kChildren + 1);
    EXPECT_EQ(extra.add("count", 0), kChildren * kAdds);
  }
  EXPECT_TRUE(file_exists());
  parent.reset();
  EXPECT_FALSE(file_exists());
}

}  // namespace
}  // namespace c10d::store
