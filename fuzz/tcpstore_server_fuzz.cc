// libFuzzer target: arbitrary bytes sent to a live TCPStore server over loopback, after a
// valid handshake (or not). The server must survive every input and keep serving a
// well-behaved client.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "c10d/store/tcp_server.h"
#include "c10d/store/wire.h"

namespace {

c10d::store::TCPServer& server() {
  static auto* instance = [] {
    c10d::store::TCPServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    return new c10d::store::TCPServer(options);
  }();
  return *instance;
}

int connect_to_server() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server().port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) std::abort();
  return fd;
}

// Reads whatever the server answers until it closes or goes quiet for `ms`.
void drain(int fd, int ms) {
  char buffer[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return;
    if (::recv(fd, buffer, sizeof buffer, 0) <= 0) return;
  }
}

// The server still answers PING on a fresh connection.
void check_alive() {
  int fd = connect_to_server();
  c10d::store::wire::Encoder hello;
  hello.query(c10d::store::wire::QueryType::kValidate).u32(c10d::store::wire::kValidationMagic);
  hello.query(c10d::store::wire::QueryType::kPing).u32(4242);
  const auto& bytes = hello.buffer();
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    std::abort();
  }
  uint32_t echo = 0;
  pollfd p{fd, POLLIN, 0};
  // Generous: under AddressSanitizer an 8 MiB value takes a while to copy.
  if (::poll(&p, 1, 30000) <= 0 || ::recv(fd, &echo, sizeof echo, MSG_WAITALL) != sizeof echo ||
      echo != 4242) {
    std::abort();  // the server stopped serving
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = connect_to_server();
  // Half the inputs start with a valid handshake, so the fuzzer reaches the query handlers.
  if (size > 0 && (data[0] & 1)) {
    c10d::store::wire::Encoder hello;
    hello.query(c10d::store::wire::QueryType::kValidate).u32(c10d::store::wire::kValidationMagic);
    const auto& bytes = hello.buffer();
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ++data;
    --size;
  }
  if (size > 0) ::send(fd, data, size, MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  drain(fd, 20);
  ::close(fd);
  static int runs = 0;
  if (++runs % 64 == 0) check_alive();
  return 0;
}
