#include "c10d/pg/registry.h"

#include <map>
#include <mutex>

#include "c10d/core/exception.h"

namespace c10d::pg {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<ProcessGroup>> groups;  // guarded by mutex
};

Registry& registry() {
  static auto* instance = new Registry();  // never destroyed: usable during static teardown
  return *instance;
}

}  // namespace

void register_process_group(const std::string& name, std::shared_ptr<ProcessGroup> group) {
  C10D_CHECK_ARG(group != nullptr, "register_process_group: the group is None");
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  C10D_CHECK_ARG(r.groups.emplace(name, std::move(group)).second,
                 "A process group is already registered under the name '", name, "'");
}

std::shared_ptr<ProcessGroup> resolve_process_group(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.groups.find(name);
  if (it == r.groups.end()) {
    std::string known;
    for (const auto& [n, g] : r.groups) known += (known.empty() ? "'" : ", '") + n + "'";
    throw core::InvalidArgument("Could not resolve the process group registered under the name '" +
                                name + "' (registered: " + (known.empty() ? "none" : known) + ")");
  }
  return it->second;
}

void unregister_process_group(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.groups.erase(name);
}

void unregister_all_process_groups() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.groups.clear();
}

std::vector<std::string> registered_process_groups() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [n, g] : r.groups) names.push_back(n);
  return names;
}

}  // namespace c10d::pg
