// MpiBackend's life cycle: MPI's world, creating a group's communicators, finalising MPI, and
// shutting a group down; the operations are in collectives.cc and p2p.cc.
#include "c10d/backends/mpi/mpi_backend.h"

#include <mpi.h>

#include <algorithm>
#include <mutex>

#include "c10d/backends/mpi/internal.h"
#include "c10d/backends/mpi/progress_thread.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"

namespace c10d::backends::mpi {

using core::detail::str_cat;
using detail::check;
using detail::ProgressThread;
using pg::Millis;

std::pair<int, int> MpiBackend::world() {
  ProgressThread& progress = ProgressThread::instance();
  return {progress.world_rank(), progress.world_size()};
}

void MpiBackend::finalize(Millis grace) {
  // Only if MPI was ever started: finalising must not start it.
  if (ProgressThread* progress = ProgressThread::started_instance().load()) {
    progress->finalize(grace);
  }
}

std::shared_ptr<MpiBackend> MpiBackend::create(std::vector<int> ranks, Millis timeout) {
  ProgressThread& progress = ProgressThread::instance();
  const int world_size = progress.world_size();
  const int world_rank = progress.world_rank();
  if (ranks.empty()) {
    for (int r = 0; r < world_size; ++r) ranks.push_back(r);
  }
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= world_size) {
    throw core::InvalidArgument(
        str_cat("MPI backend: group ranks must be distinct ranks of "
                "the MPI world (size ",
                world_size, ")"));
  }
  const auto me = std::find(ranks.begin(), ranks.end(), world_rank);
  if (me == ranks.end()) return nullptr;
  auto group = std::make_shared<Group>();
  group->rank = static_cast<int>(me - ranks.begin());
  group->size = static_cast<int>(ranks.size());
  // Members agree on the tag from the ranks alone (MPI_Comm_create_group runs among them).
  uint32_t tag = 2166136261u;
  for (int r : ranks) tag = (tag ^ static_cast<uint32_t>(r)) * 16777619u;
  const std::string what =
      str_cat("creating the communicator of world ranks [", pg::join_ranks(ranks),
              "] on world rank ", world_rank, " (every member must create it)");
  progress.call(
      [group, ranks, tag, world_size] {
        if (static_cast<int>(ranks.size()) == world_size &&
            std::is_sorted(ranks.begin(), ranks.end())) {
          check(MPI_Comm_dup(MPI_COMM_WORLD, &group->comm), "MPI_Comm_dup");
        } else {
          MPI_Group world_group, members;
          check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
          check(MPI_Group_incl(world_group, group->size, ranks.data(), &members), "MPI_Group_incl");
          check(MPI_Comm_create_group(MPI_COMM_WORLD, members, static_cast<int>(tag % 32768),
                                      &group->comm),
                "MPI_Comm_create_group");
          MPI_Group_free(&members);
          MPI_Group_free(&world_group);
        }
        check(MPI_Comm_set_errhandler(group->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
        check(MPI_Comm_dup(group->comm, &group->control), "MPI_Comm_dup");
        return 0;
      },
      timeout, what);
  return std::make_shared<MpiBackend>(group, group->rank, group->size, timeout);
}

MpiBackend::MpiBackend(std::shared_ptr<Group> group, int rank, int size, Millis timeout)
    : pg::Backend(rank, size, timeout), group_(std::move(group)) {
  queue_ = std::make_shared<pg::OpQueue>(pg::OpQueue::Config::of("mpi", "MPI", rank, size));
}

WorkPtr MpiBackend::submit(std::shared_ptr<detail::Op> op, Millis timeout, bool async) {
  const core::OpType type = op->type;
  const char* name = op->name;
  std::vector<core::Tensor> outputs = op->outputs;
  return queue_->submit(
      type, name, effective_timeout(timeout), async,
      [op = std::move(op)](const pg::QueuedOp& queued) {
        ProgressThread::instance().run(op, queued);
      },
      std::move(outputs));
}

MpiBackend::~MpiBackend() {
  shutdown();
  // The progress thread frees the communicators once nothing uses them. Not waited for: the
  // caller may hold the GIL, which that thread needs to drop the buffers of finished operations.
  std::shared_ptr<Group> group = group_;
  try {
    ProgressThread& progress = ProgressThread::instance();
    {
      std::lock_guard<std::mutex> lock(progress.mutex());
      if (group->outstanding != 0 || !group->broken.empty()) return;  // leave them to MPI
    }
    progress.later([group] {
      MPI_Comm_free(&group->control);
      MPI_Comm_free(&group->comm);
    });
  } catch (...) {
  }
}

void MpiBackend::finish_pending(Millis timeout) {
  const core::Deadline deadline(timeout);
  queue_->finish_pending(timeout);
  // Then the sends and receives, which are not on the queue.
  ProgressThread& progress = ProgressThread::instance();
  std::unique_lock<std::mutex> lock(progress.mutex());
  auto drained = [&] {
    return group_->outstanding == 0;
  };
  if (timeout <= Millis::zero()) return progress.settled().wait(lock, drained);
  if (progress.settled().wait_for(lock, deadline.remaining(), drained)) return;
  core::log(core::LogLevel::kWarning,
            str_cat("MPI rank ", rank(), " of ", size(), ": ", group_->outstanding,
                    " operation(s) did not finish within ", core::format_timeout(timeout),
                    " while the backend shut down"));
}

void MpiBackend::shutdown() {
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mutex_);
  if (!queue_->stop()) return;
  try {
    ProgressThread& progress = ProgressThread::instance();
    std::lock_guard<std::mutex> lock(progress.mutex());
    group_->shut_down = true;
  } catch (...) {
  }
  // A collective already posted cannot be withdrawn from MPI: it ends at its deadline on the
  // progress thread, and its caller is let go after a short grace ("shut down while it ran").
  queue_->join(std::chrono::milliseconds(100));
}

}  // namespace c10d::backends::mpi
