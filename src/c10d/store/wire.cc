#include "c10d/store/wire.h"

#include <algorithm>

namespace c10d::store::wire {

std::string query_name(uint8_t type) {
  static constexpr const char* kNames[kNumQueryTypes] = {
      "VALIDATE",   "SET",        "COMPARE_SET", "GET",       "ADD",       "CHECK",       "WAIT",
      "GETNUMKEYS", "DELETE_KEY", "APPEND",      "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING",
      "QUEUE_PUSH", "QUEUE_POP",  "QUEUE_LEN",   "LIST_KEYS", "BARRIER"};
  if (type < kNumQueryTypes) return kNames[type];
  if (type == static_cast<uint8_t>(QueryType::kAuth)) return "AUTH";
  return "UNKNOWN(" + std::to_string(type) + ")";
}

void RequestParser::feed(const char* data, size_t size) { buffer_.append(data, size); }

void RequestParser::compact() {
  if (offset_ == 0) return;
  buffer_.erase(0, offset_);
  offset_ = 0;
}

RequestParser::Status RequestParser::fail(std::string message) {
  error_ = std::move(message);
  buffer_.clear();
  offset_ = 0;
  return Status::kError;
}

// What the request under construction still lacks, derived from what it already holds.
RequestParser::Field RequestParser::next_field() const {
  const Request& r = current_;
  switch (r.type) {
    case QueryType::kValidate:
    case QueryType::kPing:
      return have_integer_ ? Field::kNone : Field::kU32;
    case QueryType::kSet:
    case QueryType::kAppend:
    case QueryType::kQueuePush:
      if (r.keys.empty()) return Field::kKey;
      return r.values.empty() ? Field::kValue : Field::kNone;
    case QueryType::kCompareSet:
      if (r.keys.empty()) return Field::kKey;
      return r.values.size() < 2 ? Field::kValue : Field::kNone;
    case QueryType::kGet:
    case QueryType::kDeleteKey:
    case QueryType::kQueuePop:
    case QueryType::kQueueLen:
      return r.keys.empty() ? Field::kKey : Field::kNone;
    case QueryType::kAdd:
    case QueryType::kBarrier:
      if (r.keys.empty()) return Field::kKey;
      return have_integer_ ? Field::kNone : Field::kI64;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet:
      if (!have_count_) return Field::kCount;
      return r.keys.size() < count_ ? Field::kKey : Field::kNone;
    case QueryType::kMultiSet:
      if (!have_count_) return Field::kCount;
      if (r.keys.size() > r.values.size()) return Field::kValue;
      return r.keys.size() < count_ ? Field::kKey : Field::kNone;
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kListKeys:
      return Field::kNone;
    case QueryType::kAuth:
      return r.values.empty() ? Field::kValue : Field::kNone;
  }
  return Field::kNone;
}

RequestParser::Status RequestParser::next(Request& out) {
  if (!error_.empty()) return Status::kError;
  while (true) {
    if (!in_request_) {
      if (available() < 1) {
        compact();
        return Status::kNeedMore;
      }
      auto type = take<uint8_t>();
      if (type >= kNumQueryTypes && type != static_cast<uint8_t>(QueryType::kAuth)) {
        return fail("unknown query type " + std::to_string(type));
      }
      current_ = Request{};
      current_.type = static_cast<QueryType>(type);
      in_request_ = true;
      have_count_ = have_integer_ = have_length_ = false;
      count_ = length_ = 0;
    }
    Field field = next_field();
    size_t need = 0;
    switch (field) {
      case Field::kNone:
        out = std::move(current_);
        current_ = Request{};
        in_request_ = false;
        return Status::kRequest;
      case Field::kU32:
        need = sizeof(uint32_t);
        break;
      case Field::kI64:
      case Field::kCount:
        need = sizeof(uint64_t);
        break;
      case Field::kKey:
      case Field::kValue:
        need = have_length_ ? length_ : sizeof(uint64_t);
        break;
    }
    if (available() < need) {
      compact();
      if (have_length_) buffer_.reserve(need);
      return Status::kNeedMore;
    }
    switch (field) {
      case Field::kNone:
        break;
      case Field::kU32:
        current_.u32 = take<uint32_t>();
        have_integer_ = true;
        break;
      case Field::kI64:
        current_.integer = take<int64_t>();
        have_integer_ = true;
        break;
      case Field::kCount:
        count_ = take<uint64_t>();
        if (count_ > kMaxKeysPerOp) {
          return fail(query_name(static_cast<uint8_t>(current_.type)) + " names " +
                      std::to_string(count_) + " keys, more than the limit of " +
                      std::to_string(kMaxKeysPerOp));
        }
        current_.keys.reserve(std::min<uint64_t>(count_, 1024));
        have_count_ = true;
        break;
      case Field::kKey:
      case Field::kValue:
        if (!have_length_) {
          length_ = take<uint64_t>();
          const uint64_t limit = field == Field::kKey ? kMaxKeyLen : kMaxValueLen;
          if (length_ > limit) {
            return fail(query_name(static_cast<uint8_t>(current_.type)) + ": " +
                        (field == Field::kKey ? "key" : "value") + " length " +
                        std::to_string(length_) + " exceeds the limit of " + std::to_string(limit) +
                        " bytes");
          }
          have_length_ = true;
          break;  // loop round: the body may already be here
        }
        if (field == Field::kKey) {
          current_.keys.emplace_back(cursor(), length_);
        } else {
          const auto* p = reinterpret_cast<const uint8_t*>(cursor());
          current_.values.emplace_back(p, p + length_);
        }
        offset_ += length_;
        have_length_ = false;
        length_ = 0;
        break;
    }
  }
}

}  // namespace c10d::store::wire
