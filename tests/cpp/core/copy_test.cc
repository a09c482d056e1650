#include "c10d/core/copy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace c10d::core {
namespace {

using CopyFn = void (*)(void*, const void*, size_t);

// Every size class and every destination offset (including the 1-63 bytes past the source,
// modulo 4 KiB, that take copy_bytes' vector loop; sizes around the AVX2 loop's 16 KiB start
// and 128-byte steps; the unaligned heads and tails around stream_bytes' whole lines) copies
// exactly the bytes asked for.
void expect_exact_copies(CopyFn copy) {
  std::vector<unsigned char> src(300000), dst(300000 + 8192);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{2047}, size_t{2048}, size_t{4095},
                   size_t{4099}, size_t{4096 + 64 + 1}, size_t{16383}, size_t{16384 + 127},
                   size_t{65536 + 17}, size_t{262144}}) {
    for (size_t shift : {size_t{0}, size_t{1}, size_t{16}, size_t{63}, size_t{64}, size_t{4080}}) {
      std::fill(dst.begin(), dst.end(), 0xAB);
      // dst + shift is `shift` bytes past src modulo 4 KiB when both buffers share a page offset.
      const size_t base =
          (reinterpret_cast<uintptr_t>(src.data()) - reinterpret_cast<uintptr_t>(dst.data())) &
          4095;
      unsigned char* d = dst.data() + base + shift;
      copy(d, src.data(), n);
      ASSERT_EQ(std::memcmp(d, src.data(), n), 0) << "n " << n << " shift " << shift;
      ASSERT_EQ(d[n], 0xAB) << "wrote past the end: n " << n << " shift " << shift;
      if (base + shift > 0) {
        ASSERT_EQ(d[-1], 0xAB) << "wrote before the start";
      }
    }
  }
}

// With every choice of kernels (the vector loop or rep movsb, for aliased destinations and the
// others), whatever the timing at startup picked on this CPU.
TEST(CopyBytes, CopiesExactlyAtEveryDistance) {
  const detail::CopyKernels saved = detail::copy_kernels();
  for (bool plain : {false, true}) {
    for (bool aliased : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "rep movsb for plain " << plain << ", aliased " << aliased);
      detail::set_copy_kernels({plain, aliased});
      expect_exact_copies(copy_bytes);
    }
  }
  detail::set_copy_kernels(saved);
}

TEST(StreamBytes, CopiesExactlyAtEveryDistance) { expect_exact_copies(stream_bytes); }

TEST(CopyBytes, CopiesBeyondTheCacheExactly) {
  const size_t n = detail::stream_from() + 4099;
  std::vector<unsigned char> src(n), dst(n + 128, 0xAB);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t shift : {size_t{0}, size_t{17}}) {
    copy_bytes(dst.data() + shift, src.data(), n);
    ASSERT_EQ(std::memcmp(dst.data() + shift, src.data(), n), 0) << "shift " << shift;
    ASSERT_EQ(dst[shift + n], 0xAB) << "wrote past the end";
  }
}

}  // namespace
}  // namespace c10d::core
