// MpiBackend's sends and receives (MPI_Isend / MPI_Irecv with the user's tag) and
// monitored_barrier, which is built from such messages on the group's control communicator.
#include "c10d/backends/mpi/mpi_backend.h"

#include <mpi.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c10d/backends/mpi/datatypes.h"
#include "c10d/backends/mpi/internal.h"
#include "c10d/backends/mpi/progress_thread.h"
#include "c10d/core/exception.h"

namespace c10d::backends::mpi {

using core::DistBackendError;
using core::DistTimeoutError;
using core::OpType;
using core::Tensor;
using core::detail::str_cat;
using detail::Buffer;
using detail::bytes_of;
using detail::check;
using detail::make_message;
using detail::OpPtr;
using detail::ProgressThread;
using detail::single;
using detail::tag_upper_bound;
using pg::Millis;

namespace {

// On the caller's thread, which must not call MPI itself: the bound was read at init.
void check_tag(int tag) {
  if (tag < 0 || tag > tag_upper_bound()) {
    throw core::InvalidArgument(
        str_cat("MPI backend: tag ", tag, " is outside MPI's range [0, ", tag_upper_bound(), "]"));
  }
}

}  // namespace

WorkPtr MpiBackend::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  const Tensor t = single(tensors, "send");
  check_tag(tag);
  OpPtr op = make_message(group_, OpType::kSend,
                          str_cat("send to rank ", dst_rank, " (tag ", tag, ")"), timeout(), {t});
  MPI_Comm comm = group_->comm;
  op->start = [t, dst_rank, tag, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(t, "send");
    r.emplace_back();
    check(MPI_Isend(b.data, b.count, MPI_BYTE, dst_rank, tag, comm, &r.back()), "MPI_Isend");
  };
  return ProgressThread::instance().submit(std::move(op));
}

namespace {

WorkPtr post_recv(const std::shared_ptr<MpiBackend::Group>& group, const Tensor& t, int source,
                  int tag, Millis timeout) {
  check_tag(tag);
  const bool any = source == MPI_ANY_SOURCE;
  const std::string name = any ? str_cat("recv from any rank (tag ", tag, ")")
                               : str_cat("recv from rank ", source, " (tag ", tag, ")");
  OpPtr op = make_message(group, any ? OpType::kRecvAnySource : OpType::kRecv, name, timeout, {t});
  MPI_Comm comm = group->comm;
  op->start = [t, source, tag, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(t, "recv");
    r.emplace_back();
    check(MPI_Irecv(b.data, b.count, MPI_BYTE, source, tag, comm, &r.back()), "MPI_Irecv");
  };
  std::weak_ptr<core::Work> weak = op->work;
  const size_t expected = t.nbytes();
  op->done = [weak, expected, name](const MPI_Status& status) {
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    if (static_cast<size_t>(received) != expected) {
      throw core::InvalidArgument(str_cat(name, ": received ", received, " bytes from rank ",
                                          status.MPI_SOURCE, " but the tensor has ", expected));
    }
    if (auto work = weak.lock()) work->set_source_rank(status.MPI_SOURCE);
  };
  return ProgressThread::instance().submit(std::move(op));
}

}  // namespace

WorkPtr MpiBackend::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  return post_recv(group_, single(tensors, "recv"), src_rank, tag, timeout());
}

WorkPtr MpiBackend::recv_anysource(std::vector<Tensor>& tensors, int tag) {
  return post_recv(group_, single(tensors, "recv_anysource"), MPI_ANY_SOURCE, tag, timeout());
}

// ---------------------------------------------------------------------------------------------
// Monitored barrier: every rank checks in with rank 0, which names those that did not come
// within the timeout and then releases the others (on the group's control communicator, so
// user messages never match these).

void MpiBackend::monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) {
  // In its turn among the collectives; the caller runs it (or waits for it) and sees its error.
  queue_
      ->submit(OpType::kBarrier, "monitored_barrier", effective_timeout(opts.timeout), false,
               [this, wait_all_ranks](const pg::QueuedOp& queued) {
                 run_monitored_barrier(queued.timeout, wait_all_ranks);
               },
               {})
      ->wait();
}

void MpiBackend::run_monitored_barrier(Millis limit, bool wait_all_ranks) {
  if (size() == 1) return;
  MPI_Comm control = group_->control;
  auto message = [&](int peer, bool sending, std::shared_ptr<char> byte, Millis within) {
    OpPtr op = make_message(
        group_, sending ? OpType::kSend : OpType::kRecv,
        str_cat(sending ? "monitored_barrier send to rank " : "monitored_barrier recv from rank ",
                peer),
        within, {});
    op->start = [peer, sending, byte, control](std::vector<MPI_Request>& r) {
      r.emplace_back();
      if (sending) {
        check(MPI_Isend(byte.get(), 1, MPI_BYTE, peer, 0, control, &r.back()), "MPI_Isend");
      } else {
        check(MPI_Irecv(byte.get(), 1, MPI_BYTE, peer, 0, control, &r.back()), "MPI_Irecv");
      }
    };
    return ProgressThread::instance().submit(std::move(op));
  };
  auto arrived = [](const WorkPtr& work) {
    try {
      work->wait();
      return true;
    } catch (const DistTimeoutError&) {
      return false;
    }
  };
  if (rank() != 0) {
    auto status = std::make_shared<char>(0);
    const bool ok = arrived(message(0, true, std::make_shared<char>(1), limit)) &&
                    arrived(message(0, false, status, limit + limit));
    if (!ok) {
      throw DistTimeoutError(pg::monitored_barrier_unreleased(rank(), limit));
    }
    if (*status != 1) {
      throw DistBackendError(pg::monitored_barrier_others_failed(rank(), limit));
    }
    return;
  }
  std::vector<WorkPtr> arrivals(size());
  for (int r = 1; r < size(); ++r)
    arrivals[r] = message(r, false, std::make_shared<char>(0), limit);
  std::vector<int> came, missing;
  for (int r = 1; r < size(); ++r) {
    if (!wait_all_ranks && !missing.empty()) {
      if (arrivals[r]->is_completed() && arrivals[r]->is_success()) came.push_back(r);
      continue;
    }
    (arrived(arrivals[r]) ? came : missing).push_back(r);
  }
  const char status = missing.empty() ? 1 : 0;
  std::vector<WorkPtr> releases;
  for (int r : came) releases.push_back(message(r, true, std::make_shared<char>(status), limit));
  for (auto& w : releases) arrived(w);
  if (missing.empty()) return;
  throw DistTimeoutError(pg::monitored_barrier_missing(missing, limit));
}

}  // namespace c10d::backends::mpi
