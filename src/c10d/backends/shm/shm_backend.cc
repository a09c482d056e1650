// ShmBackend: the pg::Backend overrides, which turn tensors into calls of the algorithms (see
// shm_backend.h). The step protocol they run over is described in step_channel.h, the
// algorithms in collectives.h, the point-to-point engine in p2p.h; operations run on the
// shared pg::OpQueue.
#include "c10d/backends/shm/shm_backend.h"

#include <utility>

#include "c10d/backends/shm/alias.h"
#include "c10d/backends/shm/collectives.h"
#include "c10d/backends/shm/p2p.h"
#include "c10d/backends/shm/segment.h"
#include "c10d/core/blocking.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"

namespace c10d::backends::shm {

using core::DistBackendError;
using core::DType;
using core::OpType;
using core::ReduceOp;
using core::Tensor;
using core::detail::str_cat;
using detail::copy;
using pg::Millis;
using pg::wants_async;
using pg::WorkPtr;

ShmBackend::ShmBackend(std::shared_ptr<store::Store> store, int rank, int size, ShmOptions opts)
    : pg::Backend(rank, size, opts.timeout), store_(std::move(store)) {
  // Before any buffer can be adopted: their owners release them through the registry.
  pg::register_adopted_memory_handlers(
      {.release = &release_aliases_in, .forget = &forget_aliases_in});
  size_t heap = opts.heap_bytes;
  if (heap == 0) heap = static_cast<size_t>(core::env_int(core::kEnvShmHeapBytes));
  const Millis rendezvous_timeout =
      opts.timeout > Millis::zero() ? opts.timeout : store_->timeout();
  segment_ = std::make_shared<Segment>(*store_, rank, size, heap, rendezvous_timeout);
  const int cpu = segment_->bind_cpu();
  if (cpu >= 0 && core::log_enabled(core::LogLevel::kDebug)) {
    core::log(core::LogLevel::kDebug,
              str_cat("shm rank ", rank, " of ", size, ": ", size, " ranks share ",
                      segment_->cpus(), " CPUs, pinned to cpu ", cpu, " (C10D_SHM_BIND)"));
  }
  channel_ = std::make_shared<StepChannel>(segment_, cpu >= 0);
  algo::calibrate(*channel_, rendezvous_timeout);  // before any operation can be submitted
  p2p_ = std::make_shared<P2PEngine>(segment_, channel_);
  sent_ = std::make_shared<core::Work>(OpType::kSend, "shm:send");
  sent_->finish();
  auto queue = pg::OpQueue::Config::of("shm", "", rank, size);
  // Waking the worker for every asynchronous operation costs more than the operation (see
  // docs/design/shm.md#operation-queue): it polls while they are in use.
  queue.poll_while_async = true;
  queue.hooks.before = [channel = channel_](const pg::QueuedOp& op) {
    channel->begin(op.name, op.type, op.seq, op.timeout);
  };
  queue.hooks.after = [channel = channel_] {
    channel->end();
  };
  queue_ = std::make_shared<pg::OpQueue>(std::move(queue));
}

WorkPtr ShmBackend::submit(OpType type, const char* name, Millis timeout, bool async, Body body,
                           std::vector<Tensor> outputs) {
  return queue_->submit(
      type, name, effective_timeout(timeout), async,
      [channel = channel_.get(), body = std::move(body)](const pg::QueuedOp&) { body(*channel); },
      std::move(outputs));
}

void ShmBackend::finish_pending(Millis timeout) { queue_->finish_pending(timeout); }

void ShmBackend::shutdown() {
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mutex_);
  const bool stopped = queue_->stop([this](bool running) {
    // An operation cut short here fails (StepChannel::fail marks it too, but only once it
    // notices): peers still reading this rank's buffers must know before this returns.
    if (running) segment_->header(rank())->abandoned.store(1, std::memory_order_seq_cst);
  });
  if (!stopped) return;
  channel_->abort();
  // Peers blocked on this rank fail at once instead of at their timeout.
  segment_->header(rank())->closed.store(1, std::memory_order_release);
  // A running operation notices `aborted` within a few milliseconds.
  queue_->join();
  // Adopted arrays keep their shared pages (and so the segment) until they are freed: moving
  // them back now would lose what other threads write into them meanwhile (alias.h).
}

ShmBackend::~ShmBackend() { shutdown(); }

uint64_t ShmBackend::next_sequence() const { return queue_->next_sequence(); }

std::optional<bool> ShmBackend::cpus_far_apart() const { return channel_->far_apart(); }

namespace {

// The bytes of a C-contiguous tensor of `sizes` and `dtype` (InvalidArgument for a negative
// size).
size_t tensor_bytes(const std::vector<int64_t>& sizes, DType dtype) {
  int64_t numel = 1;
  for (int64_t s : sizes) {
    C10D_CHECK_ARG(s >= 0, "shm_empty: negative size ", s);
    numel *= s;
  }
  return static_cast<size_t>(numel) * core::element_size(dtype);
}

// The tensor on rank `rank`'s heap block [offset, offset + bytes), which it gives back when
// the last view of it goes.
Tensor heap_tensor(const std::shared_ptr<Segment>& segment, int rank, size_t offset, size_t bytes,
                   std::vector<int64_t> sizes, DType dtype) {
  char* data = segment->heap(rank) + offset;
  std::shared_ptr<void> owner(
      data, [segment, offset, bytes](void*) { segment->own_heap().release(offset, bytes); });
  return Tensor(data, dtype, std::move(sizes), {}, std::move(owner));
}

}  // namespace

Tensor ShmBackend::empty(std::vector<int64_t> sizes, DType dtype) {
  const size_t bytes = tensor_bytes(sizes, dtype);
  const size_t offset = segment_->own_heap().allocate(bytes);
  return heap_tensor(segment_, rank(), offset, bytes, std::move(sizes), dtype);
}

bool ShmBackend::in_shared_heap(const void* data, size_t bytes) const {
  return segment_->heap_offset(data, bytes) >= 0;
}

pg::Backend::Adoption ShmBackend::adopt(void* data, size_t bytes) {
  // Without cross-memory attach the bytes outside the whole pages could not be reached, so
  // the backend would never use the alias.
  if (!segment_->cma()) return Adoption::kRefused;
  // The worker thread, a thread waiting on a receive, or a peer may write into the buffer for
  // an operation in flight, and a write between the copy and the remapping would be lost:
  // adopt only while none is.
  return queue_->while_held([&](pg::OpQueue::State state) {
    if (state == pg::OpQueue::State::kStopped) return Adoption::kRefused;
    if (state == pg::OpQueue::State::kBusy || p2p_->receiving()) return Adoption::kBusy;
    return adopt_into_heap(segment_, data, bytes) ? Adoption::kDone : Adoption::kRefused;
  });
}

bool ShmBackend::adopted(const void* data, size_t bytes, bool verify) const {
  const AliasedPart part = find_alias(*segment_, data, bytes, verify);
  return part.hi > part.lo;
}

std::optional<Tensor> ShmBackend::empty_for_collectives(const std::vector<int64_t>& sizes,
                                                        DType dtype) {
  const size_t bytes = tensor_bytes(sizes, dtype);
  const std::optional<size_t> offset = segment_->own_heap().try_allocate(bytes);
  if (!offset) return std::nullopt;  // the heap is full: the caller takes plain memory
  return heap_tensor(segment_, rank(), *offset, bytes, sizes, dtype);
}

// ---------------------------------------------------------------------------------------------
// Collectives

WorkPtr ShmBackend::broadcast(std::vector<Tensor>& tensors, const pg::BroadcastOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  const size_t root_tensor = static_cast<size_t>(opts.root_tensor);
  return submit(
      OpType::kBroadcast, "broadcast", opts.timeout, wants_async(opts),
      [tensors, root, root_tensor](StepChannel& ch) {
        const Tensor& source = tensors[root_tensor];
        algo::broadcast(ch, source.data_as<char>(), source.nbytes(), source.dtype(), root);
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (i != root_tensor) copy(tensors[i].data(), source.data(), source.nbytes());
        }
      },
      tensors);
}

namespace {

// Several tensors per rank: reduce them locally (each scaled for PREMUL_SUM) into one buffer.
Tensor combine_local(const std::vector<Tensor>& tensors, const ReduceOp& op) {
  const size_t n = static_cast<size_t>(tensors[0].numel());
  const DType dtype = tensors[0].dtype();
  Tensor acc = tensors[0].contiguous_copy();
  core::apply_premul(acc.data(), n, dtype, op);
  for (size_t i = 1; i < tensors.size(); ++i) {
    Tensor t = tensors[i];
    if (op.kind == ReduceOp::PREMUL_SUM) {
      t = t.contiguous_copy();
      core::apply_premul(t.data(), n, dtype, op);
    }
    core::reduce(acc.data(), t.data(), n, dtype, op);
  }
  return acc;
}

}  // namespace

WorkPtr ShmBackend::allreduce(std::vector<Tensor>& tensors, const pg::AllreduceOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kAllreduce, "allreduce", opts.timeout, wants_async(opts),
      [tensors, op](StepChannel& ch) {
        const Tensor& t = tensors[0];
        const size_t n = static_cast<size_t>(t.numel());
        if (tensors.size() == 1) {
          algo::allreduce(ch, t.data_as<char>(), t.data_as<char>(), n, t.dtype(), op, -1);
          return;
        }
        Tensor acc = combine_local(tensors, op);
        algo::allreduce(ch, acc.data_as<char>(), acc.data_as<char>(), n, t.dtype(), op, -1, true);
        for (const Tensor& out : tensors) copy(out.data(), acc.data(), acc.nbytes());
      },
      tensors);
}

namespace {

const char* inline_name(OpType type) {
  switch (type) {
    case OpType::kAllreduce:
      return "allreduce";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kReduce:
      return "reduce";
    case OpType::kAllgatherBase:
      return "allgather_base";
    case OpType::kReduceScatterBase:
      return "reduce_scatter_base";
    case OpType::kAlltoallBase:
      return "alltoall_base";
    case OpType::kAllgather:
      return "allgather";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kGather:
      return "gather";
    case OpType::kScatter:
      return "scatter";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kSend:
      return "send";
    case OpType::kRecv:
      return "recv";
    default:
      return nullptr;
  }
}

void run_inline_op(StepChannel& ch, const pg::InlineOp& op) {
  const pg::DenseView& in = op.input;
  const pg::DenseView& out = op.output;
  const bool root = ch.rank() == op.root;
  switch (op.type) {
    case OpType::kAllreduce:
      return algo::allreduce(ch, in.bytes(), in.bytes(), in.numel, in.dtype, op.reduce_op, -1);
    case OpType::kBroadcast:
      return algo::broadcast(ch, in.bytes(), in.nbytes(), in.dtype, op.root);
    case OpType::kReduce:
      return algo::allreduce(ch, in.bytes(), root ? in.bytes() : nullptr, in.numel, in.dtype,
                             op.reduce_op, op.root);
    case OpType::kAllgatherBase: {
      const size_t per = in.nbytes();
      return algo::allgather(ch, in.bytes(), per, in.dtype,
                             [&](int r) { return out.bytes() + r * per; });
    }
    case OpType::kAllgather:
      return algo::allgather(ch, in.bytes(), in.nbytes(), in.dtype,
                             [&](int r) { return op.list[r].bytes(); });
    case OpType::kReduceScatterBase:
      return algo::reduce_scatter_flat(ch, in.bytes(), out.bytes(), out.numel, out.dtype,
                                       op.reduce_op);
    case OpType::kReduceScatter:
      return algo::reduce_scatter(
          ch, [&](int j) { return static_cast<const char*>(op.list[j].bytes()); }, out.bytes(),
          out.numel, out.dtype, op.reduce_op);
    case OpType::kAlltoallBase:
      return algo::alltoall_equal(ch, in.bytes(), out.bytes(), in.nbytes() / ch.size(), in.dtype);
    case OpType::kGather:
      return algo::gather(ch, in.bytes(), in.nbytes(), in.dtype, op.root,
                          [&](int r) { return op.list[r].bytes(); });
    case OpType::kScatter:
      return algo::scatter(
          ch, [&](int j) { return op.list[j].bytes(); }, out.bytes(), out.nbytes(), out.dtype,
          op.root);
    case OpType::kBarrier:
      return ch.barrier();
    default:
      throw core::NotSupported(str_cat("shm: no inline ", core::op_type_name(op.type)));
  }
}

}  // namespace

bool ShmBackend::has_inline(OpType type) const { return inline_name(type) != nullptr; }

WorkPtr ShmBackend::run_inline(const pg::InlineOp& op) {
  if (op.type == OpType::kSend || op.type == OpType::kRecv) {
    // Point to point has its own channels: no place in the collectives' queue.
    const pg::DenseView& v = op.type == OpType::kSend ? op.input : op.output;
    return post_p2p(op.type, v.bytes(), v.nbytes(), v.dtype, op.root, op.tag, op.timeout, op.hold);
  }
  const char* name = inline_name(op.type);
  // The kind its steps show peers, which may run the same call on the general path: that one
  // sends a list all_gather as the allgather_base of its input (Backend::allgather_coalesced).
  const OpType kind = op.type == OpType::kAllgather ? OpType::kAllgatherBase : op.type;
  const pg::OpQueue::RunNow now(*queue_, name);  // the channel is this thread's while it is held
  if (!now.seq()) {
    // Earlier asynchronous operations are queued (or the backend is shut down): queue this
    // one behind them and wait, which keeps the order and reports the state.
    core::before_blocking();
    submit(kind, name, op.timeout, false, [&op](StepChannel& ch) { run_inline_op(ch, op); }, {})
        ->wait();
    return nullptr;
  }
  channel_->begin(name, kind, *now.seq(), effective_timeout(op.timeout));
  run_inline_op(*channel_, op);
  channel_->end();
  return nullptr;
}

WorkPtr ShmBackend::reduce(std::vector<Tensor>& tensors, const pg::ReduceOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const int root = static_cast<int>(opts.root_rank);
  const Tensor tensor = tensors[static_cast<size_t>(opts.root_tensor)];
  return submit(
      OpType::kReduce, "reduce", opts.timeout, wants_async(opts),
      [tensor, op, root](StepChannel& ch) {
        char* out = ch.rank() == root ? tensor.data_as<char>() : nullptr;
        algo::allreduce(ch, tensor.data_as<char>(), out, static_cast<size_t>(tensor.numel()),
                        tensor.dtype(), op, root);
      },
      tensors);
}

WorkPtr ShmBackend::allgather_base(Tensor& output, Tensor& input,
                                   const pg::AllgatherOptions& opts) {
  return submit(OpType::kAllgatherBase, "allgather_base", opts.timeout, wants_async(opts),
                [output, input](StepChannel& ch) {
                  const size_t per = input.nbytes();
                  algo::allgather(ch, input.data_as<char>(), per, input.dtype(),
                                  [&](int r) { return output.data_as<char>() + r * per; });
                },
                {output});
}

WorkPtr ShmBackend::allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                    std::vector<Tensor>& inputs,
                                                    const pg::AllgatherOptions& opts) {
  return submit(
      OpType::kAllgatherCoalesced, "allgather_into_tensor_coalesced", opts.timeout,
      wants_async(opts),
      [outputs, inputs](StepChannel& ch) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          const size_t per = inputs[i].nbytes();
          char* out = outputs[i].data_as<char>();
          algo::allgather(ch, inputs[i].data_as<char>(), per, inputs[i].dtype(),
                          [&](int r) { return out + r * per; });
        }
      },
      outputs);
}

WorkPtr ShmBackend::gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                           const pg::GatherOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  std::vector<Tensor> gathered = rank() == root ? outputs[0] : std::vector<Tensor>{};
  const Tensor input = inputs[0];
  return submit(
      OpType::kGather, "gather", opts.timeout, wants_async(opts),
      [gathered, input, root](StepChannel& ch) {
        algo::gather(ch, input.data_as<char>(), input.nbytes(), input.dtype(), root,
                     [&](int r) { return gathered[r].data_as<char>(); });
      },
      gathered);
}

WorkPtr ShmBackend::scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                            const pg::ScatterOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  std::vector<Tensor> sources = rank() == root ? inputs[0] : std::vector<Tensor>{};
  const Tensor output = outputs[0];
  return submit(OpType::kScatter, "scatter", opts.timeout, wants_async(opts),
                [sources, output, root](StepChannel& ch) {
                  algo::scatter(
                      ch, [&](int j) { return sources[j].data_as<const char>(); },
                      output.data_as<char>(), output.nbytes(), output.dtype(), root);
                },
                {output});
}

WorkPtr ShmBackend::reduce_scatter(std::vector<Tensor>& outputs,
                                   std::vector<std::vector<Tensor>>& inputs,
                                   const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const Tensor output = outputs[0];
  const std::vector<Tensor> pieces = inputs[0];
  return submit(OpType::kReduceScatter, "reduce_scatter", opts.timeout, wants_async(opts),
                [output, pieces, op](StepChannel& ch) {
                  algo::reduce_scatter(
                      ch, [&](int j) { return pieces[j].data_as<const char>(); },
                      output.data_as<char>(), static_cast<size_t>(output.numel()), output.dtype(),
                      op);
                },
                {output});
}

namespace {

void reduce_scatter_flat(StepChannel& ch, const Tensor& output, const Tensor& input,
                         const ReduceOp& op) {
  algo::reduce_scatter_flat(ch, input.data_as<char>(), output.data_as<char>(),
                            static_cast<size_t>(output.numel()), output.dtype(), op);
}

}  // namespace

WorkPtr ShmBackend::reduce_scatter_base(Tensor& output, Tensor& input,
                                        const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kReduceScatterBase, "reduce_scatter_base", opts.timeout, wants_async(opts),
      [output, input, op](StepChannel& ch) { reduce_scatter_flat(ch, output, input, op); },
      {output});
}

WorkPtr ShmBackend::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                    std::vector<Tensor>& inputs,
                                                    const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kReduceScatterBase, "reduce_scatter_tensor_coalesced", opts.timeout,
      wants_async(opts),
      [outputs, inputs, op](StepChannel& ch) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          reduce_scatter_flat(ch, outputs[i], inputs[i], op);
        }
      },
      outputs);
}

WorkPtr ShmBackend::alltoall_base(Tensor& output, Tensor& input,
                                  std::vector<int64_t>& output_split_sizes,
                                  std::vector<int64_t>& input_split_sizes,
                                  const pg::AllToAllOptions& opts) {
  const std::vector<int64_t> out_splits = output_split_sizes;
  const std::vector<int64_t> in_splits = input_split_sizes;
  return submit(OpType::kAlltoallBase, "alltoall_base", opts.timeout, wants_async(opts),
                [output, input, out_splits, in_splits](StepChannel& ch) {
                  const int n = ch.size();
                  // Splits count rows of dimension 0; empty splits mean equal parts.
                  auto layout = [n](const Tensor& t, const std::vector<int64_t>& splits,
                                    std::vector<size_t>& offsets, std::vector<size_t>& lens) {
                    const int64_t rows = t.dim() == 0 ? 1 : t.sizes()[0];
                    const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
                    size_t at = 0;
                    for (int r = 0; r < n; ++r) {
                      const size_t len =
                          static_cast<size_t>(splits.empty() ? rows / n : splits[r]) * row_bytes;
                      offsets.push_back(at);
                      lens.push_back(len);
                      at += len;
                    }
                  };
                  std::vector<size_t> in_off, in_len, out_off, out_len;
                  layout(input, in_splits, in_off, in_len);
                  layout(output, out_splits, out_off, out_len);
                  std::vector<const char*> send(n);
                  std::vector<char*> recv(n);
                  for (int r = 0; r < n; ++r) {
                    send[r] = input.data_as<char>() + in_off[r];
                    recv[r] = output.data_as<char>() + out_off[r];
                  }
                  algo::alltoall(ch, send, in_len, recv, out_len, input.dtype());
                },
                {output});
}

WorkPtr ShmBackend::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                             const pg::AllToAllOptions& opts) {
  return submit(
      OpType::kAlltoall, "alltoall", opts.timeout, wants_async(opts),
      [outputs, inputs](StepChannel& ch) {
        const int n = ch.size();
        std::vector<const char*> send(n);
        std::vector<char*> recv(n);
        std::vector<size_t> send_len(n), recv_len(n);
        for (int r = 0; r < n; ++r) {
          send[r] = inputs[r].data_as<char>();
          send_len[r] = inputs[r].nbytes();
          recv[r] = outputs[r].data_as<char>();
          recv_len[r] = outputs[r].nbytes();
        }
        algo::alltoall(ch, send, send_len, recv, recv_len, inputs[0].dtype());
      },
      outputs);
}

WorkPtr ShmBackend::barrier(const pg::BarrierOptions& opts) {
  return submit(OpType::kBarrier, "barrier", opts.timeout, wants_async(opts),
                [](StepChannel& ch) { ch.barrier(); }, {});
}

void ShmBackend::monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) {
  pg::BarrierOptions sync_opts = opts;
  sync_opts.async_op = false;
  // Rank 0 waits for the others as long as the caller asked; they wait for rank 0 as long as
  // for any operation (pg::monitored_barrier_release_wait).
  const Millis monitored = opts.timeout > Millis::zero() ? opts.timeout : timeout();
  const Millis wait =
      rank() == 0 ? monitored : pg::monitored_barrier_release_wait(timeout(), monitored);
  WorkPtr work = submit(OpType::kBarrier, "monitored_barrier", wait, false,
                        [wait_all_ranks, monitored](StepChannel& ch) {
                          algo::monitored_barrier(ch, wait_all_ranks, monitored);
                        },
                        {});
  work->wait();
}

// ---------------------------------------------------------------------------------------------
// Point to point

WorkPtr ShmBackend::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  return post_p2p(OpType::kSend, tensors[0], dst_rank, tag);
}

WorkPtr ShmBackend::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  return post_p2p(OpType::kRecv, tensors[0], src_rank, tag);
}

WorkPtr ShmBackend::recv_anysource(std::vector<Tensor>& tensors, int tag) {
  return post_p2p(OpType::kRecvAnySource, tensors[0], -1, tag);
}

WorkPtr ShmBackend::post_p2p(OpType type, Tensor tensor, int peer, int tag) {
  const pg::BufferHold hold{[](const void* t) { return *static_cast<const Tensor*>(t); }, &tensor};
  return post_p2p(type, tensor.data_as<char>(), tensor.nbytes(), tensor.dtype(), peer, tag,
                  pg::kUnsetTimeout, hold);
}

WorkPtr ShmBackend::post_p2p(OpType type, char* data, size_t bytes, core::DType dtype, int peer,
                             int tag, Millis timeout, const pg::BufferHold& hold) {
  auto op = std::make_shared<P2POp>();
  op->is_send = type == OpType::kSend;
  op->peer = peer;
  op->tag = tag;
  op->data = data;
  op->bytes = bytes;
  op->dtype = dtype;
  op->timeout = effective_timeout(timeout);  // read once: set_timeout may run concurrently
  const char* name = op->is_send             ? "shm:send"
                     : type == OpType::kRecv ? "shm:recv"
                                             : "shm:recv_anysource";
  if (channel_->aborted()) {
    auto error = std::make_exception_ptr(
        DistBackendError(str_cat("shm ", p2p_->describe(*op), ": the backend was shut down")));
    if (!hold) std::rethrow_exception(error);
    auto work = std::make_shared<core::Work>(type, name);
    work->finish_with_error(error);
    return work;
  }
  const bool finished = p2p_->post(op);
  if (!hold) {
    // Synchronous (inline): no Work, so the op's own state tells how it ended.
    if (!finished) p2p_->wait(op, core::kNoTimeout);
    if (op->error) std::rethrow_exception(op->error);
    return nullptr;
  }
  // A send that ended as it was posted (a small message) has nothing of its own to report.
  if (finished && op->is_send && !op->error) return sent_;
  auto work = std::make_shared<detail::P2PWork>(type, name, p2p_, op);
  p2p_->attach(op, work, hold());
  return work;
}

}  // namespace c10d::backends::shm
