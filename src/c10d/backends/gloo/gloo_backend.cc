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
#include "c10d/backends/gloo/loop_waker.h"
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
      if (!ring) return error;
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

GlooBackend::OpContext GlooBackend::Shared::context_for(uint32_t tag, Millis timeout) const {
  OpContext op;
  op.context = contexts[tag % contexts.size()];
  op.tag = tag;
  op.timeout = timeout;
  op.rank = rank;
  op.size = size;
  return op;
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
      LoopWaker waker(devices_[i]);
      context->connectFullMesh(adapter, devices_[i]);
    } catch (const std::exception& e) {
      throw DistBackendError(str_cat("Gloo rendezvous failed for rank ", rank, " of ", size,
                                     " through ", store_->describe(), " (device ",
                                     devices_[i]->str(), "): ", e.what()));
    }
    shared_->contexts.push_back(std::move(context));
  }
  exchange_addresses();
  if (opts.ring.value_or(core::env_bool(core::kEnvGlooRing)) && size > 1) {
    if (const std::string ip = listen_ip(); !ip.empty()) {
      std::vector<int> ranks(size);
      for (int r = 0; r < size; ++r) ranks[r] = r;
      auto ring_store = std::make_shared<store::PrefixStore>("gloo/ring", store_);
      shared_->ring = std::make_unique<net::Ring>(std::move(ring_store), rank, std::move(ranks), ip,
                                                  timeout, net::Ring::Label{"Gloo", ""});
    }
  }
  queue_ = std::make_shared<pg::OpQueue>(pg::OpQueue::Config::of("gloo", "Gloo", rank, size));
}

GlooBackend::~GlooBackend() {
  shutdown();
  // The devices join their loop threads, and their pairs leave the loops, at a loop's next
  // turn: poke the loops while the last references go.
  auto wakers = LoopWaker::for_devices(devices_);
  for (auto& waker : wakers) waker->release_device();
  shared_.reset();
  devices_.clear();
}

std::string GlooBackend::listen_ip() const {
  if (shared_->contexts.empty() || size() < 2) return "";
  const std::string text =
      tcp_address_text(shared_->contexts[0]->getPair(rank() == 0 ? 1 : 0)->address().str());
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
    for (size_t d = 0; d < shared_->contexts.size(); ++d) {
      const std::string record = str_cat("gloo/", d, "/", rank());
      std::vector<std::string> advertised(size());
      if (store_->check({record})) {
        advertised = advertised_addresses(store_->get(record), rank(), size());
      }
      for (int p = 0; p < size(); ++p) {
        if (p == rank()) continue;
        mine += str_cat(p, ' ', tcp_address_text(shared_->contexts[d]->getPair(p)->address().str()),
                        ' ', advertised[p], '\n');
      }
    }
    store_->set(str_cat("gloo/address/", rank()), store::to_bytes(mine));
    const std::string me = std::to_string(rank());
    std::vector<std::string> keys;
    std::vector<int> peers;
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      keys.push_back(str_cat("gloo/address/", r));
      peers.push_back(r);
    }
    const std::vector<store::Bytes> records = store_->multi_get(keys);  // one round trip
    for (size_t i = 0; i < peers.size(); ++i) {
      const int r = peers[i];
      for (const std::string& line : split(store::to_string(records[i]), '\n')) {
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
  return static_cast<uint32_t>(queue_->next_sequence());
}

WorkPtr GlooBackend::submit(const char* op_name, pg::Signature call, Millis op_timeout, bool async,
                            Body body, std::vector<Tensor> outputs, bool on_ring,
                            pg::Traffic traffic) {
  const auto type = static_cast<OpType>(call.kind);
  // A collective that moves nothing (but barrier, which the ring runs as one byte) has its
  // call compared like one whose data takes another way: its body returns at once.
  const bool ring_data = on_ring && (call.count != 0 || type == OpType::kBarrier);
  return queue_->submit(
      type, op_name, resolve_timeout(effective_timeout(op_timeout)), async,
      [shared = shared_, op_name, call, ring_data, traffic = std::move(traffic),
       body = std::move(body)](const pg::QueuedOp& queued) {
        OpContext op = shared->context_for(static_cast<uint32_t>(queued.seq), queued.timeout);
        op.call = call;
        op.call.seq = op.tag;
        run(*shared, op_name, op, ring_data, traffic, body);
      },
      std::move(outputs));
}

void GlooBackend::run(const Shared& shared, const char* op_name, OpContext& op, bool ring_data,
                      const pg::Traffic& traffic, const Body& body) {
  try {
    if (!ring_data || !shared.ring) agree(shared, op_name, op, traffic);
    if (ring_data) op.ring = shared.ring.get();
    body(op);
  } catch (...) {
    std::rethrow_exception(shared.translate(std::current_exception(), op_name, op));
  }
}

void GlooBackend::agree(const Shared& shared, const char* op_name, const OpContext& op,
                        const pg::Traffic& traffic) {
  if (op.size == 1) return;
  net::Ring* ring = shared.ring.get();
  if (ring && op.size == 2 && traffic.sends.empty()) {
    // Two members compare with each other: the ring's header is the whole check.
    ring->check(op.timeout, op.call);
    return;
  }
  std::vector<int64_t> mine = pg::agreement_record(op.call, traffic, op.size);
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(op.size));
  if (ring) {
    // Everyone's record, so every rank reaches the verdict (a member whose neighbours agree
    // with it would otherwise go on into Gloo's algorithm and wait there).
    std::copy(mine.begin(), mine.end(),
              all.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(op.rank) * mine.size()));
    ring->allgather(all.data(), mine.size() * sizeof(int64_t), op.timeout, op.call);
  } else {
    ::gloo::AllgatherOptions g(op.context);
    g.setInput(mine.data(), mine.size());
    g.setOutput(all.data(), all.size());
    g.setTag(op.tag);
    g.setTimeout(op.timeout);
    ::gloo::allgather(g);
  }
  if (std::string why = pg::disagreement(op.rank, op.size, all.data(), mine.size()); !why.empty()) {
    throw DistBackendError(str_cat("Gloo ", shared.describe(op_name, op.tag), ": ", why));
  }
}

void GlooBackend::finish_pending(Millis timeout) { queue_->finish_pending(timeout); }

void GlooBackend::shutdown() {
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mutex_);
  bool running = false;
  if (!queue_->stop([&running](bool busy) { running = busy; })) return;
  if (shared_->ring) shared_->ring->abort();
  // With nothing running, the connections close when the contexts go, softly: Gloo's
  // closeConnections() resets them (SO_LINGER 0), which drops what our kernel has not yet
  // delivered of a finished send, and a slower peer still reading it would wait for bytes
  // that never come. An operation still running after finish_pending is cut off instead:
  // closing the connections makes its network calls fail and the peers see us leave. One
  // merely waiting on a peer is not woken by Gloo, though, so a worker still busy after a
  // short grace period is left to finish (at its timeout) on its own: it holds only the
  // shared state and its operation, never the backend.
  if (running) {
    const auto wakers = LoopWaker::for_devices(devices_);
    for (auto& context : shared_->contexts) {
      try {
        context->closeConnections();
      } catch (...) {
      }
    }
  }
  queue_->join(std::chrono::milliseconds(100));
}

}  // namespace c10d::backends::gloo
