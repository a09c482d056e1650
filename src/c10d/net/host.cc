#include "c10d/net/host.h"

#include <unistd.h>

#include <fstream>

#include "c10d/core/env.h"
#include "c10d/core/exception.h"

namespace c10d::net {

std::string host_identity() {
  if (core::env_is_set(core::kEnvShmHostId)) return core::env_string(core::kEnvShmHostId);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  return core::detail::str_cat(host, "/", boot_id);
}

}  // namespace c10d::net
