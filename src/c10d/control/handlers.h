// The control plane's handlers: named functions that a WorkerServer runs for
// `POST /handler/<name>`, kept in one process-wide registry.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "c10d/store/store.h"

namespace c10d::control {

// What a handler receives. Abstract so that Python (and tests) can supply their own.
class Request {
 public:
  virtual ~Request() = default;
  // The raw request body.
  virtual std::string body() const = 0;
  // Query parameters (a repeated name keeps its first value).
  virtual std::map<std::string, std::string> params() const = 0;
  // The value of one query parameter, or "" when absent.
  std::string get_param(const std::string& name) const;
  // The store of the server that received the request, or null when it has none.
  virtual std::shared_ptr<store::Store> store() const { return nullptr; }
};

// What a handler fills in. The status defaults to 200 and the content to empty text/plain.
class Response {
 public:
  virtual ~Response() = default;
  virtual void set_content(std::string content, const std::string& content_type) = 0;
  virtual void set_status(int status) = 0;
};

// A handler reports failure either by setting a status or by throwing: the server turns an
// exception into a 500 whose body is the exception's message. Handlers run on the server's
// threads, several at a time, so they must be thread-safe.
using HandlerFunc = std::function<void(const Request&, Response&)>;

// Adds a handler. Names are unique: registering a taken name throws core::InvalidArgument.
// The registry is thread-safe.
void register_handler(const std::string& name, HandlerFunc handler);
// The handler registered under `name`; throws core::InvalidArgument listing the registered
// names when there is none.
HandlerFunc get_handler(const std::string& name);
// Like get_handler, but empty when there is none.
HandlerFunc find_handler(const std::string& name);
// Every registered name, sorted.
std::vector<std::string> get_handler_names();

// The flight recorder's JSON dump, called by the built-in handler "dump_trace_json" with the
// request's query parameters. Until a provider is set that handler answers 503. Setting an
// empty function removes the provider.
using TraceJsonProvider = std::function<std::string(const std::map<std::string, std::string>&)>;
void set_trace_json_provider(TraceJsonProvider provider);

}  // namespace c10d::control
