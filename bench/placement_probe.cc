// Prints the median round trip, in ns, of a cache line bounced between two threads pinned to
// the first two CPUs this process may run on, or nothing (exit 1) with fewer than two, or when
// a trip has not come back within kGiveUpNs (the other thread did not get its CPU).
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

constexpr int64_t kGiveUpNs = 1'000'000'000;

// Spins until `line` holds `want`; false (with a message naming the wait) after kGiveUpNs.
bool await_value(const Line& line, int64_t want, const char* who) {
  const int64_t start = now_ns();
  for (uint32_t spin = 1; line.value.load(std::memory_order_acquire) != want; ++spin) {
    if ((spin & 1023) == 0 && now_ns() - start > kGiveUpNs) {
      std::fprintf(stderr, "placement_probe: %s waited over 1 s for trip %lld\n", who,
                   static_cast<long long>(want));
      return false;
    }
  }
  return true;
}

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
      if (!await_value(ping, i, "the echo thread")) return;
      pong.value.store(i, std::memory_order_release);
    }
  });
  bool ok = pin(cpus[0]);
  std::vector<int64_t> batches;
  for (int b = 0; ok && b < kBatches; ++b) {
    int64_t start = 0;
    for (int t = 0; ok && t < kTrips; ++t) {
      const int64_t i = int64_t{b} * kTrips + t + 1;
      if (t == 1) start = now_ns();  // the first trip of a batch waits for the echo to arrive
      ping.value.store(i, std::memory_order_release);
      ok = await_value(pong, i, "the pinging thread");
    }
    if (ok) batches.push_back((now_ns() - start) / (kTrips - 1));
  }
  echo.join();  // after kGiveUpNs at most: the echo gives up on a trip that never comes
  if (!ok) return 1;
  std::nth_element(batches.begin(), batches.begin() + kBatches / 2, batches.end());
  std::printf("%lld\n", static_cast<long long>(batches[kBatches / 2]));
  return 0;
}
