#include "c10d/pg/flight_recorder.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "c10d/backends/fake/fake_backend.h"
#include "c10d/core/exception.h"
#include "c10d/pg/process_group.h"
#include "c10d/store/hash_store.h"

namespace c10d::pg {
namespace {

using backends::fake::FakeBackend;
using core::DType;
using core::OpType;
using core::Tensor;
using nlohmann::json;
namespace fs = std::filesystem;

// A fresh directory for dumps, set as C10D_TRACE_DUMP_DIR for the test's duration.
class DumpDir {
 public:
  DumpDir() {
    path_ = fs::temp_directory_path() /
            ("c10d_fr_test_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
    setenv("C10D_TRACE_DUMP_DIR", path_.c_str(), 1);
  }
  ~DumpDir() {
    unsetenv("C10D_TRACE_DUMP_DIR");
    fs::remove_all(path_);
  }
  const fs::path& path() const { return path_; }
  json read(int rank) const {
    std::ifstream in(path_ / ("c10d_trace_rank" + std::to_string(rank) + ".json"));
    EXPECT_TRUE(in.good()) << "no dump for rank " << rank << " in " << path_;
    return json::parse(in);
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TraceOp allreduce_op(const std::vector<Tensor>& tensors) {
  return TraceOp{.op = OpType::kAllreduce, .inputs = tensors, .outputs = tensors};
}

TEST(FlightRecorder, DisabledAtSizeZeroRecordsNothing) {
  FlightRecorder recorder(0);
  EXPECT_FALSE(recorder.enabled());
  EXPECT_EQ(recorder.register_group(nullptr, 0, 2, "fake", Millis(1000)), nullptr);
  std::vector<Tensor> ts{Tensor::empty({4}, DType::kFloat32)};
  TraceHandle h = recorder.record(nullptr, allreduce_op(ts));
  EXPECT_FALSE(h);
  recorder.record_started(h);
  recorder.record_finished(h, nullptr);
  json dump = json::parse(recorder.dump_trace_json());
  EXPECT_EQ(dump["buffer_size"], 0);
  EXPECT_TRUE(dump["entries"].empty());
}

// A slot reused by an in-place operation keeps the output shapes of whatever used it before
// (they are not copied): the dump must still give the in-place operation its own shapes.
TEST(FlightRecorder, InPlaceEntryInAReusedSlotReportsItsOwnShapes) {
  FlightRecorder recorder(1);
  auto group = recorder.register_group(nullptr, 0, 2, "fake", Millis(1000));
  std::vector<Tensor> in{Tensor::empty({2, 3}, DType::kFloat16)};
  std::vector<std::vector<Tensor>> out{
      {Tensor::empty({2, 3}, DType::kFloat16), Tensor::empty({2, 3}, DType::kFloat16)}};
  recorder.record(group, TraceOp{.op = OpType::kAllgather, .inputs = in, .outputs = out});
  std::vector<Tensor> ts{Tensor::empty({5}, DType::kInt64)};
  recorder.record(group, allreduce_op(ts));  // the same slot
  const json e = json::parse(recorder.dump_trace_json())["entries"][0];
  EXPECT_EQ(e["op"], "allreduce");
  EXPECT_EQ(e["input_sizes"], json::parse("[[5]]"));
  EXPECT_EQ(e["output_sizes"], json::parse("[[5]]"));
  EXPECT_EQ(e["output_dtypes"], json({"int64"}));
}

TEST(FlightRecorder, RingKeepsTheNewestEntriesInOrder) {
  FlightRecorder recorder(3);
  auto group = recorder.register_group(nullptr, 0, 2, "fake", Millis(1000));
  recorder.set_group_name(*group, "g");
  std::vector<Tensor> ts{Tensor::empty({2}, DType::kInt32)};
  std::vector<TraceHandle> handles;
  for (int i = 0; i < 5; ++i) {
    handles.push_back(recorder.record(group, allreduce_op(ts)));
    recorder.record_started(handles.back());
    recorder.record_finished(handles.back(), nullptr);
  }
  json dump = json::parse(recorder.dump_trace_json());
  EXPECT_EQ(dump["entries_recorded"], 5);
  ASSERT_EQ(dump["entries"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(dump["entries"][i]["id"], 3 + i);
    EXPECT_EQ(dump["entries"][i]["seq"], 3 + i);
  }
  // Finishing an overwritten record still moves the group's counters and is otherwise ignored.
  auto late = recorder.record(group, allreduce_op(ts));  // id 6: overwrites id 3
  recorder.record(group, allreduce_op(ts));
  recorder.record(group, allreduce_op(ts));
  recorder.record(group, allreduce_op(ts));  // overwrites id 6
  recorder.record_finished(late, nullptr);
  dump = json::parse(recorder.dump_trace_json());
  EXPECT_EQ(dump["groups"][0]["last_completed_seq"], 6);
  EXPECT_EQ(dump["groups"][0]["last_enqueued_seq"], 9);
  EXPECT_EQ(dump["groups"][0]["in_flight"], 3);
}

TEST(FlightRecorder, StatesTimestampsAndErrors) {
  FlightRecorder recorder(10);
  auto group = recorder.register_group(nullptr, 1, 2, "fake", Millis(5000));
  std::vector<Tensor> ts{Tensor::empty({2}, DType::kFloat64)};
  auto ok = recorder.record(group, allreduce_op(ts));
  json e = json::parse(recorder.dump_trace_json())["entries"][0];
  EXPECT_EQ(e["state"], "scheduled");
  EXPECT_TRUE(e["time_started_ns"].is_null());
  recorder.record_started(ok);
  e = json::parse(recorder.dump_trace_json())["entries"][0];
  EXPECT_EQ(e["state"], "started");
  EXPECT_TRUE(e["time_completed_ns"].is_null());
  EXPECT_TRUE(e["duration_ns"].is_null());
  recorder.record_finished(ok, nullptr);
  e = json::parse(recorder.dump_trace_json())["entries"][0];
  EXPECT_EQ(e["state"], "completed");
  EXPECT_GE(e["time_completed_ns"].get<int64_t>(), e["time_started_ns"].get<int64_t>());
  EXPECT_GE(e["time_started_ns"].get<int64_t>(), e["time_enqueued_ns"].get<int64_t>());
  EXPECT_EQ(e["duration_ns"].get<int64_t>(),
            e["time_completed_ns"].get<int64_t>() - e["time_started_ns"].get<int64_t>());
  EXPECT_EQ(e["timeout_ms"], 5000);  // the group's, as the op set none
  EXPECT_TRUE(e["error"].is_null());

  // A caller's mistake is recorded but is no reason for a dump.
  auto bad = recorder.record(group, allreduce_op(ts));
  recorder.record_started(bad);
  recorder.record_finished(bad, std::make_exception_ptr(core::InvalidArgument("wrong dtype")));
  e = json::parse(recorder.dump_trace_json())["entries"][1];
  EXPECT_EQ(e["state"], "failed");
  EXPECT_EQ(e["error"], "wrong dtype");
  EXPECT_FALSE(recorder.auto_dumped());

  // Only-active and without-completed filters.
  auto running = recorder.record(group, allreduce_op(ts));
  recorder.record_started(running);
  json active = json::parse(recorder.dump_trace_json(true, /*only_active=*/true));
  ASSERT_EQ(active["entries"].size(), 1u);
  EXPECT_EQ(active["entries"][0]["seq"], 3);
  json no_completed = json::parse(recorder.dump_trace_json(/*include_completed=*/false));
  EXPECT_EQ(no_completed["entries"].size(), 2u);  // the failed one and the running one
}

// The recorder stamps operations with a cheap clock (TraceClock: the CPU's counter where it
// is invariant); its dumps must still show wall-clock times and real durations.
TEST(FlightRecorder, TimestampsAreWallClockNanoseconds) {
  auto wall_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  FlightRecorder recorder(10);
  auto group = recorder.register_group(nullptr, 0, 1, "fake", Millis(5000));
  std::vector<Tensor> ts{Tensor::empty({2}, DType::kFloat64)};
  const int64_t before = wall_ns();
  auto handle = recorder.record(group, allreduce_op(ts), /*started=*/true);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  recorder.record_finished(handle, nullptr);
  const int64_t after = wall_ns();
  const json e = json::parse(recorder.dump_trace_json())["entries"][0];
  // A millisecond of slack for the conversion's rounding.
  constexpr int64_t kSlack = 1'000'000;
  EXPECT_GE(e["time_started_ns"].get<int64_t>(), before - kSlack);
  EXPECT_LE(e["time_completed_ns"].get<int64_t>(), after + kSlack);
  EXPECT_GE(e["duration_ns"].get<int64_t>(), 30'000'000 - kSlack);
  EXPECT_LE(e["duration_ns"].get<int64_t>(), after - before + kSlack);
}

TEST(FlightRecorder, JsonIsSelfDescribing) {
  FlightRecorder recorder(10);
  auto group = recorder.register_group(nullptr, 1, 2, "gloo", Millis(3000));
  recorder.set_group_name(*group, "7");
  recorder.set_group_desc(*group, "pairs");
  recorder.set_global_ranks(*group, {4, 6});
  std::vector<Tensor> in{Tensor::empty({2, 3}, DType::kFloat16)};
  std::vector<std::vector<Tensor>> out{
      {Tensor::empty({2, 3}, DType::kFloat16), Tensor::empty({2, 3}, DType::kFloat16)}};
  auto h = recorder.record(
      group,
      TraceOp{.op = OpType::kAllgather, .inputs = in, .outputs = out, .timeout = Millis(250)});
  recorder.record_started(h);
  std::vector<Tensor> msg{Tensor::empty({5}, DType::kUInt8)};
  recorder.record(group, TraceOp{.op = OpType::kSend, .inputs = msg, .peer = 0});

  json dump = json::parse(recorder.dump_trace_json());
  EXPECT_EQ(dump["version"], FlightRecorder::kFormatVersion);
  EXPECT_EQ(dump["pid"], getpid());
  EXPECT_EQ(dump["rank"], 6);  // group rank 1 of ranks [4, 6]
  EXPECT_FALSE(dump["hostname"].get<std::string>().empty());
  EXPECT_GT(dump["timestamp_ns"].get<int64_t>(), 0);
  ASSERT_EQ(dump["groups"].size(), 1u);
  const json& g = dump["groups"][0];
  EXPECT_EQ(g["name"], "7");
  EXPECT_EQ(g["desc"], "pairs");
  EXPECT_EQ(g["backend"], "gloo");
  EXPECT_EQ(g["ranks"], json({4, 6}));
  EXPECT_EQ(g["rank"], 1);
  EXPECT_EQ(g["size"], 2);
  EXPECT_EQ(g["last_enqueued_seq"], 1);
  EXPECT_EQ(g["last_started_seq"], 1);
  EXPECT_EQ(g["last_completed_seq"], 0);
  EXPECT_EQ(g["last_enqueued_p2p_seq"], 1);
  EXPECT_EQ(g["last_started_p2p_seq"], 0);

  ASSERT_EQ(dump["entries"].size(), 2u);
  const json& gather = dump["entries"][0];
  EXPECT_EQ(gather["op"], "allgather");
  EXPECT_EQ(gather["group"], "7");
  EXPECT_EQ(gather["p2p"], false);
  EXPECT_EQ(gather["input_sizes"], json::parse("[[2, 3]]"));
  EXPECT_EQ(gather["input_dtypes"], json({"float16"}));
  EXPECT_EQ(gather["output_sizes"], json::parse("[[2, 3], [2, 3]]"));
  EXPECT_EQ(gather["output_dtypes"], json({"float16", "float16"}));
  EXPECT_EQ(gather["timeout_ms"], 250);
  const json& send = dump["entries"][1];
  EXPECT_EQ(send["op"], "send");
  EXPECT_EQ(send["p2p"], true);
  EXPECT_EQ(send["seq"], 1);  // point-to-point operations have their own numbering
  EXPECT_EQ(send["peer"], 0);
  EXPECT_EQ(send["peer_global"], 4);
  EXPECT_EQ(send["output_sizes"], json::array());
}

TEST(FlightRecorder, DumpToFileNamesTheRank) {
  DumpDir dir;
  FlightRecorder recorder(4);
  auto group = recorder.register_group(nullptr, 3, 4, "fake", Millis(1000));
  const std::string path = recorder.dump_to_file("test");
  EXPECT_EQ(fs::path(path), dir.path() / "c10d_trace_rank3.json");
  json dump = dir.read(3);
  EXPECT_EQ(dump["reason"], "test");
  EXPECT_EQ(dump["rank"], 3);
}

TEST(FlightRecorder, BackendFailureDumpsOnceAndAsksTheOthers) {
  DumpDir dir;
  auto store = std::make_shared<store::HashStore>();
  // Two "ranks" in one process: two recorders sharing a store.
  FlightRecorder rank0(8), rank1(8);
  auto g0 = rank0.register_group(store, 0, 2, "fake", Millis(1000));
  auto g1 = rank1.register_group(store, 1, 2, "fake", Millis(1000));
  rank0.set_group_name(*g0, "0");
  rank1.set_group_name(*g1, "0");
  std::vector<Tensor> ts{Tensor::empty({4}, DType::kFloat32)};

  // Rank 1 waits in a recv; with nothing requested, polling does nothing.
  auto stuck = rank1.record(g1, TraceOp{.op = OpType::kRecv, .outputs = ts, .peer = 0});
  rank1.record_started(stuck);
  rank1.poll_dump_requests();
  EXPECT_FALSE(rank1.auto_dumped());

  // Rank 0's allreduce times out: it dumps and publishes the request.
  auto failed = rank0.record(g0, allreduce_op(ts));
  rank0.record_started(failed);
  rank0.record_finished(failed,
                        std::make_exception_ptr(core::DistTimeoutError("allreduce timed out")));
  EXPECT_TRUE(rank0.auto_dumped());
  EXPECT_EQ(store->add(FlightRecorder::kDumpRequestKey, 0), 1);
  json d0 = dir.read(0);
  EXPECT_NE(d0["reason"].get<std::string>().find("allreduce timed out"), std::string::npos);
  EXPECT_EQ(d0["entries"][0]["state"], "failed");

  // Rank 1's watcher sees it and dumps, naming the request.
  rank1.poll_dump_requests();
  EXPECT_TRUE(rank1.auto_dumped());
  json d1 = dir.read(1);
  EXPECT_NE(d1["reason"].get<std::string>().find("requested"), std::string::npos);
  EXPECT_EQ(d1["entries"][0]["op"], "recv");
  EXPECT_EQ(d1["entries"][0]["state"], "started");

  // A second failure does not dump again.
  fs::remove(dir.path() / "c10d_trace_rank0.json");
  auto again = rank0.record(g0, allreduce_op(ts));
  rank0.record_finished(again, std::make_exception_ptr(core::DistBackendError("peer gone")));
  EXPECT_FALSE(fs::exists(dir.path() / "c10d_trace_rank0.json"));
}

TEST(FlightRecorder, ClosingGroupFailuresDoNotDump) {
  DumpDir dir;
  FlightRecorder recorder(8);
  auto group = recorder.register_group(nullptr, 0, 2, "fake", Millis(1000));
  std::vector<Tensor> ts{Tensor::empty({4}, DType::kFloat32)};
  auto h = recorder.record(group, allreduce_op(ts));
  recorder.close_group(*group);
  recorder.record_finished(h, std::make_exception_ptr(core::DistBackendError("shut down")));
  EXPECT_FALSE(recorder.auto_dumped());
}

TEST(FlightRecorder, ConcurrentRecordingKeepsCountsExact) {
  FlightRecorder recorder(16);
  auto group = recorder.register_group(nullptr, 0, 2, "fake", Millis(1000));
  std::vector<Tensor> ts{Tensor::empty({1}, DType::kFloat32)};
  constexpr int kThreads = 4, kOps = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kOps; ++i) {
        auto h = recorder.record(group, allreduce_op(ts), /*started=*/true);
        recorder.record_finished(h, nullptr);
        if (i % 100 == 0) (void)recorder.dump_trace_json();
      }
    });
  }
  for (auto& t : threads) t.join();
  json dump = json::parse(recorder.dump_trace_json());
  EXPECT_EQ(dump["entries_recorded"], kThreads * kOps);
  EXPECT_EQ(dump["entries"].size(), 16u);
  EXPECT_EQ(dump["groups"][0]["in_flight"], 0);
  EXPECT_EQ(dump["groups"][0]["last_completed_seq"], kThreads * kOps);
  for (const auto& e : dump["entries"]) EXPECT_EQ(e["state"], "completed");
}

TEST(FlightRecorder, SigusrOneDumpsFromTheWatcher) {
  DumpDir dir;
  // The first group of the process recorder starts the watcher and installs the handler.
  auto group = std::make_shared<ProcessGroup>(nullptr, 0, 1);
  ASSERT_EQ(raise(SIGUSR1), 0);
  const fs::path path = dir.path() / "c10d_trace_rank0.json";
  for (int i = 0; i < 200 && !fs::exists(path); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(dir.read(0)["reason"], "signal SIGUSR1");
}

TEST(FlightRecorder, ProcessGroupRecordsItsOperations) {
  auto& recorder = FlightRecorder::instance();
  ASSERT_TRUE(recorder.enabled());  // C10D_TRACE_BUFFER_SIZE is unset: 2000
  EXPECT_EQ(recorder.capacity(), 2000u);
  auto group = std::make_shared<ProcessGroup>(std::make_shared<store::HashStore>(), 0, 2);
  group->register_backend(core::DeviceType::kCPU, std::make_shared<FakeBackend>(0, 2));
  group->set_group_name("pg_test_group");
  group->set_global_ranks({0, 1});
  std::vector<Tensor> ts{Tensor::empty({3}, DType::kInt64)};
  group->allreduce(ts)->wait();
  group->send(ts, 1)->wait();
  group->barrier()->wait();

  json dump = json::parse(recorder.dump_trace_json());
  std::vector<json> mine;
  for (const auto& e : dump["entries"]) {
    if (e["group"] == "pg_test_group") mine.push_back(e);
  }
  ASSERT_EQ(mine.size(), 3u);
  EXPECT_EQ(mine[0]["op"], "allreduce");
  EXPECT_EQ(mine[0]["seq"], 1);
  EXPECT_EQ(mine[0]["pg_seq"], 1);
  EXPECT_EQ(mine[0]["state"], "completed");
  EXPECT_EQ(mine[0]["input_sizes"], json::parse("[[3]]"));
  EXPECT_EQ(mine[1]["op"], "send");
  EXPECT_EQ(mine[1]["seq"], 1);
  EXPECT_EQ(mine[1]["peer"], 1);
  EXPECT_EQ(mine[2]["op"], "barrier");
  EXPECT_EQ(mine[2]["seq"], 2);
  EXPECT_EQ(mine[2]["pg_seq"], 3);
  EXPECT_EQ(group->global_ranks(), std::vector<int>({0, 1}));
}

}  // namespace
}  // namespace c10d::pg
