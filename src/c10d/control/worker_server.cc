#include "c10d/control/worker_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "c10d/control/handlers.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"

namespace c10d::control {
namespace {

using core::detail::str_cat;

// Handlers may be slow (stack dumps, trace dumps); a few threads keep the server answering
// while one runs without costing every rank a thread per core.
constexpr size_t kHandlerThreads = 4;

class HttpRequest : public Request {
 public:
  HttpRequest(const httplib::Request& request, std::shared_ptr<store::Store> store)
      : request_(request), store_(std::move(store)) {}
  std::string body() const override { return request_.body; }
  std::map<std::string, std::string> params() const override {
    // std::map::insert keeps the first value of a repeated name.
    std::map<std::string, std::string> out;
    for (const auto& [name, value] : request_.params) out.insert({name, value});
    return out;
  }
  std::shared_ptr<store::Store> store() const override { return store_; }

 private:
  const httplib::Request& request_;
  std::shared_ptr<store::Store> store_;
};

class HttpResponse : public Response {
 public:
  explicit HttpResponse(httplib::Response& response) : response_(response) {
    response_.status = 200;
    response_.set_content("", "text/plain");
  }
  void set_content(std::string content, const std::string& content_type) override {
    response_.set_content(std::move(content), content_type);
  }
  void set_status(int status) override { response_.status = status; }

 private:
  httplib::Response& response_;
};

// Compares without an early exit so the time taken does not reveal the matching prefix.
bool same_secret(const std::string& given, const std::string& expected) {
  const size_t n = std::max(given.size(), expected.size());
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const char a = i < given.size() ? given[i] : '\0';
    const char b = i < expected.size() ? expected[i] : '\0';
    diff |= static_cast<unsigned char>(a ^ b);
  }
  return diff == 0;
}

void reply(httplib::Response& response, int status, const std::string& text) {
  response.status = status;
  response.set_content(text + "\n", "text/plain");
}

// Removes a leftover socket from an earlier server at `path`; refuses to touch anything else.
void remove_stale_socket(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  C10D_CHECK_T(core::DistNetworkError, S_ISSOCK(st.st_mode), "WorkerServer: '", path,
               "' exists and is not a unix socket; refusing to replace it");
  ::unlink(path.c_str());
}

}  // namespace

struct WorkerServer::Impl {
  httplib::Server server;
};

WorkerServer::WorkerServer(const std::string& host_or_file, int port)
    : WorkerServer(WorkerServerOptions{host_or_file, port, nullptr, std::nullopt}) {}

WorkerServer::WorkerServer(WorkerServerOptions options)
    : impl_(std::make_unique<Impl>()), store_(options.store) {
  secret_ = options.secret ? *options.secret : core::env_string(core::kEnvControlSecret);
  C10D_CHECK_ARG(options.port >= -1 && options.port <= 65535, "WorkerServer: port ", options.port,
                 " is invalid (use -1 for a unix socket, 0 for any free port)");
  // httplib's default also sets SO_REUSEPORT, which would let a second server (or another
  // process of this user) bind the same port silently; only SO_REUSEADDR is wanted.
  impl_->server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  impl_->server.new_task_queue = [] {
    return new httplib::ThreadPool(kHandlerThreads);
  };
  install_routes();
  bind(options);
  thread_ = std::thread([this] {
    impl_->server.listen_after_bind();
    loop_exited_.store(true);
  });
  // stop() is a no-op until the loop runs, so shutdown() must not race ahead of it.
  while (!impl_->server.is_running() && !loop_exited_.load()) std::this_thread::yield();
}

WorkerServer::~WorkerServer() { shutdown(); }

void WorkerServer::bind(const WorkerServerOptions& options) {
  auto& server = impl_->server;
  if (options.port == -1) {
    socket_path_ = options.host_or_file;
    C10D_CHECK_ARG(!socket_path_.empty(), "WorkerServer: empty unix socket path");
    C10D_CHECK_ARG(socket_path_.size() < sizeof(sockaddr_un::sun_path), "WorkerServer: unix ",
                   "socket path '", socket_path_, "' is longer than ",
                   sizeof(sockaddr_un::sun_path) - 1, " bytes");
    remove_stale_socket(socket_path_);
    server.set_address_family(AF_UNIX);
    // httplib ignores the port of a unix socket.
    if (!server.bind_to_port(socket_path_, 80)) {
      int err = errno;
      throw core::DistNetworkError(str_cat("WorkerServer: cannot listen on unix socket '",
                                           socket_path_, "': ", std::strerror(err)));
    }
    // Only this user may connect. The socket is listening already, but connecting needs
    // write permission, which the usual umask withholds from other users until this chmod.
    if (::chmod(socket_path_.c_str(), 0600) != 0) {
      int err = errno;
      ::unlink(socket_path_.c_str());
      throw core::DistNetworkError(str_cat("WorkerServer: cannot chmod 0600 unix socket '",
                                           socket_path_, "': ", std::strerror(err)));
    }
    return;
  }
  host_ = options.host_or_file.empty() ? "0.0.0.0" : options.host_or_file;
  bool ok;
  if (options.port == 0) {
    port_ = server.bind_to_any_port(host_);
    ok = port_ > 0;
  } else {
    port_ = options.port;
    ok = server.bind_to_port(host_, port_);
  }
  if (!ok) {
    int err = errno;
    throw core::DistNetworkError(str_cat("WorkerServer: cannot listen on (", host_, ", ",
                                         options.port, "): ", std::strerror(err)));
  }
}

void WorkerServer::install_routes() {
  auto& server = impl_->server;
  server.set_pre_routing_handler(
      [this](const httplib::Request& request, httplib::Response& response) {
        if (secret_.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string expected = "Bearer " + secret_;
        if (same_secret(request.get_header_value("Authorization"), expected)) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        response.set_header("WWW-Authenticate", "Bearer");
        reply(response, 401,
              request.has_header("Authorization")
                  ? "c10d worker server: wrong secret in the Authorization header"
                  : "c10d worker server: authentication required; send the header "
                    "'Authorization: Bearer <secret>' with the secret from C10D_CONTROL_SECRET");
        return httplib::Server::HandlerResponse::Handled;
      });

  // An index page at the root, as torch's WorkerServer serves.
  server.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(
        "<h1>c10d worker server</h1>\n<a href=\"/handler/\">Handler names</a> (POST "
        "/handler/&lt;name&gt; to call one)\n",
        "text/html");
  });

  server.Get("/handler/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(nlohmann::json(get_handler_names()).dump(), "application/json");
  });

  server.Post(R"(/handler/([^/]+))", [this](const httplib::Request& request,
                                            httplib::Response& response) {
    const std::string name = request.matches[1];
    HandlerFunc handler = find_handler(name);
    if (!handler) {
      std::string names;
      for (const auto& n : get_handler_names()) names += (names.empty() ? "" : ", ") + n;
      reply(
          response, 404,
          str_cat("c10d worker server: no handler named '", name, "'; registered: [", names, "]"));
      return;
    }
    HttpRequest req(request, store_);
    HttpResponse res(response);
    try {
      handler(req, res);
    } catch (const std::exception& e) {
      reply(response, 500, str_cat("handler '", name, "' failed: ", e.what()));
    } catch (...) {
      reply(response, 500, str_cat("handler '", name, "' failed with a non-standard exception"));
    }
  });

  server.set_error_handler([](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;  // a route already explained itself
    if (response.status == 404) {
      reply(response, 404,
            str_cat("c10d worker server: no route for ", request.method, " ", request.path,
                    "; use GET /handler/ or POST /handler/<name>"));
    }
  });
}

void WorkerServer::shutdown() {
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  if (stopped_) return;
  stopped_ = true;
  impl_->server.stop();
  if (thread_.joinable()) thread_.join();
  if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
}

std::string WorkerServer::address() const {
  if (!socket_path_.empty()) return "unix:" + socket_path_;
  return str_cat(host_, ":", port_);
}

}  // namespace c10d::control
