#include "c10d/backends/shm/shared_writer.h"

#include <sched.h>

#include <algorithm>
#include <bit>

#include "c10d/backends/shm/futex.h"
#include "c10d/backends/shm/tuning.h"
#include "c10d/core/clock.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"

namespace c10d::backends::shm::detail {

using core::now_ns;
using core::OpType;
using core::detail::str_cat;

SharedWriter::SharedWriter(bool may_adapt, bool leader, bool choose_chunks)
    : leader_(leader), choose_chunks_(choose_chunks) {
  found_.fill(-1);
  probes_.fill(ModeProbe(probe_config()));
  if (core::env_string(core::kEnvShmStream) == "auto") {
    adaptive_ = may_adapt;
  } else {
    streaming_ = core::env_bool(core::kEnvShmStream);
  }
}

void SharedWriter::select(size_t bytes, int agreed) {
  proposal_ = agreed;
  if (!adaptive_) return;
  probe_ = nullptr;
  const bool pipelined = bytes > kPipelineChunk && type_ == OpType::kAllreduce;
  streaming_ = pipelined && (agreed & kModeStreaming) != 0;
  if (bytes < kProbedBytes) return;  // streaming would not change them (core::stream_bytes)
  if (pipelined && !leader_) return;
  const size_t size_class = std::min<size_t>(
      kSizeClasses - 1, (std::bit_width(bytes) - std::bit_width(kProbedBytes)) / 2);
  const size_t type = std::min(static_cast<size_t>(type_), kTypes - 1);
  ModeProbe& probe = probes_[type * kSizeClasses + size_class];
  const int modes = pipelined && choose_chunks_ ? 4 : 2;
  if (probe.modes() < modes) probe = ModeProbe(probe_config(), modes);
  // A kind not probed yet starts with the mode the ranks run now (pipelined), or else with
  // the stores this type's last probe found best at another size (or any type's, for the
  // first), as that depends mostly on the placement.
  if (probe.untried()) {
    const int found = found_[type] >= 0 ? found_[type] : found_any_;
    const int stores = found > 0 ? kModeStreaming : 0;
    probe.adopt(!pipelined  ? stores
                : found < 0 ? agreed & (modes - 1)
                            : (agreed & (modes - 1) & ~kModeStreaming) | stores);
  }
  probe_ = &probe;
  bytes_ = bytes;
  const int mode = probe.mode();
  if (pipelined) {
    proposal_ = mode;
    ran_ = agreed & (modes - 1);
  } else {
    streaming_ = (mode & kModeStreaming) != 0;
    ran_ = mode & kModeStreaming;
  }
  timed_ = probe.wants_time();
  if (timed_) start_ = now_ns();
}

void SharedWriter::placement_changed(bool far) {
  if (!adaptive_) return;
  found_.fill(-1);
  found_any_ = far ? 1 : 0;
  for (ModeProbe& probe : probes_) {
    probe.hold((probe.held() & ~kModeStreaming) | (far ? kModeStreaming : 0));
  }
}

void SharedWriter::end_op() {
  if (probe_ == nullptr || written_ < kProbedBytes) return;
  if (!timed_) return probe_->skip();
  const int64_t now = now_ns();
  const double cost = static_cast<double>(now - start_) / static_cast<double>(written_);
  if (probe_->record(cost, now, bytes_, ran_, now - start_)) {  // a probe ended
    found_[std::min(static_cast<size_t>(type_), kTypes - 1)] = probe_->mode() & 1;
    if (!one_sided(type_)) found_any_ = probe_->mode() & 1;
    if (core::log_enabled(core::LogLevel::kDebug)) {
      core::log(core::LogLevel::kDebug,
                str_cat("shm store probe: ", core::op_type_name(type_), " of ", bytes_,
                        " bytes keeps mode ", probe_->mode(), " (bit 0 streaming, bit 1 ",
                        "large chunks) on cpu ", ::sched_getcpu()));
    }
  }
}

ModeProbe::Config SharedWriter::probe_config() {
  ModeProbe::Config config;
  config.first_hold_ns = 200'000'000;
  return config;
}

}  // namespace c10d::backends::shm::detail
