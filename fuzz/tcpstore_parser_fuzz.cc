// libFuzzer target: the TCPStore request parser fed arbitrary bytes, split into arbitrary
// reads. It must never crash, never buffer more than the protocol limits allow, and must
// decode the same requests however the stream is split.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "c10d/store/wire.h"

using c10d::store::wire::Request;
using c10d::store::wire::RequestParser;

namespace {

// Parses `data` fed in chunks of the given sizes (cycled); returns the decoded requests'
// types and whether the stream ended in an error.
std::vector<int> parse(const uint8_t* data, size_t size, const std::vector<size_t>& chunks,
                       bool& failed) {
  RequestParser parser;
  std::vector<int> types;
  failed = false;
  size_t offset = 0, c = 0;
  while (offset < size && !failed) {
    size_t n = std::min(size - offset, std::max<size_t>(1, chunks[c++ % chunks.size()]));
    parser.feed(reinterpret_cast<const char*>(data) + offset, n);
    offset += n;
    Request request;
    for (;;) {
      auto status = parser.next(request);
      if (status == RequestParser::Status::kRequest) {
        types.push_back(static_cast<int>(request.type));
        for (const auto& k : request.keys) {
          if (k.size() > c10d::store::wire::kMaxKeyLen) std::abort();
        }
        for (const auto& v : request.values) {
          if (v.size() > c10d::store::wire::kMaxValueLen) std::abort();
        }
        continue;
      }
      if (status == RequestParser::Status::kError) failed = true;
      break;
    }
  }
  return types;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte chooses how the rest is split into reads.
  const size_t step = 1 + data[0] % 17;
  bool whole_failed = false, split_failed = false;
  auto whole = parse(data + 1, size - 1, {size}, whole_failed);
  auto split = parse(data + 1, size - 1, {step, 1, step * 3}, split_failed);
  // Splitting never changes what is decoded before an error.
  if (!whole_failed && !split_failed && whole != split) std::abort();
  return 0;
}
