#include "c10d/core/copy.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "c10d/core/env.h"
#include "c10d/core/exception.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace c10d::core {
namespace {

#if defined(__x86_64__)
// Copies the whole 64-byte lines of [src, src + n) with unaligned 16-byte loads (SSE2: every
// x86-64 CPU) and unaligned stores, or non-temporal ones (`dst` 16-byte aligned then); returns
// the bytes copied.
template <bool kStream>
size_t copy_lines(char* dst, const char* src, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16 * k));
    }
    for (int k = 0; k < 4; ++k) {
      auto* to = reinterpret_cast<__m128i*>(dst + i + 16 * k);
      if constexpr (kStream) {
        _mm_stream_si128(to, v[k]);
      } else {
        _mm_storeu_si128(to, v[k]);
      }
    }
  }
  return i;
}

void vector_copy(char* dst, const char* src, size_t n) {
  const size_t i = copy_lines<false>(dst, src, n);
  std::memcpy(dst + i, src + i, n - i);
}

// The same with 32-byte registers, two lines per iteration (CPUs with AVX2). A loop of its
// own: AVX2 intrinsics inline only into functions compiled for AVX2, so copy_lines cannot
// be instantiated for them without making every copy require AVX2.
[[gnu::target("avx2")]] void vector_copy_avx2(char* dst, const char* src, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32 * k));
    }
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 32 * k), v[k]);
    }
  }
  std::memcpy(dst + i, src + i, n - i);
}

bool has_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

// `rep movsb`: on CPUs with fast strings the microcode writes whole lines without reading
// them first, which a load/store loop cannot do with cacheable stores.
void string_copy(char* dst, const char* src, size_t n) {
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

// Whether the destination lies 1-63 bytes past the source modulo 4 KiB: the case where
// `rep movsb` on some CPUs runs ~20x slower (see copy.h).
bool aliased(const void* dst, const void* src) {
  const auto distance =
      (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & uintptr_t{4095};
  return distance != 0 && distance < 64;
}

// Times both copies a few times, interleaved, with the destination aliased (in the sense of
// aliased()) and not, and takes `rep movsb` where its best time beats the loop's by 5%. A
// timing copies a 256 KiB source (in L2) over a 2 MiB destination, which is mostly out of L2
// by the time a piece is written again: the backends' copies land in slots and arrays other
// cores or earlier steps touched, and in-cache copies do not tell the kernels apart. Which
// copy wins differs by CPU (measurements in docs/design/shm.md#copy-kernels).
detail::CopyKernels time_copies() {
  constexpr size_t kPiece = size_t{256} << 10;
  constexpr size_t kSpan = size_t{2} << 20;
  constexpr int kRounds = 5;
  // source | destination span (+16 bytes, for the aliased destinations)
  char* buf = static_cast<char*>(std::aligned_alloc(4096, kPiece + kSpan + 4096));
  if (buf == nullptr) return {};
  std::memset(buf, 1, kPiece + kSpan + 4096);
  const char* src = buf;
  using Copy = void (*)(char*, const char*, size_t);
  const auto time_one = [&](Copy f, size_t shift) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t o = 0; o < kSpan; o += kPiece) f(buf + kPiece + shift + o, src, kPiece);
    return std::chrono::steady_clock::now() - start;
  };
  std::chrono::steady_clock::duration t[4];
  for (auto& d : t) d = std::chrono::steady_clock::duration::max();
  for (int r = 0; r < kRounds; ++r) {
    t[0] = std::min(t[0], time_one(vector_copy_avx2, 0));
    t[1] = std::min(t[1], time_one(string_copy, 0));
    t[2] = std::min(t[2], time_one(vector_copy_avx2, 16));
    t[3] = std::min(t[3], time_one(string_copy, 16));
  }
  std::free(buf);
  return {t[1] * 20 < t[0] * 19, t[3] * 20 < t[2] * 19};
}

detail::CopyKernels initial_kernels() {
  const std::string mode = env_string(kEnvCopy);
  if (mode == "vector") return {};
  if (mode == "string") return {true, true};
  C10D_CHECK_ARG(mode == "auto", "Environment variable ", kEnvCopy.name, "='", mode,
                 "' is not one of auto, vector, string");
  return time_copies();
}

// The kernels as two bits in one atomic byte, so that tests can switch them atomically.
constexpr uint8_t kStringPlain = 1;
constexpr uint8_t kStringAliased = 2;

uint8_t to_bits(detail::CopyKernels k) {
  return static_cast<uint8_t>((k.string_plain ? kStringPlain : 0) |
                              (k.string_aliased ? kStringAliased : 0));
}

std::atomic<uint8_t>& kernel_bits() {
  static std::atomic<uint8_t> bits{to_bits(initial_kernels())};
  return bits;
}

// From this size copies on AVX2 CPUs take vector_copy_avx2 or string_copy instead of memcpy
// (see copy.h).
constexpr size_t kVectorMin = size_t{16} << 10;

// Below this a streaming copy saves too little to pay for reading the data back from memory.
constexpr size_t kStreamMin = 4096;

// The last-level cache of this CPU as Linux describes it (sysfs: a guest's sysconf reported the
// host's 320 MiB where its own is 32), or 32 MiB when it does not.
size_t last_level_cache_bytes() {
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level");
    std::ifstream size(dir + "size");
    int l = 0;
    size_t kib = 0;
    std::string unit;
    if (!(level >> l) || !(size >> kib >> unit) || l < 2) continue;
    if (unit == "K") best = std::max(best, kib << 10);
    if (unit == "M") best = std::max(best, kib << 20);
  }
  return best != 0 ? best : size_t{32} << 20;
}

// From this size copy_bytes streams: source and destination together overflow the last-level
// cache, so cacheable stores would read every destination line from memory first and evict
// the source for nothing. 3/8 of the cache: 12 MiB of 32 on the EPYC guest, where 2-rank
// send/recv of 16 MiB round the ring (reading the peer's pages in place) took 0.65-0.66 ms
// streamed against 1.1-1.5 cached, and streaming from 1 MiB lost at 8 MiB (0.33-0.39 ms
// against 0.27-0.29).
size_t stream_from_bytes() {
  static const size_t bytes = last_level_cache_bytes() / 8 * 3;
  return bytes;
}
#endif

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n) {
  if (n == 0 || dst == src) return;
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (n >= kVectorMin && n >= stream_from_bytes()) return stream_bytes(d, s, n);
  if (n >= kVectorMin && has_avx2()) {
    const uint8_t bits = kernel_bits().load(std::memory_order_relaxed);
    const bool string = (bits & (aliased(d, s) ? kStringAliased : kStringPlain)) != 0;
    return string ? string_copy(d, s, n) : vector_copy_avx2(d, s, n);
  }
  if (n >= 2048 && aliased(d, s)) return vector_copy(d, s, n);
#endif
  std::memcpy(dst, src, n);
}

void stream_bytes(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamMin) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
    copy_bytes(d, s, head);
    const size_t body = copy_lines<true>(d + head, s + head, n - head);
    copy_bytes(d + head + body, s + head + body, n - head - body);
    _mm_sfence();
    return;
  }
#endif
  copy_bytes(dst, src, n);
}

namespace detail {

size_t stream_from() {
#if defined(__x86_64__)
  return stream_from_bytes();
#else
  return SIZE_MAX;
#endif
}

CopyKernels copy_kernels() {
#if defined(__x86_64__)
  const uint8_t bits = kernel_bits().load(std::memory_order_relaxed);
  return {(bits & kStringPlain) != 0, (bits & kStringAliased) != 0};
#else
  return {};
#endif
}

void set_copy_kernels(CopyKernels k) {
#if defined(__x86_64__)
  kernel_bits().store(to_bits(k), std::memory_order_relaxed);
#else
  (void)k;
#endif
}

}  // namespace detail
}  // namespace c10d::core
