#include "c10d/core/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace c10d::core {
namespace {

#if defined(__x86_64__)
// 64 bytes per iteration with unaligned 16-byte loads and stores (SSE2: every x86-64 CPU).
void vector_copy(char* dst, const char* src, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
}

// Non-temporal 16-byte stores (SSE2) to a 64-byte aligned destination, whole lines only.
void stream_lines(char* dst, const char* src, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
}

// Below this a streaming copy saves too little to pay for reading the data back from memory.
constexpr size_t kStreamMin = 4096;
#endif

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n) {
  if (n == 0 || dst == src) return;
#if defined(__x86_64__)
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
    const size_t body = (n - head) & ~size_t{63};
    stream_lines(d + head, s + head, body);
    copy_bytes(d + head + body, s + head + body, n - head - body);
    _mm_sfence();
    return;
  }
#endif
  copy_bytes(dst, src, n);
}

}  // namespace c10d::core
