#include "c10d/core/env.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include "c10d/core/exception.h"

namespace c10d::core {
namespace {

std::string upper(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return out;
}

DebugLevel parse_debug_level(const std::string& text) {
  const std::string value = upper(text);
  if (value.empty() || value == "OFF") return DebugLevel::kOff;
  if (value == "INFO") return DebugLevel::kInfo;
  if (value == "DETAIL") return DebugLevel::kDetail;
  throw InvalidArgument("The value of " + std::string(kEnvDebug.name) +
                        " must be one of OFF, INFO, DETAIL; got '" + text + "'");
}

// c10d's names, and torch's (TORCH_CPP_LOG_LEVEL: FATAL, and 0-3 for INFO to FATAL).
LogLevel parse_log_level(const std::string& text) {
  const std::string value = upper(text);
  if (value == "DEBUG") return LogLevel::kDebug;
  if (value == "INFO" || value == "0") return LogLevel::kInfo;
  if (value == "ERROR" || value == "FATAL" || value == "2" || value == "3") return LogLevel::kError;
  return LogLevel::kWarning;
}

std::atomic<int> g_debug_level{-1};  // -1: not read from the environment yet
std::atomic<int> g_log_level{-1};
std::atomic<int> g_log_rank{-1};

}  // namespace

const std::vector<EnvVar>& env_registry() {
#define C10D_LIST_ENV(id, name, def, doc) id,
  static const std::vector<EnvVar> registry = {C10D_ENV_VARS(C10D_LIST_ENV)};
#undef C10D_LIST_ENV
  return registry;
}

bool env_is_set(const EnvVar& var) {
  const char* value = std::getenv(var.name);
  return value != nullptr && value[0] != '\0';
}

std::string env_string(const EnvVar& var) {
  const char* value = std::getenv(var.name);
  return (value != nullptr && value[0] != '\0') ? std::string(value) : var.default_value;
}

int64_t env_int(const EnvVar& var) {
  const std::string text = env_string(var);
  int64_t result = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), result);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    throw InvalidArgument("Environment variable " + std::string(var.name) + "='" + text +
                          "' is not an integer");
  }
  return result;
}

bool env_bool(const EnvVar& var) {
  const std::string value = upper(env_string(var));
  if (value == "1" || value == "TRUE" || value == "YES" || value == "ON") return true;
  if (value.empty() || value == "0" || value == "FALSE" || value == "NO" || value == "OFF") {
    return false;
  }
  throw InvalidArgument("Environment variable " + std::string(var.name) + "='" + value +
                        "' is not a boolean (1/0, true/false, yes/no, on/off)");
}

DebugLevel debug_level() {
  int level = g_debug_level.load(std::memory_order_relaxed);
  if (level < 0) {
    // First use: take the environment's value, falling back to OFF if it is malformed (the
    // explicit set_debug_level_from_env() is the call that reports bad values).
    DebugLevel parsed = DebugLevel::kOff;
    try {
      parsed = parse_debug_level(env_string(kEnvDebug));
    } catch (const InvalidArgument&) {
    }
    int expected = -1;
    g_debug_level.compare_exchange_strong(expected, static_cast<int>(parsed));
    level = g_debug_level.load(std::memory_order_relaxed);
  }
  return static_cast<DebugLevel>(level);
}

void set_debug_level(DebugLevel level) {
  g_debug_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void set_debug_level_from_env() { set_debug_level(parse_debug_level(env_string(kEnvDebug))); }

std::string_view debug_level_name(DebugLevel level) {
  switch (level) {
    case DebugLevel::kOff:
      return "OFF";
    case DebugLevel::kInfo:
      return "INFO";
    case DebugLevel::kDetail:
      return "DETAIL";
  }
  return "OFF";
}

bool log_enabled(LogLevel level) {
  int threshold = g_log_level.load(std::memory_order_relaxed);
  if (threshold < 0) {
    // C10D_LOG_LEVEL, else the level torch users set.
    const EnvVar& source = env_is_set(kEnvLogLevel) || !env_is_set(kEnvTorchCppLogLevel)
                               ? kEnvLogLevel
                               : kEnvTorchCppLogLevel;
    threshold = static_cast<int>(parse_log_level(env_string(source)));
    g_log_level.store(threshold, std::memory_order_relaxed);
  }
  // INFO messages also appear when the distributed debug level asks for them.
  if (level == LogLevel::kInfo && debug_level() != DebugLevel::kOff) return true;
  return static_cast<int>(level) >= threshold;
}

void set_log_rank(int rank) { g_log_rank.store(rank < 0 ? -1 : rank, std::memory_order_relaxed); }

void log(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  static constexpr const char* kNames[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  const int rank = g_log_rank.load(std::memory_order_relaxed);
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::cerr << "[c10d ";
  if (rank >= 0) std::cerr << "rank " << rank << ' ';
  std::cerr << kNames[static_cast<int>(level)] << "] " << message << std::endl;
}

}  // namespace c10d::core
