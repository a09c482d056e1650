#include "c10d/control/handlers.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "c10d/core/exception.h"

namespace c10d::control {
namespace {

using core::detail::str_cat;

void ping(const Request&, Response& response);
void dump_trace_json(const Request& request, Response& response);
void store_keys(const Request& request, Response& response);

// Never destroyed: handlers registered from Python hold Python objects, which must not be
// released by static destructors after the interpreter has finalised.
struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, HandlerFunc> handlers;  // guarded by mutex
  TraceJsonProvider trace_provider;                       // guarded by mutex
};

Registry& registry() {
  static Registry* instance = [] {
    auto* r = new Registry;
    // dump_traceback is registered by the Python package, which can see Python's threads.
    r->handlers.emplace("ping", ping);
    r->handlers.emplace("dump_trace_json", dump_trace_json);
    r->handlers.emplace("store_keys", store_keys);
    return r;
  }();
  return *instance;
}

void ping(const Request&, Response& response) { response.set_content("pong", "text/plain"); }

void dump_trace_json(const Request& request, Response& response) {
  TraceJsonProvider provider;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    provider = r.trace_provider;
  }
  if (!provider) {
    response.set_status(503);
    response.set_content("flight recorder not enabled", "text/plain");
    return;
  }
  response.set_content(provider(request.params()), "application/json");
}

void store_keys(const Request& request, Response& response) {
  auto store = request.store();
  if (!store) {
    response.set_status(400);
    response.set_content("store_keys: this worker server was started without a store",
                         "text/plain");
    return;
  }
  auto keys = store->list_keys();
  std::sort(keys.begin(), keys.end());
  response.set_content(nlohmann::json(keys).dump(), "application/json");
}

}  // namespace

std::string Request::get_param(const std::string& name) const {
  auto all = params();
  auto it = all.find(name);
  return it == all.end() ? std::string() : it->second;
}

void register_handler(const std::string& name, HandlerFunc handler) {
  C10D_CHECK_ARG(!name.empty(), "register_handler: the handler name must not be empty");
  C10D_CHECK_ARG(name.find('/') == std::string::npos, "register_handler: handler name '", name,
                 "' must not contain '/'");
  C10D_CHECK_ARG(static_cast<bool>(handler), "register_handler: handler '", name, "' is empty");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  C10D_CHECK_ARG(r.handlers.emplace(name, std::move(handler)).second,
                 "register_handler: a "
                 "handler named '",
                 name, "' is already registered");
}

HandlerFunc find_handler(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.handlers.find(name);
  return it == r.handlers.end() ? HandlerFunc() : it->second;
}

HandlerFunc get_handler(const std::string& name) {
  HandlerFunc handler = find_handler(name);
  if (!handler) {
    std::string names;
    for (const auto& n : get_handler_names()) names += (names.empty() ? "" : ", ") + n;
    throw core::InvalidArgument(
        str_cat("no control-plane handler named '", name, "'; registered: [", names, "]"));
  }
  return handler;
}

std::vector<std::string> get_handler_names() {
  Registry& r = registry();
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    names.reserve(r.handlers.size());
    for (const auto& [name, _] : r.handlers) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void set_trace_json_provider(TraceJsonProvider provider) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.trace_provider = std::move(provider);
}

}  // namespace c10d::control
