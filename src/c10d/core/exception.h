// The error types of c10d's public API. Each maps to one Python exception class (a subclass of
// RuntimeError, named as in torch.distributed), registered once in the bindings.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace c10d::core {

// Root of every distributed error.
class DistError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A store operation failed (missing key, wrong value type, protocol error).
class DistStoreError : public DistError {
 public:
  using DistError::DistError;
};

// A socket could not connect, was reset, or a peer went away.
class DistNetworkError : public DistError {
 public:
  using DistError::DistError;
};

// A collective or point-to-point operation failed inside a backend.
class DistBackendError : public DistError {
 public:
  using DistError::DistError;
};

// A blocking call hit its deadline. The message names what it waited for.
class DistTimeoutError : public DistError {
 public:
  using DistError::DistError;
};

// A store wait or get hit its deadline. In Python this is both a DistStoreError and a
// DistTimeoutError, so code written against either catches it.
class DistStoreTimeoutError : public DistStoreError {
 public:
  using DistStoreError::DistStoreError;
};

// queue_pop on an empty queue with block=false.
class DistQueueEmptyError : public DistStoreError {
 public:
  using DistStoreError::DistStoreError;
};

// The caller passed something invalid (bad rank, wrong dtype, wrong size). Maps to ValueError.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The object cannot do this operation (e.g. a store without queues): a DistError whose
// message says "<what> does not support <op>".
class NotSupported : public DistError {
 public:
  using DistError::DistError;
};

namespace detail {
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace c10d::core

// C10D_CHECK(cond, message parts...): throws `Error` with the parts concatenated.
#define C10D_CHECK_T(Error, cond, ...)                         \
  do {                                                         \
    if (!(cond)) [[unlikely]] {                                \
      throw Error(::c10d::core::detail::str_cat(__VA_ARGS__)); \
    }                                                          \
  } while (0)

#define C10D_CHECK(cond, ...) C10D_CHECK_T(::c10d::core::DistError, cond, __VA_ARGS__)
#define C10D_CHECK_ARG(cond, ...) C10D_CHECK_T(::c10d::core::InvalidArgument, cond, __VA_ARGS__)

// C10D_CHECK_EQ(a, b, context...): prints both operands when they differ.
#define C10D_CHECK_EQ_T(Error, a, b, ...)                                                         \
  do {                                                                                            \
    const auto& c10d_lhs_ = (a);                                                                  \
    const auto& c10d_rhs_ = (b);                                                                  \
    if (!(c10d_lhs_ == c10d_rhs_)) [[unlikely]] {                                                 \
      throw Error(::c10d::core::detail::str_cat(__VA_ARGS__, " (expected " #a " == " #b ", got ", \
                                                c10d_lhs_, " vs ", c10d_rhs_, ")"));              \
    }                                                                                             \
  } while (0)

#define C10D_CHECK_EQ(a, b, ...) C10D_CHECK_EQ_T(::c10d::core::DistError, a, b, __VA_ARGS__)
#define C10D_CHECK_ARG_EQ(a, b, ...) \
  C10D_CHECK_EQ_T(::c10d::core::InvalidArgument, a, b, __VA_ARGS__)
