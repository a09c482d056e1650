// The TCPStore wire protocol (see /work/shared/TCPSTORE_PROTOCOL.md): constants, size limits,
// an incremental request parser for the server and an encoder used by both sides. Framing is
// written once here so the client and the server cannot disagree about it.
//
// Integers travel in host byte order (little-endian on every platform we build for), strings
// and byte payloads as `uint64 length` + bytes, key counts as `uint64`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "c10d/store/store.h"

namespace c10d::store::wire {

enum class QueryType : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
  kBarrier = 18,
  // c10d extension, outside PyTorch's range: AUTH <secret> right after VALIDATE, answered with
  // one byte (1). Servers with a shared secret refuse every other request until then.
  kAuth = 100,
};
inline constexpr uint8_t kNumQueryTypes = 19;

// Printable name of a query type ("SET"), or "UNKNOWN(<n>)".
std::string query_name(uint8_t type);

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// Reply byte of CHECK.
enum class CheckReply : uint8_t { kReady = 0, kNotReady = 1 };
// Reply bytes of WAIT, BARRIER and CANCEL_WAIT.
enum class WaitReply : uint8_t { kStopWaiting = 0, kWaitCanceled = 1 };

// Limits enforced by the server before it allocates anything (the same as PyTorch's libuv
// server), and checked by our client before it sends, so a caller gets a clear error instead
// of a dropped connection.
inline constexpr size_t kMaxKeyLen = 8 * 1024;
inline constexpr size_t kMaxValueLen = 8 * 1024 * 1024;
inline constexpr size_t kMaxKeysPerOp = 128 * 1024;
// Counts in a reply (keys listed, queue lengths) past this are refused by the client as corrupt.
inline constexpr uint64_t kMaxReplyLen = uint64_t{1} << 31;

// One decoded request. Which fields are used depends on `type`:
//   keys:    SET/COMPARE_SET/GET/ADD/DELETE_KEY/APPEND/QUEUE_*/BARRIER one key;
//            CHECK/WAIT/MULTI_GET/MULTI_SET n keys
//   values:  SET/APPEND/QUEUE_PUSH one value; COMPARE_SET expected, desired; MULTI_SET n values
//   integer: ADD delta, BARRIER world size
//   u32:     VALIDATE magic, PING nonce
struct Request {
  QueryType type = QueryType::kValidate;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  int64_t integer = 0;
  uint32_t u32 = 0;
};

// Turns a byte stream into requests, however the stream is split into reads. Not
// thread-safe: one parser per connection, used by one thread.
//
// A length prefix is checked against the limits as soon as its 8 bytes are in, so an oversize
// or garbage length is reported without allocating it; the parser buffers at most one
// field (<= kMaxValueLen) plus the unread tail of the last read.
class RequestParser {
 public:
  enum class Status {
    kRequest,   // `out` holds one complete request
    kNeedMore,  // feed more bytes
    kError,     // the stream is invalid; error() says why; the parser is unusable afterwards
  };

  // Appends received bytes.
  void feed(const char* data, size_t size);
  // Extracts the next complete request, if any. Call repeatedly until it returns kNeedMore.
  [[nodiscard]] Status next(Request& out);

  const std::string& error() const { return error_; }
  // True when some bytes of an unfinished request have been received (a disconnect now is a
  // disconnect mid-request).
  bool mid_request() const { return in_request_ || available() > 0; }

 private:
  enum class Field { kNone, kU32, kI64, kCount, kKey, kValue };

  Field next_field() const;
  size_t available() const { return buffer_.size() - offset_; }
  const char* cursor() const { return buffer_.data() + offset_; }
  template <typename T>
  T take() {
    T value;
    std::memcpy(&value, cursor(), sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  Status fail(std::string message);
  void compact();

  std::string buffer_;
  size_t offset_ = 0;
  bool in_request_ = false;
  Request current_;
  bool have_count_ = false;
  bool have_integer_ = false;
  uint64_t count_ = 0;
  bool have_length_ = false;  // length of the string field being read
  uint64_t length_ = 0;
  std::string error_;
};

// Appends protocol fields to a byte buffer. Used for requests (client) and replies (server).
class Encoder {
 public:
  Encoder& u8(uint8_t v) { return raw(&v, sizeof v); }
  Encoder& u32(uint32_t v) { return raw(&v, sizeof v); }
  Encoder& i64(int64_t v) { return raw(&v, sizeof v); }
  Encoder& u64(uint64_t v) { return raw(&v, sizeof v); }
  Encoder& query(QueryType t) { return u8(static_cast<uint8_t>(t)); }
  Encoder& str(std::string_view s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  Encoder& bytes(const Bytes& b) {
    u64(b.size());
    return raw(b.data(), b.size());
  }
  Encoder& raw(const void* data, size_t size) {
    buffer_.append(static_cast<const char*>(data), size);
    return *this;
  }

  std::string& buffer() { return buffer_; }
  const std::string& buffer() const { return buffer_; }
  void clear() { buffer_.clear(); }

 private:
  std::string buffer_;
};

}  // namespace c10d::store::wire
