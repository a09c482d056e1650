// Prints the median round trip, in ns, of a cache line bounced between two threads pinned to
// the first two CPUs this process may run on, or nothing (exit 1) with fewer than two.
//
// collective_bench.py runs it around every launch: on this project's KVM guests the host
// moves the two vCPUs between a placement where a round trip takes ~100 ns and one where it
// takes ~500 ns and stores into lines the other CPU reads cost several times more, for
// minutes at a time, so launches compared side by side must run in the same placement.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct alignas(64) Line {
  std::atomic<int64_t> value{0};
};

}  // namespace

int main() {
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.size() < 2) return 1;
  constexpr int kBatches = 21;
  constexpr int kTrips = 16;
  Line ping, pong;
  std::thread echo([&] {
    pin(cpus[1]);
    for (int64_t i = 1; i <= int64_t{kBatches} * kTrips; ++i) {
      while (ping.value.load(std::memory_order_acquire) != i) {
      }
      pong.value.store(i, std::memory_order_release);
    }
  });
  if (!pin(cpus[0])) return 1;
  std::vector<int64_t> batches;
  for (int b = 0; b < kBatches; ++b) {
    int64_t start = 0;
    for (int t = 0; t < kTrips; ++t) {
      const int64_t i = int64_t{b} * kTrips + t + 1;
      if (t == 1) start = now_ns();  // the first trip of a batch waits for the echo to arrive
      ping.value.store(i, std::memory_order_release);
      while (pong.value.load(std::memory_order_acquire) != i) {
      }
    }
    batches.push_back((now_ns() - start) / (kTrips - 1));
  }
  echo.join();
  std::nth_element(batches.begin(), batches.begin() + kBatches / 2, batches.end());
  std::printf("%lld\n", static_cast<long long>(batches[kBatches / 2]));
  return 0;
}
