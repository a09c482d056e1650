#include "c10d/store/store.h"

#include <charconv>

#include "c10d/core/exception.h"

namespace c10d::store {

using core::detail::str_cat;

namespace {

// A value no user writes, for learning what a key holds through compare_set alone.
const Bytes& probe() {
  static const Bytes value = to_bytes(std::string("\0c10d:append-probe\0", 19));
  return value;
}

// What `key` holds, or empty bytes when it is missing; for a store without check() (a Python
// store defining only set, get, add and compare_set), what compare_set(key, probe, probe)
// returned: the value, or the probe when the key is missing. A store following torch's rules
// stores nothing then; one that stores into a missing key whatever was expected (torch's tests
// have one) now holds the probe, which append replaces.
Bytes current_or_probe(Store& store, const std::string& key) {
  try {
    return store.check({key}) ? store.get(key) : Bytes{};
  } catch (const core::NotSupported&) {
  }
  return store.compare_set(key, probe(), probe());
}

}  // namespace

void Store::append(const std::string& key, const Bytes& value) {
  // Optimistic read-modify-write on compare_set, which returns the new value when it swapped
  // and otherwise what the key holds (the expected value itself when the key is missing).
  Bytes current = current_or_probe(*this, key);
  while (true) {
    Bytes desired = current == probe() ? Bytes{} : current;
    desired.insert(desired.end(), value.begin(), value.end());
    Bytes now = compare_set(key, current, desired);
    if (now == desired) return;
    // Another writer changed the key: go on from its value; it is missing: start over empty.
    current = now == current ? Bytes{} : std::move(now);
  }
}

std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys) {
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key));
  return values;
}

void Store::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  C10D_CHECK_ARG_EQ(keys.size(), values.size(), "multi_set: keys and values differ in length");
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

void Store::queue_push(const std::string&, const Bytes&) { throw_not_supported("queue_push"); }
Bytes Store::queue_pop(const std::string&, bool) { throw_not_supported("queue_pop"); }
int64_t Store::queue_len(const std::string&) { throw_not_supported("queue_len"); }
std::vector<std::string> Store::list_keys() { throw_not_supported("list_keys"); }
std::shared_ptr<Store> Store::clone() { throw_not_supported("clone"); }

void Store::throw_not_supported(const char* op) const {
  throw core::NotSupported(str_cat(describe(), " does not support ", op));
}

core::Deadline key_deadline(Millis timeout) {
  return timeout < Millis::zero() ? core::Deadline::passed() : core::Deadline(timeout);
}

void throw_wait_timeout(const std::string& store, const std::vector<std::string>& keys,
                        Millis timeout) {
  // torch's wording ("wait timeout after 100ms, keys: /a, /b"), which its users match on.
  std::string list;
  for (const auto& key : keys) list += (list.empty() ? "" : ", ") + key;
  const std::string after = timeout < Millis::zero()
                                ? str_cat("a negative timeout (", timeout.count(), "ms)")
                                : core::format_timeout(timeout);
  throw core::DistStoreTimeoutError(
      str_cat(store, ": wait timeout after ", after, ", keys: ", list));
}

int64_t parse_counter(const std::string& key, const Bytes& value) {
  int64_t result = 0;
  const char* first = reinterpret_cast<const char*>(value.data());
  const char* last = first + value.size();
  auto [ptr, ec] = std::from_chars(first, last, result);
  if (ec != std::errc() || ptr != last || value.empty()) {
    // A ValueError in Python, as torch's stores raise here.
    throw core::InvalidArgument(str_cat("add: the value of key '", key,
                                        "' is not an integer counter (", value.size(), " bytes)"));
  }
  return result;
}

}  // namespace c10d::store
