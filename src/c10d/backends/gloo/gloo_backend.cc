// GlooBackend's construction (devices, rendezvous, the address exchange) and its operation
// queue: sequence numbers, the worker threads, finish_pending and shutdown.
#include "c10d/backends/gloo/gloo_backend.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <utility>

#include <gloo/allgather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include "c10d/backends/gloo/addresses.h"
#include "c10d/backends/gloo/internal.h"
#include "c10d/backends/gloo/store_adapter.h"
#include "c10d/core/copy.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/store/prefix_store.h"

namespace c10d::backends::gloo {

using core::DistBackendError;
using core::DistTimeoutError;
using core::OpType;
using core::Tensor;
using core::detail::str_cat;
using detail::advertised_addresses;
using detail::is_gloo_timeout;
using detail::resolve_timeout;
using detail::silent_peers_note;
using detail::split;
using detail::store_host;
using detail::tcp_address_text;
using pg::Millis;

namespace {

// Gloo writes to its sockets with writev, which raises SIGPIPE when a peer has gone away; the
// default action would kill the process instead of letting the write fail with EPIPE (which
// becomes an error naming the peer). A handler the application installed is left alone.
void ignore_sigpipe_once() {
  static const bool done = [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        !(current.sa_flags & SA_SIGINFO)) {
      ::signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)done;
}

}  // namespace

bool detail::is_gloo_timeout(const std::string& message) {
  return message.find("Timed out") != std::string::npos ||
         message.find("timed out") != std::string::npos ||
         message.find("Timeout") != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// Construction and the worker pool

std::string GlooBackend::Shared::describe(const char* op, uint32_t tag) const {
  return str_cat(op, " (sequence ", tag, ", rank ", rank, " of ", size, ")");
}

int GlooBackend::Shared::peer_in_message(const std::string& message) const {
  for (size_t r = 0; r < peer_addresses.size(); ++r) {
    for (const std::string& address : peer_addresses[r]) {
      if (address.empty()) continue;
      // "[127.0.0.1]:4632" must not match inside "[127.0.0.1]:46321".
      for (size_t at = message.find(address); at != std::string::npos;
           at = message.find(address, at + 1)) {
        const size_t end = at + address.size();
        if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) {
          return static_cast<int>(r);
        }
      }
    }
  }
  return -1;
}

std::exception_ptr GlooBackend::Shared::translate(std::exception_ptr error, const char* op_name,
                                                  const OpContext& op) const noexcept {
  try {
    try {
      std::rethrow_exception(error);
    } catch (const DistTimeoutError& e) {
      // The ring's own: it names the member waited for, which may itself be waiting; the
      // probe names the peers whose hosts no longer answer, as Gloo's timeouts do.
      if (op.ring_ticket < 0) return error;
      return std::make_exception_ptr(
          DistTimeoutError(str_cat(e.what(), silent_peers_note(peer_addresses))));
    } catch (const core::DistError&) {
      return error;  // ours already carries its context
    } catch (const std::exception& e) {
      const std::string what = e.what();
      std::string message = str_cat("Gloo ", describe(op_name, op.tag));
      if (int peer = peer_in_message(what); peer >= 0) message += str_cat(" with peer rank ", peer);
      if (is_gloo_timeout(what)) {
        return std::make_exception_ptr(
            DistTimeoutError(str_cat(message, " timed out after ", core::format_timeout(op.timeout),
                                     ": ", what, silent_peers_note(peer_addresses))));
      }
      return std::make_exception_ptr(DistBackendError(str_cat(message, " failed: ", what)));
    } catch (...) {
      return std::make_exception_ptr(DistBackendError(
          str_cat("Gloo ", describe(op_name, op.tag), " failed with an unknown error")));
    }
  } catch (...) {
    return std::current_exception();  // allocation failure while building the message
  }
}

void GlooBackend::Shared::wait_ring_turn(const char* op_name, const OpContext& op) {
  if (ring_turn.load(std::memory_order_acquire) != op.ring_ticket) {
    std::unique_lock<std::mutex> lock(mutex);
    const auto turn = [&] {
      return stopping || ring_turn.load(std::memory_order_relaxed) == op.ring_ticket;
    };
    if (!ring_turn_changed.wait_until(lock, core::Deadline(op.timeout).time_point(), turn)) {
      throw DistTimeoutError(str_cat(
          "Gloo ", describe(op_name, op.tag), ": Timed out after ",
          core::format_timeout(op.timeout), " waiting for the ring, which this rank's earlier ",
          "operations hold (the last to start on it: sequence ", ring_holder.load(), ")"));
    }
    if (ring_turn.load(std::memory_order_relaxed) != op.ring_ticket) {
      throw DistBackendError(
          str_cat("Gloo ", describe(op_name, op.tag), ": the backend was shut down before it ran"));
    }
  }
  ring_holder.store(op.tag, std::memory_order_relaxed);
}

void GlooBackend::Shared::finish_ring_turn(int64_t ticket) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    int64_t turn = ring_turn.load(std::memory_order_relaxed);
    if (ticket != turn) {
      ring_done.insert(ticket);  // gave up waiting: its turn passes when it comes
      return;
    }
    for (++turn; !ring_done.empty() && *ring_done.begin() == turn; ++turn) {
      ring_done.erase(ring_done.begin());
    }
    ring_turn.store(turn, std::memory_order_release);
  }
  ring_turn_changed.notify_all();
}

GlooBackend::GlooBackend(std::shared_ptr<store::Store> store, int rank, int size, GlooOptions opts)
    : pg::Backend(rank, size, opts.timeout), store_(std::move(store)),
      devices_(std::move(opts.devices)), shared_(std::make_shared<Shared>(rank, size)) {
  ignore_sigpipe_once();
  // copy_bytes times its kernels at the first large copy: here, not inside a collective (and
  // a bad C10D_COPY fails the construction).
  (void)core::detail::copy_kernels();
  if (devices_.empty()) devices_ = create_default_devices(store_host(store_));
  const Millis timeout = resolve_timeout(opts.timeout);
  for (size_t i = 0; i < devices_.size(); ++i) {
    auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    StoreAdapter adapter(store_, str_cat("gloo/", i, "/"));
    try {
      context->connectFullMesh(adapter, devices_[i]);
    } catch (const std::exception& e) {
      throw DistBackendError(str_cat("Gloo rendezvous failed for rank ", rank, " of ", size,
                                     " through ", store_->describe(), " (device ",
                                     devices_[i]->str(), "): ", e.what()));
    }
    contexts_.push_back(std::move(context));
  }
  exchange_addresses();
  if (opts.ring.value_or(core::env_bool(core::kEnvGlooRing)) && size > 1) {
    if (const std::string ip = listen_ip(); !ip.empty()) {
      std::vector<int> ranks(size);
      for (int r = 0; r < size; ++r) ranks[r] = r;
      auto ring_store = std::make_shared<store::PrefixStore>("gloo/ring", store_);
      shared_->ring = std::make_unique<ring::Ring>(std::move(ring_store), rank, std::move(ranks),
                                                   ip, timeout, ring::Ring::Label{"Gloo", ""});
    }
  }
  const int threads = std::max(1, opts.threads);
  shared_->running_workers = threads;
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back(worker_loop, shared_);
}

GlooBackend::~GlooBackend() { shutdown(); }

std::string GlooBackend::listen_ip() const {
  if (contexts_.empty() || size() < 2) return "";
  const std::string text =
      tcp_address_text(contexts_[0]->getPair(rank() == 0 ? 1 : 0)->address().str());
  const size_t close = text.find(']');
  if (text.empty() || text[0] != '[' || close == std::string::npos) return "";
  return text.substr(1, close - 1);
}

void GlooBackend::exchange_addresses() {
  shared_->peer_addresses.assign(size(), {});
  if (size() == 1) return;
  try {
    // One line per device and peer: the peer's rank, then the addresses that may name us in its
    // messages (see Shared::peer_addresses): our pair's address now, and the one it advertised,
    // read back from our rendezvous record (checked first: a get would wait for a missing key).
    std::string mine;
    for (size_t d = 0; d < contexts_.size(); ++d) {
      const std::string record = str_cat("gloo/", d, "/", rank());
      std::vector<std::string> advertised(size());
      if (store_->check({record})) {
        advertised = advertised_addresses(store_->get(record), rank(), size());
      }
      for (int p = 0; p < size(); ++p) {
        if (p == rank()) continue;
        mine += str_cat(p, ' ', tcp_address_text(contexts_[d]->getPair(p)->address().str()), ' ',
                        advertised[p], '\n');
      }
    }
    store_->set(str_cat("gloo/address/", rank()), store::to_bytes(mine));
    const std::string me = std::to_string(rank());
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      const std::string theirs = store::to_string(store_->get(str_cat("gloo/address/", r)));
      for (const std::string& line : split(theirs, '\n')) {
        const std::vector<std::string> fields = split(line, ' ');
        if (fields.empty() || fields[0] != me) continue;
        auto& names = shared_->peer_addresses[r];
        names.insert(names.end(), fields.begin() + 1, fields.end());
      }
    }
  } catch (const std::exception& e) {
    throw DistBackendError(str_cat("Gloo rendezvous failed for rank ", rank(), " of ", size(),
                                   " through ", store_->describe(),
                                   " while exchanging addresses: ", e.what()));
  }
}

uint32_t GlooBackend::next_sequence() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->next_seq;
}

GlooBackend::OpContext GlooBackend::next_op(Millis op_timeout) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return context_for(shared_->next_seq++, op_timeout);
}

GlooBackend::OpContext GlooBackend::context_for(uint32_t tag, Millis op_timeout) const {
  OpContext op;
  op.context = contexts_[tag % contexts_.size()];
  op.tag = tag;
  op.timeout = resolve_timeout(effective_timeout(op_timeout));
  op.rank = rank();
  op.size = size();
  return op;
}

WorkPtr GlooBackend::submit(const char* op_name, pg::Signature call, Millis op_timeout, bool async,
                            Body body, std::vector<Tensor> outputs, bool on_ring,
                            pg::Traffic traffic) {
  const auto type = static_cast<OpType>(call.kind);
  Task task;
  task.name = op_name;
  task.body = std::move(body);
  task.outputs = std::move(outputs);
  // A collective that moves nothing (but barrier, which the ring runs as one byte) has its
  // call compared like one whose data takes another way: its body returns at once.
  task.ring_data = on_ring && (call.count != 0 || type == OpType::kBarrier);
  task.traffic = std::move(traffic);
  Shared& shared = *shared_;
  {
    std::unique_lock<std::mutex> lock(shared.mutex);
    const uint32_t tag = shared.next_seq++;
    task.op = context_for(tag, op_timeout);
    call.seq = tag;
    task.op.call = call;
    // Every collective takes a turn on the ring: those whose data goes another way check
    // their call there.
    if (shared.ring) {
      task.op.ring = shared.ring.get();
      task.op.ring_ticket = shared.next_ring_ticket++;
    }
    // Plain concatenation: this runs on every operation's critical path.
    task.work = std::make_shared<core::Work>(
        type, std::string("gloo:") + op_name + "#" + std::to_string(tag));
    if (shared.stopping) {
      lock.unlock();
      task.work->finish_with_error(std::make_exception_ptr(DistBackendError(
          str_cat("Gloo ", shared.describe(op_name, tag), ": the backend was shut down"))));
      return task.work;
    }
    if (async) {
      WorkPtr work = task.work;
      shared.queue.push_back(std::move(task));
      lock.unlock();
      shared.wake.notify_one();
      return work;
    }
  }
  run_task(shared, task);
  return task.work;
}

void GlooBackend::run_task(Shared& shared, Task& task) noexcept {
  std::exception_ptr error;
  try {
    if (task.op.ring_ticket >= 0) shared.wait_ring_turn(task.name, task.op);
    if (!task.ring_data || !task.op.ring) agree(shared, task);
    if (!task.ring_data && task.op.ring_ticket >= 0) {
      // The check was all this operation needed the ring for.
      shared.finish_ring_turn(task.op.ring_ticket);
      task.op.ring_ticket = -1;
      task.op.ring = nullptr;
    }
    task.body(task.op);
  } catch (...) {
    error = shared.translate(std::current_exception(), task.name, task.op);
  }
  if (task.op.ring_ticket >= 0) {
    try {
      shared.finish_ring_turn(task.op.ring_ticket);
    } catch (...) {  // std::set's allocation: later turns then fail at their timeout
    }
  }
  // shutdown() may have failed the Work already; completing it twice throws.
  try {
    if (error) {
      task.work->finish_with_error(error);
    } else {
      task.work->finish(std::move(task.outputs));
    }
  } catch (...) {
  }
}

void GlooBackend::agree(const Shared& shared, Task& task) {
  const OpContext& op = task.op;
  if (op.size == 1) return;
  if (op.ring && op.size == 2 && task.traffic.sends.empty()) {
    // Two members compare with each other: the ring's header is the whole check.
    op.ring->check(op.timeout, op.call);
    return;
  }
  std::vector<int64_t> mine = pg::agreement_record(op.call, task.traffic, op.size);
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(op.size));
  if (op.ring) {
    // Everyone's record, so every rank reaches the verdict (a member whose neighbours agree
    // with it would otherwise go on into Gloo's algorithm and wait there).
    std::copy(mine.begin(), mine.end(),
              all.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(op.rank) * mine.size()));
    op.ring->allgather(all.data(), mine.size() * sizeof(int64_t), op.timeout, op.call);
  } else {
    ::gloo::AllgatherOptions g(op.context);
    g.setInput(mine.data(), mine.size());
    g.setOutput(all.data(), all.size());
    g.setTag(op.tag);
    g.setTimeout(op.timeout);
    ::gloo::allgather(g);
  }
  if (std::string why = pg::disagreement(op.rank, op.size, all.data(), mine.size()); !why.empty()) {
    throw DistBackendError(str_cat("Gloo ", shared.describe(task.name, op.tag), ": ", why));
  }
}

void GlooBackend::worker_loop(std::shared_ptr<Shared> shared) {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(shared->mutex);
      shared->wake.wait(lock, [&] { return shared->stopping || !shared->queue.empty(); });
      if (shared->queue.empty()) {
        --shared->running_workers;
        shared->exited.notify_all();
        return;
      }
      task = std::move(shared->queue.front());
      shared->queue.pop_front();
      shared->in_flight.push_back(task.work);
    }
    run_task(*shared, task);
    std::lock_guard<std::mutex> lock(shared->mutex);
    auto& in_flight = shared->in_flight;
    in_flight.erase(std::find(in_flight.begin(), in_flight.end(), task.work));
    shared->exited.notify_all();  // finish_pending() waits for the queue to drain
  }
}

void GlooBackend::finish_pending(Millis timeout) {
  Shared& shared = *shared_;
  std::unique_lock<std::mutex> lock(shared.mutex);
  auto drained = [&] {
    return shared.queue.empty() && shared.in_flight.empty();
  };
  if (timeout <= Millis::zero()) return shared.exited.wait(lock, drained);
  if (shared.exited.wait_for(lock, timeout, drained)) return;
  const std::string first = !shared.in_flight.empty() ? shared.in_flight.front()->description()
                                                      : shared.queue.front().work->description();
  core::log(core::LogLevel::kWarning,
            str_cat("Gloo rank ", rank(), " of ", size(), ": ",
                    shared.queue.size() + shared.in_flight.size(), " operation(s) (first: ", first,
                    ") did not finish within ", core::format_timeout(timeout),
                    " while the backend shut down; they fail"));
}

void GlooBackend::shutdown() {
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mutex_);
  if (workers_.empty()) return;
  Shared& shared = *shared_;
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    shared.stopping = true;
    dropped.swap(shared.queue);
  }
  shared.wake.notify_all();
  shared.ring_turn_changed.notify_all();
  if (shared.ring) shared.ring->abort();
  for (Task& task : dropped) {
    task.work->finish_with_error(std::make_exception_ptr(
        DistBackendError(str_cat("Gloo ", shared.describe(task.name, task.op.tag),
                                 ": the backend was shut down before it ran"))));
  }
  // Closing the connections makes peers see us leave, and running operations that touch the
  // network fail. An operation merely waiting on a peer is not woken by Gloo, though, so
  // workers still busy after a short grace period are left to finish (at their timeout) on
  // their own: they hold only the shared state and their task, never the backend.
  for (auto& context : contexts_) {
    try {
      context->closeConnections();
    } catch (...) {
    }
  }
  bool all_exited;
  std::vector<std::shared_ptr<core::Work>> abandoned;
  {
    std::unique_lock<std::mutex> lock(shared.mutex);
    all_exited = shared.exited.wait_for(lock, std::chrono::milliseconds(100),
                                        [&] { return shared.running_workers == 0; });
    if (!all_exited) abandoned = shared.in_flight;
  }
  for (auto& work : abandoned) {
    try {
      work->finish_with_error(std::make_exception_ptr(
          DistBackendError(str_cat("Gloo ", work->description(), " on rank ", rank(), " of ",
                                   size(), ": the backend was shut down while it ran"))));
    } catch (...) {
      // It completed in the meantime.
    }
  }
  for (auto& worker : workers_) {
    if (all_exited) {
      worker.join();
    } else {
      worker.detach();
    }
  }
  workers_.clear();
}

}  // namespace c10d::backends::gloo
