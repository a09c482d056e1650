// Throughput of the reduction kernels, the inner loop of every CPU collective.
//
// bytes_per_second counts the payload: the size of one buffer (dst) per call. A reduce reads
// two buffers and writes one, so its memory traffic is three times that; memcpy's is twice.
// The memcpy benchmark is the yardstick: "near memory speed" for reduce means a payload rate
// of about two thirds of memcpy's at the same size.
//
//   build/bench/reduce_bench --benchmark_filter='Sum/float32'
//   C10D_BENCH_PORTABLE=1 ... runs the baseline (non-AVX2) kernels for comparison.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "c10d/core/dtype.h"
#include "c10d/core/reduce.h"

namespace {

using c10d::core::DType;

constexpr int64_t kSizes[] = {4 << 10, 1 << 20, 64 << 20};

void select_isa() {
  static const bool done = [] {
    if (std::getenv("C10D_BENCH_PORTABLE") != nullptr) {
      c10d::core::detail::set_kernel_isa(c10d::core::detail::KernelIsa::kPortable);
    }
    return true;
  }();
  (void)done;
}

// Buffers filled with small values (1.0 in every format) so sums stay finite forever.
std::vector<unsigned char> make_buffer(DType dtype, size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  const size_t n = bytes / c10d::core::element_size(dtype);
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat32: {
        float v = 1.0f;
        std::memcpy(&buf[i * 4], &v, 4);
        break;
      }
      case DType::kFloat64: {
        double v = 1.0;
        std::memcpy(&buf[i * 8], &v, 8);
        break;
      }
      case DType::kFloat16: {
        uint16_t v = 0x3C00;
        std::memcpy(&buf[i * 2], &v, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t v = 0x3F80;
        std::memcpy(&buf[i * 2], &v, 2);
        break;
      }
      case DType::kInt64: {
        int64_t v = 1;
        std::memcpy(&buf[i * 8], &v, 8);
        break;
      }
      default:
        break;
    }
  }
  return buf;
}

void BM_Sum(benchmark::State& state, DType dtype) {
  select_isa();
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / c10d::core::element_size(dtype);
  auto dst = make_buffer(dtype, bytes);
  auto src = make_buffer(dtype, bytes);
  // For float types, accumulating 1.0 forever eventually saturates (2^24 in float32, 2048 in
  // float16); the speed does not depend on the values, so that is harmless.
  for (auto _ : state) {
    c10d::core::reduce(dst.data(), src.data(), count, dtype, c10d::core::ReduceOp::SUM);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<unsigned char> dst(bytes, 1), src(bytes, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void BM_FinalizeAvg(benchmark::State& state, DType dtype) {
  select_isa();
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / c10d::core::element_size(dtype);
  auto data = make_buffer(dtype, bytes);
  for (auto _ : state) {
    // Dividing by 1 is skipped, and by a power of two would be a multiply: use 3.
    c10d::core::finalize_avg(data.data(), count, dtype, 3);
    benchmark::DoNotOptimize(data.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t size : kSizes) b->Arg(size);
}

}  // namespace

BENCHMARK_CAPTURE(BM_Sum, float32, DType::kFloat32)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Sum, float16, DType::kFloat16)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Sum, bfloat16, DType::kBFloat16)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Sum, int64, DType::kInt64)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Sum, float64, DType::kFloat64)->Apply(sizes);
BENCHMARK(BM_Memcpy)->Apply(sizes);
BENCHMARK_CAPTURE(BM_FinalizeAvg, float32, DType::kFloat32)->Apply(sizes);
BENCHMARK_CAPTURE(BM_FinalizeAvg, bfloat16, DType::kBFloat16)->Apply(sizes);
BENCHMARK_CAPTURE(BM_FinalizeAvg, int64, DType::kInt64)->Apply(sizes);

BENCHMARK_MAIN();
