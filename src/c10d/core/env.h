// The one registry of environment variables c10d reads, and the debug level.
// Every variable is declared once here, with its default and a line of documentation; code
// reads it through env_string/env_int/env_bool, never through a bare getenv.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace c10d::core {

struct EnvVar {
  const char* name;
  const char* default_value;
  const char* doc;
};

// X(identifier, "NAME", "default", "documentation")
#define C10D_ENV_VARS(X)                                                                       \
  X(kEnvDebug, "TORCH_DISTRIBUTED_DEBUG", "OFF",                                               \
    "Debug level: OFF, INFO (log collectives and init) or DETAIL (also check collectives "     \
    "match across ranks).")                                                                    \
  X(kEnvMasterAddr, "MASTER_ADDR", "", "Host of the rank-0 TCPStore for env:// rendezvous.")   \
  X(kEnvMasterPort, "MASTER_PORT", "", "Port of the rank-0 TCPStore for env:// rendezvous.")   \
  X(kEnvRank, "RANK", "", "This process's global rank for env:// rendezvous.")                 \
  X(kEnvWorldSize, "WORLD_SIZE", "", "Number of processes for env:// rendezvous.")             \
  X(kEnvLocalRank, "LOCAL_RANK", "", "This process's rank on its node (set by the launcher).") \
  X(kEnvTraceBufferSize, "C10D_TRACE_BUFFER_SIZE", "2000",                                     \
    "Operations the flight recorder keeps (a ring buffer per process); 0 turns it off.")       \
  X(kEnvTraceDumpDir, "C10D_TRACE_DUMP_DIR", "/tmp",                                           \
    "Directory the flight recorder writes c10d_trace_<job>_rank<rank>.json to.")               \
  X(kEnvStoreMaxKeyBytes, "C10D_STORE_MAX_KEY_BYTES", "8192",                                  \
    "Largest key the TCPStore server accepts; longer keys drop the client.")                   \
  X(kEnvStoreMaxValueBytes, "C10D_STORE_MAX_VALUE_BYTES", "8388608",                           \
    "Largest value the TCPStore server accepts; larger values drop the client.")               \
  X(kEnvStoreMaxReplyBytes, "C10D_STORE_MAX_REPLY_BYTES", "268435456",                         \
    "Largest value the TCPStore client reads from a server; a longer one is refused as a "     \
    "protocol error (memory grows only as a value's bytes arrive).")                           \
  X(kEnvStoreSecret, "C10D_STORE_SECRET", "",                                                  \
    "Shared secret of TCPStore connections: a server with one refuses clients without it.")    \
  X(kEnvStoreUseLibuv, "USE_LIBUV", "1",                                                       \
    "Accepted for compatibility with torch; the TCPStore server always runs on libuv.")        \
  X(kEnvLogLevel, "C10D_LOG_LEVEL", "WARNING",                                                 \
    "Least severe log message printed to stderr: DEBUG, INFO, WARNING or ERROR.")              \
  X(kEnvTorchCppLogLevel, "TORCH_CPP_LOG_LEVEL", "WARNING",                                    \
    "torch's log level (INFO, WARNING, ERROR, FATAL or 0-3), used when C10D_LOG_LEVEL is not " \
    "set.")                                                                                    \
  X(kEnvControlSecret, "C10D_CONTROL_SECRET", "",                                              \
    "Shared secret of the control plane: worker servers refuse requests without the header "   \
    "'Authorization: Bearer <secret>'; empty means no authentication.")                        \
  X(kEnvGlooSocketIfname, "GLOO_SOCKET_IFNAME", "",                                            \
    "Comma-separated network interfaces the Gloo backend binds to (one device each); unset "   \
    "means the address the hostname resolves to, else loopback.")                              \
  X(kEnvGlooRing, "C10D_GLOO_RING", "1",                                                       \
    "Whether the Gloo backend runs all_reduce, reduce_scatter, all_gather, broadcast and "     \
    "barrier on c10d's own TCP ring (1) or on Gloo's algorithms and transport (0).")           \
  X(kEnvCopy, "C10D_COPY", "auto",                                                             \
    "How copies from 16 KiB run on AVX2 CPUs: vector = a 32-byte load/store loop, string = "   \
    "rep movsb, auto = whichever a timing of both finds faster here (once per process).")      \
  X(kEnvShmHostId, "C10D_SHM_HOST_ID", "",                                                     \
    "Overrides this machine's identity (hostname/boot id) in the shm backend's same-host "     \
    "check; for tests.")                                                                       \
  X(kEnvShmHeapBytes, "C10D_SHM_HEAP_BYTES", "1073741824",                                     \
    "Bytes of shared heap per rank and shm process group for shm_empty() tensors (reserved "   \
    "address space; pages are used only when touched).")                                       \
  X(kEnvShmCma, "C10D_SHM_CMA", "1",                                                           \
    "Whether the shm backend copies large messages straight between the ranks' own memory "    \
    "(process_vm_readv/writev, one copy per byte) when every rank may; 0 = always through "    \
    "the shared slots.")                                                                       \
  X(kEnvShmBind, "C10D_SHM_BIND", "auto",                                                      \
    "Whether each shm rank pins itself to one CPU when its process group starts: auto = when " \
    "the ranks outnumber the CPUs they may run on and none is pinned already, 1 = also with "  \
    "a CPU per rank, 0 = never. Rank r takes the (r mod CPUs)-th CPU of the ranks' masks.")    \
  X(kEnvShmAdoptBytes, "C10D_SHM_ADOPT_BYTES", "262144",                                       \
    "From this size, a numpy array that the shm backend all_reduces a second time moves its "  \
    "whole pages into the rank's shared heap (same addresses and contents), so later "         \
    "all_reduces on it read and write the peers' arrays in place; 0 = never.")                 \
  X(kEnvShmStream, "C10D_SHM_STREAM", "auto",                                                  \
    "How the shm backend writes large blocks into the shared slots: 1 = non-temporal stores, " \
    "0 = plain stores, auto = whichever makes whole operations faster (timed as it runs).")    \
  X(kEnvShmFarTripNs, "C10D_SHM_FAR_TRIP_NS", "250",                                           \
    "With C10D_SHM_STREAM=auto: the median cache-line round trip between ranks 0 and 1, in "   \
    "ns, from which the shm backend counts their CPUs as far apart (then streaming stores "    \
    "win) when it times one, a few times a second; 0 = always far apart.")

#define C10D_DECLARE_ENV(id, name, def, doc) inline constexpr EnvVar id{name, def, doc};
C10D_ENV_VARS(C10D_DECLARE_ENV)
#undef C10D_DECLARE_ENV

// Every registered variable, in declaration order.
const std::vector<EnvVar>& env_registry();

// The value of the variable, or its default when unset or empty.
std::string env_string(const EnvVar& var);
// Parsed as an integer; a malformed value throws InvalidArgument naming the variable.
int64_t env_int(const EnvVar& var);
// "1", "true", "yes", "on" (any case) are true; "0", "false", "no", "off", "" are false.
bool env_bool(const EnvVar& var);
// True when the variable is set to a non-empty value.
bool env_is_set(const EnvVar& var);

enum class DebugLevel : int { kOff = 0, kInfo = 1, kDetail = 2 };

DebugLevel debug_level();
void set_debug_level(DebugLevel level);
// Reads TORCH_DISTRIBUTED_DEBUG; an unknown value throws InvalidArgument listing the choices.
void set_debug_level_from_env();
std::string_view debug_level_name(DebugLevel level);

// Minimal leveled logging to stderr with a "[c10d <level>]" prefix, "[c10d rank <r> <level>]"
// once the process's global rank is known (set_log_rank; torch's _set_global_rank).
enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
void set_log_rank(int rank);  // negative: unknown
bool log_enabled(LogLevel level);
void log(LogLevel level, std::string_view message);

}  // namespace c10d::core
