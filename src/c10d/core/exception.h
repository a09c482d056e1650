// The error types of c10d's public API. Each maps to one Python exception class (a subclass of
// RuntimeError, named as in torch.distributed), registered once in the bindings.
#pragma once

#include <charconv>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
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
// One part of str_cat, as `std::ostream <<` would print it. Text and integers are appended
// directly: operations name themselves with str_cat on their critical path, and a stream
// costs several hundred nanoseconds to set up.
template <typename T>
void append_part(std::string& out, const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_pointer_v<T> &&
                (std::is_same_v<D, const char*> || std::is_same_v<D, char*>)) {
    if (v != nullptr) out.append(v);  // a literal (an array) goes below, with no test
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out.append(std::string_view(v));
  } else if constexpr (std::is_same_v<D, char>) {
    out.push_back(v);
  } else if constexpr (std::is_integral_v<D> && !std::is_same_v<D, bool> && sizeof(D) > 1) {
    char digits[24];
    const auto end = std::to_chars(digits, digits + sizeof(digits), v).ptr;
    out.append(digits, end);
  } else {
    std::ostringstream stream;
    stream << v;
    out.append(stream.str());
  }
}

template <typename... Args>
std::string str_cat(Args&&... args) {
  std::string out;
  (append_part(out, args), ...);
  return out;
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
