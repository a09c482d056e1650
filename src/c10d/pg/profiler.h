// torch's profiler, seen from c10d. In a process that loaded torch and profiles (torch.profiler,
// torch.autograd.profiler.profile), every operation a ProcessGroup dispatches becomes an event
// named "<backend>:<operation>" ("gloo:all_reduce") with its tensors' shapes, opened when the
// operation starts and closed when its Work completes, as torch's own backends record theirs.
// c10d does not link torch: the Python bindings hand over torch's "is this thread profiling"
// function and a callback that opens an event (c10d/_profiling.py).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "c10d/core/work.h"
#include "c10d/pg/flight_recorder.h"

namespace c10d::pg {

struct ProfilerBridge {
  bool (*recording)() = nullptr;  // whether the calling thread profiles
  // Opens an event for an operation with these input shapes; returns what closes it (called
  // once, from any thread), or an empty function when no event was opened.
  std::function<std::function<void()>(const std::string& name,
                                      const std::vector<std::vector<int64_t>>& shapes)>
      open;
};

// Installs the bridge (replacing an earlier one, which stays valid: events it opened close).
void set_profiler_bridge(ProfilerBridge bridge);

// The bridge when the calling thread profiles, else null: one atomic load when no bridge is
// installed, and torch's check when one is (no lock, no allocation: the inline path asks).
const ProfilerBridge* profiling();

// Opens the event of an operation of `op` on backend `backend` with the shapes of `inputs`
// (complex tensors as torch's frontend hands them to its backends: real views with a last
// dimension of 2) and returns what closes it.
std::function<void()> open_profiler_event(const ProfilerBridge& bridge, const std::string& backend,
                                          core::OpType op, const TensorRefs& inputs);

}  // namespace c10d::pg
