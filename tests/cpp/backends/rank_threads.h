// Helpers shared by the backend tests: ranks as threads of one process over one HashStore, each
// building its own backend, and inputs every rank can recompute (filled, expected_reduce).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <complex>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "c10d/core/reduce.h"
#include "c10d/core/tensor.h"
#include "c10d/pg/options.h"
#include "c10d/store/hash_store.h"

namespace c10d::backends::rank_threads {

using core::DType;
using core::ReduceOp;
using core::Tensor;

// Runs fn(rank, backend) on one thread per rank, where build(store, rank) makes that rank's
// backend (a std::unique_ptr) over a store all ranks share. Whatever a rank throws, from
// building or from fn, fails the test naming the rank.
template <typename Build, typename Fn>
void run_rank_threads(int size, Build build, Fn fn) {
  auto store = std::make_shared<store::HashStore>(std::chrono::seconds(10));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto backend = build(std::shared_ptr<store::Store>(store), r);
        fn(r, *backend);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " of " << size;
}

// Small integers, exact in every dtype (products of four stay below 128).
inline double value_at(int rank, int64_t i) { return static_cast<double>((rank + i) % 3 + 1); }

inline void set_value(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kFloat32:
      t.data_as<float>()[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      t.data_as<double>()[i] = v;
      break;
    case DType::kFloat16:
      t.data_as<uint16_t>()[i] = core::float_to_half(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      t.data_as<uint16_t>()[i] = core::float_to_bfloat16(static_cast<float>(v));
      break;
    case DType::kInt8:
      t.data_as<int8_t>()[i] = static_cast<int8_t>(v);
      break;
    case DType::kInt16:
      t.data_as<int16_t>()[i] = static_cast<int16_t>(v);
      break;
    case DType::kInt32:
      t.data_as<int32_t>()[i] = static_cast<int32_t>(v);
      break;
    case DType::kInt64:
      t.data_as<int64_t>()[i] = static_cast<int64_t>(v);
      break;
    case DType::kUInt8:
      t.data_as<uint8_t>()[i] = static_cast<uint8_t>(v);
      break;
    case DType::kBool:
      t.data_as<uint8_t>()[i] = static_cast<int64_t>(v) % 2;
      break;
    case DType::kComplex64:
      t.data_as<std::complex<float>>()[i] = {static_cast<float>(v), static_cast<float>(-v)};
      break;
    case DType::kComplex128:
      t.data_as<std::complex<double>>()[i] = {v, -v};
      break;
  }
}

// n elements of value_at(rank + seed, i).
inline Tensor filled(int64_t n, DType dtype, int rank, int seed = 0) {
  Tensor t = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) set_value(t, i, value_at(rank + seed, i));
  return t;
}

// What every rank should hold after reducing every rank's filled(n, dtype, r, seed).
inline Tensor expected_reduce(int64_t n, DType dtype, int size, const ReduceOp& op, int seed = 0) {
  Tensor acc = filled(n, dtype, 0, seed);
  core::apply_premul(acc.data(), n, dtype, op);
  for (int r = 1; r < size; ++r) {
    Tensor t = filled(n, dtype, r, seed);
    core::apply_premul(t.data(), n, dtype, op);
    core::reduce(acc.data(), t.data(), n, dtype, op);
  }
  core::apply_postdiv(acc.data(), n, dtype, op, size);
  return acc;
}

// Byte-for-byte equality, naming `what` and the first difference.
inline void expect_same(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.nbytes(), expected.nbytes()) << what;
  if (actual.nbytes() == 0) return;
  const auto* a = actual.data_as<unsigned char>();
  const auto* e = expected.data_as<unsigned char>();
  for (size_t i = 0; i < actual.nbytes(); ++i) {
    if (a[i] != e[i]) FAIL() << what << ": first difference at byte " << i;
  }
}

// Waits until `flag` is set, at most `limit` (so a rank whose peer failed early cannot hang).
inline void wait_for(const std::atomic<bool>& flag, pg::Millis limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!flag.load() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Sets `flag` when it goes out of scope, however the scope is left.
struct SetOnExit {
  std::atomic<bool>& flag;
  ~SetOnExit() { flag = true; }
};

}  // namespace c10d::backends::rank_threads
