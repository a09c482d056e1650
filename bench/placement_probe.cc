// Prints the median round trip, in ns, of a cache line bounced between two threads pinned to
// the first two CPUs this process may run on, or nothing (exit 1) with fewer than two, or when
// a trip has not come back within kGiveUpNs (the other thread did not get its CPU).
//
// With `--watch MS` it runs until killed and prints, every MS milliseconds, the median of a
// few timed trips (the clock reads add ~20-40 ns): the placement while a launch runs. The
// threads sleep in between, so the launch loses a few microseconds per period; a batch
// whose echo did not get its CPU in time prints nothing. It exits when its parent does.
//
// collective_bench.py runs it around every launch: on this project's KVM guests the host
// moves the two vCPUs between a placement where a round trip takes ~100 ns and one where it
// takes ~500 ns and stores into lines the other CPU reads cost several times more, for
// minutes at a time, so launches compared side by side must run in the same placement.
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// --watch: both threads wake at the same ticks; the echo returns whatever ping holds until
// the pinger says its batch is over (or kEchoSpinNs passed), the pinger times kWatchTrips
// trips and prints their median. The echo used to spin for all of kEchoSpinNs every period,
// 2% of its CPU taken from the launch being watched.
[[noreturn]] void watch(int cpu0, int cpu1, int64_t period_ns) {
  constexpr int kWatchTrips = 16;
  constexpr int64_t kEchoSpinNs = 2'000'000;
  constexpr int64_t kTripGiveUpNs = 500'000;
  Line ping, pong, done;  // done: the last period whose batch the pinger finished
  const auto first = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
  const auto period = std::chrono::nanoseconds(period_ns);
  std::thread echo([&] {
    pin(cpu1);
    auto tick = first;
    for (int64_t k = 1;; ++k, tick += period) {
      std::this_thread::sleep_until(tick);
      const int64_t until = now_ns() + kEchoSpinNs;
      int64_t last = pong.value.load(std::memory_order_relaxed);
      for (uint32_t spin = 1;; ++spin) {
        const int64_t v = ping.value.load(std::memory_order_acquire);
        if (v != last) pong.value.store(last = v, std::memory_order_release);
        if (done.value.load(std::memory_order_acquire) >= k) break;
        if ((spin & 255) == 0 && now_ns() > until) break;
      }
    }
  });
  echo.detach();
  pin(cpu0);
  int64_t seq = 0;
  std::vector<int64_t> trips;
  auto tick = first + std::chrono::microseconds(50);
  for (int64_t k = 1;; ++k, tick += period) {
    std::this_thread::sleep_until(tick);
    trips.clear();
    for (int t = 0; t < kWatchTrips; ++t) {
      const int64_t start = now_ns();
      ping.value.store(++seq, std::memory_order_release);
      bool back = true;
      for (uint32_t spin = 1; pong.value.load(std::memory_order_acquire) != seq; ++spin) {
        if ((spin & 255) == 0 && now_ns() - start > kTripGiveUpNs) {
          back = false;
          break;
        }
      }
      if (!back) break;
      trips.push_back(now_ns() - start);
    }
    done.value.store(k, std::memory_order_release);
    if (trips.size() < kWatchTrips) continue;
    std::nth_element(trips.begin(), trips.begin() + kWatchTrips / 2, trips.end());
    std::printf("%lld\n", static_cast<long long>(trips[kWatchTrips / 2]));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.size() < 2) return 1;
  if (argc == 3 && std::strcmp(argv[1], "--watch") == 0) {
    // Ends with the benchmark that started it, even one killed before it could stop us (the
    // second test covers a parent gone before prctl).
    const pid_t parent = ::getppid();
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) return 1;
    watch(cpus[0], cpus[1], std::atoll(argv[2]) * 1'000'000);
  }
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
