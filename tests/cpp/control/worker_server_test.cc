// WorkerServer over a unix socket and TCP: listing, built-in and registered handlers, errors,
// authentication and the socket's permissions.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "c10d/control/handlers.h"
#include "c10d/control/worker_server.h"
#include "c10d/core/exception.h"
#include "c10d/store/hash_store.h"

namespace c10d::control {
namespace {

std::string socket_path() {
  static std::atomic<int> counter{0};
  return (std::filesystem::temp_directory_path() /
          ("c10d_ws_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".sock"))
      .string();
}

std::unique_ptr<httplib::Client> client_for(const WorkerServer& server) {
  std::unique_ptr<httplib::Client> client;
  if (server.port() == -1) {
    client = std::make_unique<httplib::Client>(server.socket_path());
    client->set_address_family(AF_UNIX);
  } else {
    client = std::make_unique<httplib::Client>("127.0.0.1", server.port());
  }
  client->set_connection_timeout(5);
  client->set_read_timeout(5);
  return client;
}

void register_test_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_handler("test_echo", [](const Request& request, Response& response) {
      response.set_content(request.body() + "|" + request.get_param("x"), "text/plain");
    });
    register_handler("test_throw", [](const Request&, Response&) {
      throw std::runtime_error("deliberate failure");
    });
    register_handler("test_status", [](const Request&, Response& response) {
      response.set_status(418);
      response.set_content("teapot", "text/plain");
    });
  });
}

class WorkerServerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { register_test_handlers(); }
  std::unique_ptr<WorkerServer> start(WorkerServerOptions options = {}) {
    if (GetParam()) {
      options.host_or_file = socket_path();
      options.port = -1;
    } else {
      options.host_or_file = "127.0.0.1";
      options.port = 0;
    }
    if (!options.secret) options.secret = "";
    return std::make_unique<WorkerServer>(std::move(options));
  }
};

TEST_P(WorkerServerTest, ListsHandlers) {
  auto server = start();
  auto res = client_for(*server)->Get("/handler/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  for (const char* name : {"\"ping\"", "\"store_keys\"", "\"dump_trace_json\"", "\"test_echo\""}) {
    EXPECT_NE(res->body.find(name), std::string::npos) << res->body;
  }
}

TEST_P(WorkerServerTest, IndexPageLinksTheHandlerList) {
  auto server = start();
  auto res = client_for(*server)->Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("href=\"/handler/\""), std::string::npos) << res->body;
}

TEST_P(WorkerServerTest, PingAndParams) {
  auto server = start();
  auto client = client_for(*server);
  auto res = client->Post("/handler/ping", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "pong");
  res = client->Post("/handler/test_echo?x=42&x=43", "body", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "body|42");
  res = client->Post("/handler/test_status", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 418);
  EXPECT_EQ(res->body, "teapot");
}

TEST_P(WorkerServerTest, UnknownHandlerIs404) {
  auto server = start();
  auto res = client_for(*server)->Post("/handler/nope", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_NE(res->body.find("no handler named 'nope'"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("ping"), std::string::npos) << res->body;
}

TEST_P(WorkerServerTest, ThrowingHandlerIs500WithMessage) {
  auto server = start();
  auto res = client_for(*server)->Post("/handler/test_throw", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  EXPECT_NE(res->body.find("deliberate failure"), std::string::npos) << res->body;
}

TEST_P(WorkerServerTest, SharedSecret) {
  WorkerServerOptions options;
  options.secret = "s3cret";
  auto server = start(options);
  auto client = client_for(*server);
  auto res = client->Post("/handler/ping", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_NE(res->body.find("Authorization: Bearer"), std::string::npos) << res->body;
  res = client->Get("/handler/", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_NE(res->body.find("wrong secret"), std::string::npos) << res->body;
  res = client->Post("/handler/ping", {{"Authorization", "Bearer s3cret"}}, "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "pong");
}

TEST_P(WorkerServerTest, StoreKeys) {
  auto without = start();
  auto res = client_for(*without)->Post("/handler/store_keys", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("without a store"), std::string::npos) << res->body;

  WorkerServerOptions options;
  options.store = std::make_shared<store::HashStore>();
  options.store->set("b", store::to_bytes("1"));
  options.store->set("a", store::to_bytes("2"));
  auto with = start(options);
  res = client_for(*with)->Post("/handler/store_keys", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, R"(["a","b"])");
}

TEST_P(WorkerServerTest, TraceJsonProvider) {
  auto server = start();
  auto client = client_for(*server);
  auto res = client->Post("/handler/dump_trace_json", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_NE(res->body.find("flight recorder not enabled"), std::string::npos);
  set_trace_json_provider([](const std::map<std::string, std::string>& params) {
    auto it = params.find("onlyActive");
    return std::string(R"({"onlyActive":")") + (it == params.end() ? "" : it->second) + "\"}";
  });
  res = client->Post("/handler/dump_trace_json?onlyActive=true", "", "text/plain");
  set_trace_json_provider(nullptr);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, R"({"onlyActive":"true"})");
}

TEST_P(WorkerServerTest, ShutdownIsIdempotentAndStopsServing) {
  auto server = start();
  auto client = client_for(*server);
  server->shutdown();
  server->shutdown();
  EXPECT_FALSE(client->Post("/handler/ping", "", "text/plain"));
}

INSTANTIATE_TEST_SUITE_P(Transports, WorkerServerTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Unix" : "Tcp"; });

TEST(WorkerServerUnix, SocketIsPrivateAndRemovedOnShutdown) {
  std::string path = socket_path();
  ::umask(0);  // the server must not depend on the umask
  WorkerServer server(path);
  ::umask(022);
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(server.address(), "unix:" + path);
  server.shutdown();
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

TEST(WorkerServerUnix, ReplacesStaleSocketButNotOtherFiles) {
  std::string path = socket_path();
  {
    // A socket file left behind by a server that died: bound, then closed without unlink.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
    WorkerServer server(path);
    EXPECT_TRUE(client_for(server)->Post("/handler/ping", "", "text/plain"));
  }
  { std::ofstream(path) << "data"; }
  EXPECT_THROW(WorkerServer{path}, core::DistNetworkError);
  std::filesystem::remove(path);
}

TEST(WorkerServerTcp, PortZeroPicksAFreePortAndEnvSecretApplies) {
  ::setenv("C10D_CONTROL_SECRET", "from-env", 1);
  WorkerServer server("127.0.0.1", 0);
  ::unsetenv("C10D_CONTROL_SECRET");
  EXPECT_GT(server.port(), 0);
  EXPECT_TRUE(server.requires_auth());
  EXPECT_EQ(server.address(), "127.0.0.1:" + std::to_string(server.port()));
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Post("/handler/ping", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  res = client.Post("/handler/ping", {{"Authorization", "Bearer from-env"}}, "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(WorkerServerTcp, BusyPortFailsWithAddress) {
  WorkerServer first("127.0.0.1", 0);
  try {
    WorkerServer second("127.0.0.1", first.port());
    FAIL() << "binding a busy port must throw";
  } catch (const core::DistNetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1, " + std::to_string(first.port())),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace c10d::control
