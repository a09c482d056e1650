// Process-wide registry of process groups by name, so code that only has a group's name
// (functional collectives, C++ extensions, tracing) can find the group. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "c10d/pg/process_group.h"

namespace c10d::pg {

// Throws InvalidArgument if `name` is already registered.
void register_process_group(const std::string& name, std::shared_ptr<ProcessGroup> group);
// Throws InvalidArgument naming `name` and the registered names when it is unknown.
std::shared_ptr<ProcessGroup> resolve_process_group(const std::string& name);
// No-op for unknown names.
void unregister_process_group(const std::string& name);
void unregister_all_process_groups();
std::vector<std::string> registered_process_groups();

}  // namespace c10d::pg
