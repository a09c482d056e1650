#include "c10d/core/copy.h"

#include <cstdint>
#include <cstring>

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

// From this size copies on AVX2 CPUs take vector_copy_avx2 instead of memcpy (see copy.h).
constexpr size_t kVectorMin = size_t{16} << 10;

// Below this a streaming copy saves too little to pay for reading the data back from memory.
constexpr size_t kStreamMin = 4096;
#endif

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n) {
  if (n == 0 || dst == src) return;
#if defined(__x86_64__)
  if (n >= kVectorMin && has_avx2()) {
    return vector_copy_avx2(static_cast<char*>(dst), static_cast<const char*>(src), n);
  }
  const auto distance =
      (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & uintptr_t{4095};
  if (n >= 2048 && distance != 0 && distance < 64) {
    return vector_copy(static_cast<char*>(dst), static_cast<const char*>(src), n);
  }
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

}  // namespace c10d::core
