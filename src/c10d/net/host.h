// This machine's identity, for the ranks of a group to tell which of them share a host.
#pragma once

#include <string>

namespace c10d::net {

// C10D_SHM_HOST_ID if set, else "<hostname>/<boot id>": the same for every process of this
// machine (and this boot), different on another machine.
std::string host_identity();

}  // namespace c10d::net
