#include "c10d/backends/hier/hier_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include "c10d/backends/gloo/gloo_backend.h"
#include "c10d/backends/shm/shm_backend.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"
#include "c10d/net/host.h"
#include "c10d/store/prefix_store.h"

namespace c10d::backends::hier {

using core::DistBackendError;
using core::OpType;
using core::ReduceOp;
using core::detail::str_cat;
using pg::Millis;

bool Topology::uniform() const {
  return std::all_of(hosts.begin(), hosts.end(),
                     [&](const auto& h) { return h.size() == hosts.front().size(); });
}

Topology discover_topology(store::Store& store, int rank, int size, const std::string& prefix) {
  store.set(str_cat(prefix, rank), store::to_bytes(net::host_identity()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(str_cat(prefix, r));
  const std::vector<store::Bytes> ids = store.multi_get(keys);
  std::map<std::string, int> host_index;  // by identity, in order of the hosts' lowest rank
  Topology t;
  for (int r = 0; r < size; ++r) {
    const std::string id = store::to_string(ids[r]);
    auto [it, fresh] = host_index.emplace(id, static_cast<int>(t.hosts.size()));
    if (fresh) t.hosts.emplace_back();
    t.hosts[it->second].push_back(r);
    if (r == rank) {
      t.host = it->second;
      t.local_rank = static_cast<int>(t.hosts[it->second].size()) - 1;
    }
  }
  return t;
}

namespace {

// The operations that reduce in any grouping of the ranks (AVG as a SUM, divided at the end).
bool groups_freely(const ReduceOp& op) {
  switch (op.kind) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
    case ReduceOp::PRODUCT:
    case ReduceOp::MIN:
    case ReduceOp::MAX:
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      return true;
    default:
      return false;
  }
}

ReduceOp step_op(const ReduceOp& op) {
  return op.kind == ReduceOp::AVG ? ReduceOp(ReduceOp::SUM) : op;
}

// What is left of an operation's `deadline` for its next step (at least 1 ms, so a step
// never runs without a timeout); the whole `timeout` when it has none.
Millis left_of(const core::Deadline& deadline, Millis timeout) {
  return deadline.infinite() ? timeout : std::max(deadline.remaining(), Millis(1));
}

// Runs one step on a sub-backend and waits for it (on the worker thread).
template <typename Call>
void step(const std::shared_ptr<pg::Backend>& backend, Call call) {
  call(*backend)->wait();
}

}  // namespace

HierBackend::HierBackend(std::shared_ptr<store::Store> store, int rank, int size, Topology topology,
                         Millis timeout)
    : pg::Backend(rank, size, timeout), topology_(std::move(topology)) {
  const Topology& t = topology_;
  local_rank_of_.resize(size);
  host_of_.resize(size);
  for (int h = 0; h < t.host_count(); ++h) {
    for (size_t l = 0; l < t.hosts[h].size(); ++l) {
      local_rank_of_[t.hosts[h][l]] = static_cast<int>(l);
      host_of_[t.hosts[h][l]] = h;
    }
  }
  auto prefixed = [&](const std::string& p) {
    return std::make_shared<store::PrefixStore>(p, store);
  };
  failures_ = prefixed("hier/failed/");
  if (t.local_size() > 1) {
    shm::ShmOptions so;
    so.timeout = timeout;
    local_ = std::make_shared<shm::ShmBackend>(prefixed(str_cat("hier/local/", t.host, "/")),
                                               t.local_rank, t.local_size(), so);
  }
  gloo::GlooOptions go;
  go.timeout = timeout;
  if (t.host_count() > 1 && (t.uniform() || t.local_rank == 0)) {
    gloo::GlooOptions cross_options = go;
    cross_options.ring = false;  // ring_ below is the same ring, naming global ranks
    auto cross = std::make_shared<gloo::GlooBackend>(
        prefixed(str_cat("hier/cross/", t.local_rank, "/")), t.host, t.host_count(), cross_options);
    cross_ = cross;
    // all_reduce and broadcast between hosts take a ring of their own, on the address Gloo
    // chose for them.
    if (const std::string ip = cross->listen_ip(); !ip.empty()) {
      std::vector<int> members;
      for (const auto& host : t.hosts) members.push_back(host[t.local_rank]);
      ring_ = std::make_unique<net::Ring>(prefixed(str_cat("hier/ring/", t.local_rank, "/")),
                                          t.host, std::move(members), ip, timeout,
                                          net::Ring::Label{"hier", " between hosts"});
    }
  }
  world_ = std::make_shared<gloo::GlooBackend>(prefixed("hier/world/"), rank, size, go);
  queue_ = std::make_shared<pg::OpQueue>(pg::OpQueue::Config::of("hier", "", rank, size));
}

HierBackend::~HierBackend() { shutdown(); }

std::shared_ptr<pg::Backend> HierBackend::create_auto(std::shared_ptr<store::Store> store, int rank,
                                                      int size, Millis timeout) {
  Topology t = discover_topology(*store, rank, size, "auto/host/");
  if (t.host_count() == 1) {
    shm::ShmOptions so;
    so.timeout = timeout;
    return std::make_shared<shm::ShmBackend>(
        std::make_shared<store::PrefixStore>("auto/shm/", store), rank, size, so);
  }
  return std::make_shared<HierBackend>(std::move(store), rank, size, std::move(t), timeout);
}

// --- The queue ---------------------------------------------------------------------------

WorkPtr HierBackend::submit(OpType type, const char* name, Millis timeout, bool async,
                            std::function<void(uint64_t)> body, std::vector<Tensor> outputs) {
  return queue_->submit(
      type, name, timeout, async,
      [this, body = std::move(body)](const pg::QueuedOp& op) {
        try {
          body(op.seq);
        } catch (const std::exception& e) {
          std::rethrow_exception(failed(e));
        }
      },
      std::move(outputs));
}

std::exception_ptr HierBackend::failed(const std::exception& error) {
  // A host's step failed: the other hosts' carriers, waiting on the ring, learn at once.
  if (ring_) ring_->break_off(str_cat("this rank's step on its host failed: ", error.what()));
  // And the ranks of its host waiting in a step with it (settle_hosts) learn at once too:
  // with its ring broken the group cannot run another operation anyway.
  if (local_ && ring_) local_->shutdown();
  return with_host_failures(error);
}

std::exception_ptr HierBackend::with_host_failures(const std::exception& error) {
  // Reports are "T <message>" for a timeout, "E <message>" otherwise: a rank whose step was
  // cut short because a rank of its host timed out (and shut the host's group) failed by a
  // timeout too, as a failure passed on around the ring stays one.
  bool timeout = dynamic_cast<const core::DistTimeoutError*>(&error) != nullptr;
  std::string others;
  try {
    failures_->set(std::to_string(rank()),
                   store::to_bytes(str_cat(timeout ? "T " : "E ", error.what())));
    for (int peer : topology_.hosts[topology_.host]) {
      const std::string key = std::to_string(peer);
      if (peer == rank() || !failures_->check({key})) continue;
      const std::string report = store::to_string(failures_->get(key));
      if (report.size() < 2) continue;
      timeout = timeout || report[0] == 'T';
      others += str_cat("; rank ", peer, " on this host failed first: ", report.substr(2));
    }
  } catch (...) {  // the store is gone: the error as it is
  }
  if (others.empty()) return std::current_exception();
  // The same kind of error (a timeout stays a timeout), with the host's reports.
  const std::string message = str_cat(error.what(), others);
  if (timeout) return std::make_exception_ptr(core::DistTimeoutError(message));
  if (dynamic_cast<const core::DistNetworkError*>(&error)) {
    return std::make_exception_ptr(core::DistNetworkError(message));
  }
  return std::make_exception_ptr(DistBackendError(message));
}

void HierBackend::set_timeout(pg::Millis timeout) {
  pg::Backend::set_timeout(timeout);
  for (const auto& b : {local_, cross_, world_}) {
    if (b) b->set_timeout(timeout);
  }
}

void HierBackend::finish_pending(Millis timeout) {
  queue_->finish_pending(timeout);
  for (const auto& b : {local_, cross_, world_}) {
    if (b) b->finish_pending(timeout);
  }
}

void HierBackend::shutdown() {
  if (queue_->stop()) {
    // The running step ends by itself or fails once its sub-backend is shut down.
    if (ring_) ring_->abort();
    for (const auto& b : {local_, cross_, world_}) {
      if (b) b->shutdown();
    }
  }
  queue_->join();
}

bool HierBackend::hierarchical(const std::vector<Tensor>& tensors) {
  return tensors.size() == 1 && tensors[0].is_contiguous() &&
         tensors[0].device().type == core::DeviceType::kCPU;
}

// --- Collectives with hierarchical steps ------------------------------------------------

WorkPtr HierBackend::allreduce(std::vector<Tensor>& tensors, const pg::AllreduceOptions& opts) {
  if (!hierarchical(tensors) || !groups_freely(opts.reduce_op)) {
    return world_->allreduce(tensors, opts);
  }
  Tensor t = tensors[0];
  const Millis timeout = effective_timeout(opts.timeout);
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kAllreduce, "allreduce", timeout, opts.async_op,
      [this, t, op, timeout](uint64_t seq) mutable { run_allreduce(t, op, timeout, seq); },
      tensors);
}

void HierBackend::run_allreduce(Tensor& t, const ReduceOp& op, Millis timeout, uint64_t seq) {
  // One deadline for the whole operation: each step gets what is left of it.
  const core::Deadline deadline(timeout);
  auto left = [&] {
    return left_of(deadline, timeout);
  };
  pg::AllreduceOptions o;
  o.reduce_op = step_op(op);
  o.timeout = timeout;
  o.async_op = false;
  const Topology& top = topology_;
  const int parts = top.local_size();
  if (local_ && cross_ && top.uniform() && t.numel() > 0 && t.numel() % parts == 0) {
    // Each local rank ends the host's reduce-scatter with its 1/L of the host's sum, all-reduces
    // it with its peers on the other hosts (every rank of a host carries 1/L of the network
    // traffic), and the host's all-gather puts the parts together: two shm steps in all.
    Tensor part = scratch(t.dtype(), t.numel() / parts);
    Tensor flat = t.flatten();
    pg::ReduceScatterOptions ro;
    ro.reduce_op = o.reduce_op;
    ro.timeout = left();
    ro.async_op = false;
    step(local_, [&](pg::Backend& b) { return b.reduce_scatter_base(part, flat, ro); });
    o.timeout = left();
    cross_allreduce(part, o, seq);
    pg::AllgatherOptions go;
    go.timeout = left();
    go.async_op = false;
    try {
      step(local_, [&](pg::Backend& b) { return b.allgather_base(flat, part, go); });
    } catch (const core::DistTimeoutError& e) {
      // The awaited local ranks were still exchanging their parts between hosts.
      throw core::DistTimeoutError(str_cat(e.what(), "; ", cross_peers_note()));
    }
  } else {
    // Unequal hosts or parts: the host all-reduces, its first rank (or each local rank, its
    // part) all-reduces across hosts, and the host's ranks broadcast the result.
    std::vector<Tensor> whole = {t};
    if (local_) step(local_, [&](pg::Backend& b) { return b.allreduce(whole, o); });
    const bool split = top.uniform() && local_;
    o.timeout = left();
    if (cross_) {
      if (split) {
        const auto [offset, count] = net::part_of(t.numel(), parts, top.local_rank);
        if (count > 0) cross_allreduce(t.flatten().flat_slice(offset, count), o, seq);
      } else {
        cross_allreduce(t, o, seq);
      }
    }
    if (local_ && top.host_count() > 1) {
      pg::BroadcastOptions bo;
      bo.async_op = false;
      for (int l = 0; l < (split ? parts : 1); ++l) {
        bo.timeout = left();
        const auto [offset, count] =
            split ? net::part_of(t.numel(), parts, l) : std::pair<int64_t, int64_t>{0, t.numel()};
        if (count == 0) continue;
        std::vector<Tensor> piece = {t.flatten().flat_slice(offset, count)};
        bo.root_rank = l;
        step(local_, [&](pg::Backend& b) { return b.broadcast(piece, bo); });
      }
    }
  }
  core::apply_postdiv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), op, size());
}

std::string HierBackend::cross_peers_note() const {
  const Topology& top = topology_;
  std::string note = "the host's other ranks were exchanging their parts with";
  for (int l = 0; l < top.local_size(); ++l) {
    if (l == top.local_rank) continue;
    for (int h = 0; h < top.host_count(); ++h) {
      if (h == top.host) continue;
      const std::string host = ring_ ? ring_->host_of(h) : "";
      note += str_cat(" rank ", top.hosts[h][l], host.empty() ? "" : " on host ", host, ",");
    }
  }
  note.pop_back();
  return note;
}

void HierBackend::cross_allreduce(Tensor t, const pg::AllreduceOptions& o, uint64_t seq) {
  if (ring_) {
    ring_->allreduce(t.data(), static_cast<size_t>(t.numel()), t.dtype(), o.reduce_op, o.timeout,
                     pg::Signature(OpType::kAllreduce, seq).of(t).with(o.reduce_op));
  } else {
    std::vector<Tensor> tensors = {std::move(t)};
    step(cross_, [&](pg::Backend& b) { return b.allreduce(tensors, o); });
  }
}

Tensor HierBackend::scratch(core::DType dtype, int64_t count) {
  if (scratch_.numel() < count || scratch_.dtype() != dtype) {
    scratch_ = Tensor::empty({count}, dtype);
  }
  return scratch_.flat_slice(0, count);
}

WorkPtr HierBackend::broadcast(std::vector<Tensor>& tensors, const pg::BroadcastOptions& opts) {
  if (!hierarchical(tensors) || opts.root_tensor != 0) return world_->broadcast(tensors, opts);
  Tensor t = tensors[0];
  const int root = static_cast<int>(opts.root_rank);
  const Millis timeout = effective_timeout(opts.timeout);
  return submit(
      OpType::kBroadcast, "broadcast", timeout, opts.async_op,
      [this, t, root, timeout](uint64_t seq) mutable { run_broadcast(t, root, timeout, seq); },
      tensors);
}

// The root broadcasts on its host; the local rank that carries it between hosts (the root's
// own when every host has as many ranks, else the first) broadcasts it to its peers on the
// other hosts, each of which broadcasts it on its host.
void HierBackend::run_broadcast(Tensor& t, int root, Millis timeout, uint64_t seq) {
  const Topology& top = topology_;
  const int root_host = host_of_[root], root_local = local_rank_of_[root];
  const int carrier = top.uniform() ? root_local : 0;
  // One deadline for the whole operation, as all_reduce's.
  const core::Deadline deadline(timeout);
  const pg::Signature call = pg::Signature(OpType::kBroadcast, seq).of(t).from(root);
  agree_on_host(call, left_of(deadline, timeout));
  std::vector<Tensor> whole = {t};
  pg::BroadcastOptions bo;
  bo.async_op = false;
  if (top.host == root_host && local_) {
    bo.root_rank = root_local;
    bo.timeout = left_of(deadline, timeout);
    step(local_, [&](pg::Backend& b) { return b.broadcast(whole, bo); });
  }
  if (ring_ && top.local_rank == carrier) {
    ring_->broadcast(t.data(), t.nbytes(), root_host, left_of(deadline, timeout), call);
  } else if (cross_ && top.local_rank == carrier) {
    agree_between_hosts(call, carrier, left_of(deadline, timeout));
    bo.root_rank = root_host;
    bo.timeout = left_of(deadline, timeout);
    step(cross_, [&](pg::Backend& b) { return b.broadcast(whole, bo); });
  }
  if (top.host != root_host && local_) {
    bo.root_rank = carrier;
    bo.timeout = left_of(deadline, timeout);
    step(local_, [&](pg::Backend& b) { return b.broadcast(whole, bo); });
  }
  settle_hosts(left_of(deadline, timeout));
}

// The first step of a rooted operation on every host: its ranks compare their calls (one
// all-gather of the signatures), as the carriers' steps between hosts compare theirs. Only
// the carriers' calls meet there, and a host's own steps (shm's) see only their part of the
// call (a root on another host is not theirs), so a difference on a host would otherwise go
// unseen by the other hosts' ranks.
void HierBackend::agree_on_host(const pg::Signature& call, Millis timeout) {
  if (!local_ || topology_.host_count() == 1) return;
  agree(local_, topology_.local_size(), call, timeout,
        [&](int l) { return topology_.hosts[topology_.host][l]; });
}

// The carriers' calls, compared before their step between hosts: that step sees only the
// root's host, so a rank alone on its host that named another root on the same host (or a
// carrier whose host agreed on another root there) would pass it.
void HierBackend::agree_between_hosts(const pg::Signature& call, int carrier, Millis timeout) {
  agree(cross_, topology_.host_count(), call, timeout,
        [&](int h) { return topology_.hosts[h][carrier]; });
}

// One all-gather of the members' signatures over `group` (n members; rank_of(i): member i's
// global rank): every member fails naming the first whose call differs from its own.
void HierBackend::agree(const std::shared_ptr<pg::Backend>& group, int n, const pg::Signature& call,
                        Millis timeout, const std::function<int(int)>& rank_of) {
  constexpr int64_t kWords = sizeof(pg::Signature) / sizeof(int64_t);
  Tensor mine = Tensor::empty({kWords}, core::DType::kInt64);
  Tensor all = Tensor::empty({kWords * n}, core::DType::kInt64);
  std::memcpy(mine.data(), &call, sizeof call);
  pg::AllgatherOptions o;
  o.timeout = timeout;
  o.async_op = false;
  step(group, [&](pg::Backend& b) { return b.allgather_base(all, mine, o); });
  const auto* records = static_cast<const pg::Signature*>(all.data());
  for (int i = 0; i < n; ++i) {
    if (records[i] == call) continue;
    throw core::DistBackendError(str_cat("hier ", call.str(), ": rank ", rank_of(i), " called ",
                                         records[i].str(),
                                         ": the ranks called different collectives"));
  }
}

// The last step of a rooted operation on every host: the ranks whose part ended before the
// network's (the root's host in a broadcast, the senders of a reduce) wait for their carrier,
// so that a failure between hosts (ranks that called different collectives) fails them too
// instead of some ranks returning.
void HierBackend::settle_hosts(Millis timeout) {
  if (!local_ || topology_.host_count() == 1) return;
  pg::BarrierOptions o;
  o.timeout = timeout;
  o.async_op = false;
  step(local_, [&](pg::Backend& b) { return b.barrier(o); });
}

WorkPtr HierBackend::reduce(std::vector<Tensor>& tensors, const pg::ReduceOptions& opts) {
  if (!hierarchical(tensors) || !groups_freely(opts.reduce_op) || opts.root_tensor != 0) {
    return world_->reduce(tensors, opts);
  }
  Tensor t = tensors[0];
  const int root = static_cast<int>(opts.root_rank);
  const ReduceOp op = opts.reduce_op;
  const Millis timeout = effective_timeout(opts.timeout);
  return submit(
      OpType::kReduce, "reduce", timeout, opts.async_op,
      [this, t, root, op, timeout](uint64_t seq) mutable { run_reduce(t, root, op, timeout, seq); },
      tensors);
}

// Every host reduces to its carrier (the root's local rank, or the first), the carriers
// reduce to the root's host, whose carrier hands the result to the root if it is not the root.
// Only the root's tensor changes: a carrier that is not the root works on a copy.
void HierBackend::run_reduce(Tensor& t, int root, const ReduceOp& op, Millis timeout,
                             uint64_t seq) {
  const core::Deadline deadline(timeout);  // for the whole operation
  const pg::Signature call = pg::Signature(OpType::kReduce, seq).of(t).with(op).from(root);
  agree_on_host(call, left_of(deadline, timeout));
  const Topology& top = topology_;
  const int root_host = host_of_[root], root_local = local_rank_of_[root];
  const int carrier = top.uniform() ? root_local : 0;
  const bool carries = top.local_rank == carrier;
  const bool is_root = rank() == root;
  Tensor acc = t;
  if (carries && !is_root) {
    acc = Tensor::empty(t.sizes(), t.dtype());
    std::copy_n(static_cast<const char*>(t.data()), t.nbytes(), static_cast<char*>(acc.data()));
  }
  std::vector<Tensor> mine = {carries ? acc : t};
  pg::ReduceOptions ro;
  ro.reduce_op = step_op(op);
  ro.async_op = false;
  if (local_) {
    ro.root_rank = carrier;
    ro.timeout = left_of(deadline, timeout);
    step(local_, [&](pg::Backend& b) { return b.reduce(mine, ro); });
  }
  if (cross_ && carries) {
    agree_between_hosts(call, carrier, left_of(deadline, timeout));
    ro.root_rank = root_host;
    ro.timeout = left_of(deadline, timeout);
    step(cross_, [&](pg::Backend& b) { return b.reduce(mine, ro); });
  }
  if (top.host == root_host && root_local != carrier && local_) {
    if (carries) {
      step(local_, [&](pg::Backend& b) { return b.send(mine, root_local, 0); });
    } else if (is_root) {
      std::vector<Tensor> into = {t};
      step(local_, [&](pg::Backend& b) { return b.recv(into, carrier, 0); });
    }
  }
  settle_hosts(left_of(deadline, timeout));
  if (is_root) core::apply_postdiv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), op, size());
}

WorkPtr HierBackend::barrier(const pg::BarrierOptions& opts) {
  // Through the worker: the operations queued before it finish first. Its timeout is the one
  // in force when it was submitted, as for the other operations.
  pg::BarrierOptions o = opts;
  o.timeout = effective_timeout(opts.timeout);
  o.async_op = false;
  return submit(OpType::kBarrier, "barrier", o.timeout, opts.async_op,
                [this, o](uint64_t) { world_->barrier(o)->wait(); }, {});
}

// --- Everything else: the Gloo group of all ranks ---------------------------------------

WorkPtr HierBackend::allgather(std::vector<std::vector<Tensor>>& outputs,
                               std::vector<Tensor>& inputs, const pg::AllgatherOptions& opts) {
  return world_->allgather(outputs, inputs, opts);
}
WorkPtr HierBackend::allgather_base(Tensor& output, Tensor& input,
                                    const pg::AllgatherOptions& opts) {
  return world_->allgather_base(output, input, opts);
}
WorkPtr HierBackend::gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                            const pg::GatherOptions& opts) {
  return world_->gather(outputs, inputs, opts);
}
WorkPtr HierBackend::scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                             const pg::ScatterOptions& opts) {
  return world_->scatter(outputs, inputs, opts);
}
WorkPtr HierBackend::reduce_scatter(std::vector<Tensor>& outputs,
                                    std::vector<std::vector<Tensor>>& inputs,
                                    const pg::ReduceScatterOptions& opts) {
  return world_->reduce_scatter(outputs, inputs, opts);
}
WorkPtr HierBackend::reduce_scatter_base(Tensor& output, Tensor& input,
                                         const pg::ReduceScatterOptions& opts) {
  return world_->reduce_scatter_base(output, input, opts);
}
WorkPtr HierBackend::alltoall_base(Tensor& output, Tensor& input,
                                   std::vector<int64_t>& output_split_sizes,
                                   std::vector<int64_t>& input_split_sizes,
                                   const pg::AllToAllOptions& opts) {
  return world_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}
WorkPtr HierBackend::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                              const pg::AllToAllOptions& opts) {
  return world_->alltoall(outputs, inputs, opts);
}
WorkPtr HierBackend::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  return world_->send(tensors, dst_rank, tag);
}
WorkPtr HierBackend::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  return world_->recv(tensors, src_rank, tag);
}
WorkPtr HierBackend::recv_anysource(std::vector<Tensor>& tensors, int tag) {
  return world_->recv_anysource(tensors, tag);
}
void HierBackend::monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) {
  world_->monitored_barrier(opts, wait_all_ranks);
}

}  // namespace c10d::backends::hier
