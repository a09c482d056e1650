// The Gloo backend's addresses and devices: where a rank listens (its TCP device), how ranks
// name each other's addresses, and which peers' hosts answer, so timeout messages can say who.
#include "c10d/backends/gloo/addresses.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include "c10d/backends/gloo/gloo_backend.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/store/prefix_store.h"
#include "c10d/store/tcp_store.h"

namespace c10d::backends::gloo {

using core::detail::str_cat;

namespace detail {
namespace {

// Calls visit(address) for each address `host` (with `service`) resolves to, until it
// returns true; returns whether it did (false when nothing resolves).
template <typename Visit>
bool any_address(const std::string& host, const char* service, int socktype, int flags,
                 Visit visit) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = flags;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), service, &hints, &result) != 0) return false;
  bool hit = false;
  for (addrinfo* ai = result; ai != nullptr && !hit; ai = ai->ai_next) hit = visit(*ai);
  ::freeaddrinfo(result);
  return hit;
}

// Whether `host` resolves to an address this machine can bind (so peers could reach us there).
bool hostname_is_bindable(const std::string& host) {
  return any_address(host, nullptr, SOCK_STREAM, 0, [](const addrinfo& ai) {
    const int fd = ::socket(ai.ai_family, ai.ai_socktype, ai.ai_protocol);
    if (fd < 0) return false;
    const bool ok = ::bind(fd, ai.ai_addr, ai.ai_addrlen) == 0;
    ::close(fd);
    return ok;
  });
}

// Whether every address `host` resolves to is a loopback address (false if it resolves to
// none): Debian's /etc/hosts maps the hostname to 127.0.1.1.
bool resolves_to_loopback(const std::string& host) {
  bool any = false;
  const bool other = any_address(host, nullptr, SOCK_STREAM, 0, [&](const addrinfo& ai) {
    any = true;
    if (ai.ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(ai.ai_addr);
      return (ntohl(in->sin_addr.s_addr) >> 24) != 127;
    }
    if (ai.ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(ai.ai_addr);
      return !IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) &&
             !(IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127);
    }
    return false;
  });
  return any && !other;
}

// The local address the routing table picks to reach `host` ("" if it has none): a UDP
// socket's connect sends nothing, it only chooses the route.
std::string address_towards(const std::string& host) {
  std::string found;
  any_address(host, "9", SOCK_DGRAM, 0, [&](const addrinfo& ai) {
    const int fd = ::socket(ai.ai_family, SOCK_DGRAM, 0);
    if (fd < 0) return false;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai.ai_addr, ai.ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr)
              : &reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr;
      if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) found = text;
    }
    ::close(fd);
    return !found.empty();
  });
  return found;
}

// The peers (by rank, from their "[ip]:port" addresses) whose host does not answer a TCP
// connection attempt within `wait`: a refusal or an accepted connection is an answer, silence
// means the host or the network to it is down. Every attempt runs at once.
std::vector<int> silent_peers(const std::vector<std::vector<std::string>>& addresses,
                              std::chrono::milliseconds wait) {
  struct Attempt {
    int rank;
    int fd;
  };
  std::vector<Attempt> attempts;
  std::vector<int> silent;
  for (size_t r = 0; r < addresses.size(); ++r) {
    for (const std::string& address : addresses[r]) {
      const size_t close = address.find("]:");
      if (address.empty() || address[0] != '[' || close == std::string::npos) continue;
      const std::string ip = address.substr(1, close - 1);
      const std::string port = address.substr(close + 2);
      const bool tried = any_address(
          ip, port.c_str(), SOCK_STREAM, AI_NUMERICHOST | AI_NUMERICSERV, [&](const addrinfo& ai) {
            const int fd = ::socket(ai.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0) return true;
            const int rc = ::connect(fd, ai.ai_addr, ai.ai_addrlen);
            if (rc == 0 || errno == ECONNREFUSED) {
              ::close(fd);  // answered at once
            } else if (errno == EINPROGRESS) {
              attempts.push_back({static_cast<int>(r), fd});
            } else {
              ::close(fd);
              silent.push_back(static_cast<int>(r));  // no route to it
            }
            return true;
          });
      if (tried) break;  // one address per peer
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<pollfd> fds;
  for (const Attempt& a : attempts) fds.push_back({a.fd, POLLOUT, 0});
  size_t open = fds.size();
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) break;
    for (pollfd& p : fds) {
      if (p.fd >= 0 && p.revents != 0) {  // connected, refused or reset: an answer
        p.fd = -p.fd - 1;
        --open;
      }
    }
  }
  for (size_t i = 0; i < attempts.size(); ++i) {
    if (fds[i].fd >= 0) silent.push_back(attempts[i].rank);
    ::close(attempts[i].fd);
  }
  std::sort(silent.begin(), silent.end());
  return silent;
}

}  // namespace

std::string silent_peers_note(const std::vector<std::vector<std::string>>& addresses) {
  const std::vector<int> silent = silent_peers(addresses, std::chrono::seconds(1));
  if (silent.empty()) return "";
  std::vector<std::pair<std::string, std::vector<int>>> by_host;
  for (int r : silent) {
    const std::string& a = addresses[r].front();
    const std::string host = a.substr(1, a.find("]:") - 1);
    auto it = std::find_if(by_host.begin(), by_host.end(),
                           [&](const auto& h) { return h.first == host; });
    if (it == by_host.end()) it = by_host.insert(by_host.end(), {host, {}});
    it->second.push_back(r);
  }
  std::string note = "; unreachable:";
  for (size_t h = 0; h < by_host.size(); ++h) {
    const auto& ranks = by_host[h].second;
    note += str_cat(h == 0 ? " " : ", ", ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < ranks.size(); ++i) note += str_cat(i == 0 ? "" : ", ", ranks[i]);
    note += str_cat(" on host ", by_host[h].first);
  }
  return note +
         " (no answer to a connection attempt within 1s: that host or the network to "
         "it is down)";
}

std::string store_host(const std::shared_ptr<store::Store>& store) {
  std::shared_ptr<store::Store> s = store;
  if (const auto* prefix = dynamic_cast<const store::PrefixStore*>(s.get())) {
    s = prefix->underlying_non_prefix_store();
  }
  const auto* tcp = dynamic_cast<const store::TCPStore*>(s.get());
  return tcp != nullptr ? tcp->host() : "";
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(separator, start);
    if (end == std::string::npos) end = text.size();
    if (end > start) parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

std::string tcp_address_text(std::string text) {
  if (size_t cut = text.find('$'); cut != std::string::npos) text.resize(cut);
  return text.find("]:") != std::string::npos ? text : std::string();
}

std::vector<std::string> advertised_addresses(const store::Bytes& record, int rank, int size) {
  std::vector<std::string> by_peer(size);
  if (size < 2 || record.empty() || record.size() % (size - 1) != 0) return by_peer;
  const size_t width = record.size() / (size - 1);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const auto first = record.begin() + (p < rank ? p : p - 1) * width;
    try {
      by_peer[p] = tcp_address_text(
          ::gloo::transport::tcp::Address(std::vector<char>(first, first + width)).str());
    } catch (const std::exception&) {
      // Another transport's record: peers are named by the pairs' current addresses alone.
    }
  }
  return by_peer;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Devices

using detail::address_towards;
using detail::hostname_is_bindable;
using detail::resolves_to_loopback;
using detail::split;

DevicePtr GlooBackend::create_device_for_hostname(const std::string& hostname) {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw core::DistNetworkError(
        str_cat("Gloo: cannot create a TCP device for host '", hostname, "': ", e.what()));
  }
}

DevicePtr GlooBackend::create_device_for_interface(const std::string& ifname) {
  ::gloo::transport::tcp::attr attr;
  attr.iface = ifname;
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw core::DistNetworkError(
        str_cat("Gloo: cannot create a TCP device for interface '", ifname, "': ", e.what()));
  }
}

DevicePtr GlooBackend::create_default_device(const std::string& peer_host) {
  return create_default_devices(peer_host).front();
}

std::vector<DevicePtr> GlooBackend::create_default_devices(const std::string& peer_host) {
  std::vector<DevicePtr> devices;
  if (core::env_is_set(core::kEnvGlooSocketIfname)) {
    for (const auto& ifname : split(core::env_string(core::kEnvGlooSocketIfname), ',')) {
      devices.push_back(create_device_for_interface(ifname));
    }
    if (!devices.empty()) return devices;
  }
  char host[256] = {};
  const bool named = ::gethostname(host, sizeof(host) - 1) == 0 && hostname_is_bindable(host);
  // Ranks on other hosts cannot reach a loopback address: with a peer elsewhere, listen where
  // the route to it leaves this host.
  if ((!named || resolves_to_loopback(host)) && !peer_host.empty() &&
      !resolves_to_loopback(peer_host)) {
    const std::string local = address_towards(peer_host);
    if (!local.empty() && !resolves_to_loopback(local)) {
      devices.push_back(create_device_for_hostname(local));
      return devices;
    }
  }
  devices.push_back(create_device_for_hostname(named ? host : "127.0.0.1"));
  return devices;
}

}  // namespace c10d::backends::gloo
