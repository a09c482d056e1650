// Option structs of every collective (names and defaults as in torch.distributed's C++ API).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "c10d/core/deadline.h"
#include "c10d/core/reduce_op.h"

namespace c10d::pg {

using core::Millis;
using core::ReduceOp;

// "Use the process group's timeout."
inline constexpr Millis kUnsetTimeout{-1};
// Default timeout of a process group (torch: 30 minutes).
inline constexpr Millis kDefaultPgTimeout = std::chrono::minutes(30);

struct BroadcastOptions {
  int64_t root_rank = 0;
  int64_t root_tensor = 0;
  Millis timeout = kUnsetTimeout;
  bool async_op = true;
};

struct AllreduceOptions {
  ReduceOp reduce_op;
  Millis timeout = kUnsetTimeout;
  // false: the caller waits at once, so a backend may run the operation on the caller's thread.
  bool async_op = true;
};

struct AllreduceCoalescedOptions : AllreduceOptions {};

struct ReduceOptions {
  ReduceOp reduce_op;
  int64_t root_rank = 0;
  int64_t root_tensor = 0;
  Millis timeout = kUnsetTimeout;
  bool async_op = true;
};

struct AllgatherOptions {
  Millis timeout = kUnsetTimeout;
  bool async_op = true;
};

struct GatherOptions {
  int64_t root_rank = 0;
  Millis timeout = kUnsetTimeout;
  bool async_op = true;
};

struct ScatterOptions {
  int64_t root_rank = 0;
  Millis timeout = kUnsetTimeout;
  bool async_op = true;
};

struct ReduceScatterOptions {
  ReduceOp reduce_op;
  Millis timeout = kUnsetTimeout;
  bool async_op = true;
};

struct AllToAllOptions {
  Millis timeout = kUnsetTimeout;
  bool async_op = true;
};

struct BarrierOptions {
  std::vector<int64_t> device_ids;
  Millis timeout = kUnsetTimeout;
  bool async_op = true;
};

// Whether the caller will wait for the result later (async) or right away (sync: a backend
// may then run the operation on the calling thread). Options without the field are async.
template <typename Opts>
bool wants_async(const Opts& opts) {
  if constexpr (requires { opts.async_op; }) {
    return opts.async_op;
  } else {
    return true;
  }
}

}  // namespace c10d::pg
