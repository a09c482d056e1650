// MpiBackend's collectives, broadcast to barrier: each posts non-blocking MPI calls through the
// progress thread, with the copies and scaling MPI does not do (see mpi_backend.h).
#include "c10d/backends/mpi/mpi_backend.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>

#include "c10d/backends/mpi/datatypes.h"
#include "c10d/backends/mpi/internal.h"
#include "c10d/backends/mpi/nbc_algorithms.h"
#include "c10d/backends/mpi/progress_thread.h"
#include "c10d/core/reduce.h"

namespace c10d::backends::mpi {

using core::data_or_dummy;
using core::DType;
using core::OpType;
using core::ReduceOp;
using core::Tensor;
using detail::Buffer;
using detail::bytes_of;
using detail::check;
using detail::check_call;
using detail::count_of;
using detail::make_op;
using detail::mpi_op;
using detail::nbc_algorithms;
using detail::OpPtr;
using detail::ProgressThread;
using detail::single;
using detail::typed;
using pg::Signature;

namespace {

std::vector<int64_t> as_int64(const std::vector<int>& counts) {
  return std::vector<int64_t>(counts.begin(), counts.end());
}

// Whether `t`'s data may travel in its call's check (Op::pack).
bool fits_check(const Tensor& t) { return t.is_contiguous() && t.nbytes() <= detail::kInlineBytes; }

// Has a small reduction travel in its check: every rank packs its (premultiplied) input, and a
// rank that `receives` the result combines them all in rank order (each gets the same bits).
void reduce_in_check(detail::Op& op, const Tensor& t, const ReduceOp& rop, bool receives) {
  if (!fits_check(t)) return;
  op.pack = [t, rop](std::byte* slot) {
    std::memcpy(slot, t.data(), t.nbytes());
    core::apply_premul(slot, static_cast<size_t>(t.numel()), t.dtype(), rop);
  };
  op.unpack = [t, rop, receives, n = static_cast<size_t>(op.group->size)](const std::byte* slots,
                                                                          size_t stride) {
    if (!receives) return;
    std::vector<const void*> sources(n);
    for (size_t r = 0; r < n; ++r) sources[r] = slots + r * stride;
    core::reduce_many(t.data(), sources.data(), n, static_cast<size_t>(t.numel()), t.dtype(), rop);
  };
}

}  // namespace

WorkPtr MpiBackend::broadcast(std::vector<Tensor>& tensors, const pg::BroadcastOptions& opts) {
  const Tensor t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.root_rank);
  OpPtr op = make_op(group_, OpType::kBroadcast, "broadcast", {t});
  check_call(*op, Signature(OpType::kBroadcast, 0).of(t).from(root));
  if (fits_check(t)) {
    const bool is_root = rank() == root;
    op->pack = [t, is_root](std::byte* slot) {
      if (is_root) std::memcpy(slot, t.data(), t.nbytes());
    };
    op->unpack = [t, is_root, root](const std::byte* slots, size_t stride) {
      if (!is_root) std::memcpy(t.data(), slots + static_cast<size_t>(root) * stride, t.nbytes());
    };
  }
  MPI_Comm comm = group_->comm;
  op->start = [t, root, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(t, "broadcast");
    r.emplace_back();
    check(MPI_Ibcast(b.data, b.count, b.type, root, comm, &r.back()), "MPI_Ibcast");
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::allreduce(std::vector<Tensor>& tensors, const pg::AllreduceOptions& opts) {
  const Tensor t = single(tensors, "allreduce");
  const ReduceOp rop = opts.reduce_op;
  const int n = size();
  OpPtr op = make_op(group_, OpType::kAllreduce, "allreduce", {t});
  check_call(*op, Signature(OpType::kAllreduce, 0).of(t).with(rop));
  reduce_in_check(*op, t, rop, true);
  MPI_Comm comm = group_->comm;
  op->start = [t, rop, n, comm](std::vector<MPI_Request>& r) {
    const size_t count = static_cast<size_t>(t.numel());
    core::apply_premul(t.data(), count, t.dtype(), rop);
    const Buffer b = typed(t, "allreduce");
    r.emplace_back();
    nbc_algorithms.allreduce(count * t.element_size(), n);
    check(MPI_Iallreduce(MPI_IN_PLACE, b.data, b.count, b.type, mpi_op(t.dtype(), rop), comm,
                         &r.back()),
          "MPI_Iallreduce");
  };
  op->done = [t, rop, n](const MPI_Status&) {
    core::apply_postdiv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), rop, n);
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::reduce(std::vector<Tensor>& tensors, const pg::ReduceOptions& opts) {
  const Tensor t = tensors.at(static_cast<size_t>(opts.root_tensor));
  const ReduceOp rop = opts.reduce_op;
  const int root = static_cast<int>(opts.root_rank);
  const bool is_root = rank() == root;
  const int n = size();
  OpPtr op = make_op(group_, OpType::kReduce, "reduce", tensors);
  check_call(*op, Signature(OpType::kReduce, 0).of(t).with(rop).from(root));
  reduce_in_check(*op, t, rop, is_root);
  MPI_Comm comm = group_->comm;
  // Ranks other than the root keep their tensor: a PREMUL_SUM scales a copy.
  auto input = std::make_shared<Tensor>(t);
  op->start = [t, rop, root, is_root, input, comm](std::vector<MPI_Request>& r) {
    const size_t count = static_cast<size_t>(t.numel());
    if (is_root) {
      core::apply_premul(t.data(), count, t.dtype(), rop);
    } else if (rop.kind == ReduceOp::PREMUL_SUM) {
      *input = t.contiguous_copy();
      core::apply_premul(input->data(), count, t.dtype(), rop);
    }
    const Buffer b = typed(*input, "reduce");
    r.emplace_back();
    nbc_algorithms.reduce();
    check(MPI_Ireduce(is_root ? MPI_IN_PLACE : b.data, is_root ? b.data : nullptr, b.count, b.type,
                      mpi_op(t.dtype(), rop), root, comm, &r.back()),
          "MPI_Ireduce");
  };
  op->done = [t, rop, n, is_root](const MPI_Status&) {
    if (is_root) core::apply_postdiv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), rop, n);
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::allgather_base(Tensor& output, Tensor& input,
                                   const pg::AllgatherOptions& opts) {
  const Tensor in = input, out = output;
  OpPtr op = make_op(group_, OpType::kAllgatherBase, "allgather_base", {output});
  check_call(*op, Signature(OpType::kAllgatherBase, 0).of(in));
  if (fits_check(in) && out.is_contiguous()) {
    op->pack = [in](std::byte* slot) {
      std::memcpy(slot, in.data(), in.nbytes());
    };
    op->unpack = [in, out, n = static_cast<size_t>(size())](const std::byte* slots, size_t stride) {
      auto* to = static_cast<std::byte*>(out.data());
      for (size_t r = 0; r < n; ++r)
        std::memcpy(to + r * in.nbytes(), slots + r * stride, in.nbytes());
    };
  }
  MPI_Comm comm = group_->comm;
  op->start = [in, out, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(in, "allgather");
    r.emplace_back();
    check(MPI_Iallgather(b.data, b.count, MPI_BYTE, data_or_dummy(out), b.count, MPI_BYTE, comm,
                         &r.back()),
          "MPI_Iallgather");
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                    std::vector<Tensor>& inputs,
                                                    const pg::AllgatherOptions& opts) {
  OpPtr op = make_op(group_, OpType::kAllgatherBase, "allgather_into_tensor_coalesced", outputs);
  check_call(*op, Signature(OpType::kAllgatherCoalesced, 0).of(inputs));
  MPI_Comm comm = group_->comm;
  op->start = [ins = inputs, outs = outputs, comm](std::vector<MPI_Request>& r) {
    for (size_t i = 0; i < ins.size(); ++i) {
      const Buffer b = bytes_of(ins[i], "allgather");
      r.emplace_back();
      check(MPI_Iallgather(b.data, b.count, MPI_BYTE, data_or_dummy(outs[i]), b.count, MPI_BYTE,
                           comm, &r.back()),
            "MPI_Iallgather");
    }
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                           const pg::GatherOptions& opts) {
  const Tensor in = single(inputs, "gather");
  const int root = static_cast<int>(opts.root_rank);
  const bool is_root = rank() == root;
  const std::vector<Tensor> gathered = is_root ? outputs.at(0) : std::vector<Tensor>{};
  const int n = size();
  OpPtr op = make_op(group_, OpType::kGather, "gather", gathered);
  check_call(*op, Signature(OpType::kGather, 0).of(in).from(root));
  MPI_Comm comm = group_->comm;
  auto scratch = std::make_shared<Tensor>();
  op->start = [in, root, is_root, n, scratch, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(in, "gather");
    if (is_root) *scratch = Tensor::empty({static_cast<int64_t>(in.nbytes()) * n}, DType::kUInt8);
    r.emplace_back();
    check(MPI_Igather(b.data, b.count, MPI_BYTE, is_root ? data_or_dummy(*scratch) : nullptr,
                      b.count, MPI_BYTE, root, comm, &r.back()),
          "MPI_Igather");
  };
  op->done = [gathered, scratch, is_root](const MPI_Status&) {
    if (!is_root) return;
    const char* from = scratch->data_as<char>();
    for (const Tensor& t : gathered) {
      if (t.nbytes() != 0) std::memcpy(t.data(), from, t.nbytes());
      from += t.nbytes();
    }
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                            const pg::ScatterOptions& opts) {
  const Tensor out = single(outputs, "scatter");
  const int root = static_cast<int>(opts.root_rank);
  const bool is_root = rank() == root;
  const std::vector<Tensor> sources = is_root ? inputs.at(0) : std::vector<Tensor>{};
  OpPtr op = make_op(group_, OpType::kScatter, "scatter", {out});
  check_call(*op, Signature(OpType::kScatter, 0).of(out).from(root));
  MPI_Comm comm = group_->comm;
  auto scratch = std::make_shared<Tensor>();
  op->start = [out, sources, is_root, root, scratch, comm](std::vector<MPI_Request>& r) {
    const Buffer b = bytes_of(out, "scatter");
    if (is_root) {
      *scratch =
          Tensor::empty({static_cast<int64_t>(out.nbytes() * sources.size())}, DType::kUInt8);
      char* to = scratch->data_as<char>();
      for (const Tensor& t : sources) {
        if (t.nbytes() != 0) std::memcpy(to, t.data(), t.nbytes());
        to += t.nbytes();
      }
    }
    r.emplace_back();
    check(MPI_Iscatter(is_root ? data_or_dummy(*scratch) : nullptr, b.count, MPI_BYTE, b.data,
                       b.count, MPI_BYTE, root, comm, &r.back()),
          "MPI_Iscatter");
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

namespace {

// Posts a reduce-scatter of `in` (size * out.numel() elements) into `out`; PREMUL_SUM's
// scaling is the caller's.
void post_reduce_scatter(const Tensor& out, const Tensor& in, const ReduceOp& rop, MPI_Comm comm,
                         std::vector<MPI_Request>& r) {
  const Buffer b = typed(out, "reduce_scatter");
  r.emplace_back();
  check(MPI_Ireduce_scatter_block(data_or_dummy(in), b.data, b.count, b.type,
                                  mpi_op(out.dtype(), rop), comm, &r.back()),
        "MPI_Ireduce_scatter_block");
}

}  // namespace

WorkPtr MpiBackend::reduce_scatter_base(Tensor& output, Tensor& input,
                                        const pg::ReduceScatterOptions& opts) {
  std::vector<Tensor> outputs{output}, inputs{input};
  return reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

WorkPtr MpiBackend::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                    std::vector<Tensor>& inputs,
                                                    const pg::ReduceScatterOptions& opts) {
  const ReduceOp rop = opts.reduce_op;
  const int n = size();
  OpPtr op = make_op(
      group_, OpType::kReduceScatterBase,
      outputs.size() == 1 ? "reduce_scatter_base" : "reduce_scatter_tensor_coalesced", outputs);
  check_call(*op, Signature(OpType::kReduceScatterBase, 0).of(outputs).with(rop));
  MPI_Comm comm = group_->comm;
  // Scaled copies of PREMUL_SUM inputs must live until the operation completes.
  auto sources = std::make_shared<std::vector<Tensor>>(inputs);
  op->start = [outs = outputs, sources, rop, comm](std::vector<MPI_Request>& r) {
    for (size_t i = 0; i < outs.size(); ++i) {
      if (rop.kind == ReduceOp::PREMUL_SUM) {
        Tensor& s = (*sources)[i];
        s = s.contiguous_copy();
        core::apply_premul(s.data(), static_cast<size_t>(s.numel()), s.dtype(), rop);
      }
      post_reduce_scatter(outs[i], (*sources)[i], rop, comm, r);
    }
  };
  op->done = [outs = outputs, rop, n](const MPI_Status&) {
    for (const Tensor& t : outs) {
      core::apply_postdiv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), rop, n);
    }
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::reduce_scatter(std::vector<Tensor>& outputs,
                                   std::vector<std::vector<Tensor>>& inputs,
                                   const pg::ReduceScatterOptions& opts) {
  const Tensor out = single(outputs, "reduce_scatter");
  const std::vector<Tensor>& pieces = inputs.at(0);
  // One contiguous input: the pieces one after another.
  Tensor flat = Tensor::empty({out.numel() * static_cast<int64_t>(pieces.size())}, out.dtype());
  char* to = flat.data_as<char>();
  for (const Tensor& t : pieces) {
    if (t.nbytes() != 0) std::memcpy(to, t.data(), t.nbytes());
    to += t.nbytes();
  }
  std::vector<Tensor> outs{out}, ins{flat};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

WorkPtr MpiBackend::alltoall_base(Tensor& output, Tensor& input,
                                  std::vector<int64_t>& output_split_sizes,
                                  std::vector<int64_t>& input_split_sizes,
                                  const pg::AllToAllOptions& opts) {
  const int n = size();
  // Split sizes count rows of dimension 0; MPI gets bytes per rank.
  auto byte_counts = [n](const Tensor& t, const std::vector<int64_t>& splits) {
    const int64_t rows = t.dim() == 0 ? 1 : t.sizes()[0];
    const int64_t row_bytes = rows == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / rows;
    std::vector<int> counts(n), displs(n);
    int64_t offset = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t bytes = (splits.empty() ? rows / n : splits[r]) * row_bytes;
      counts[r] = count_of(static_cast<size_t>(bytes), "alltoall part");
      displs[r] = count_of(static_cast<size_t>(offset), "alltoall offset");
      offset += bytes;
    }
    return std::make_pair(counts, displs);
  };
  auto send = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(
      byte_counts(input, input_split_sizes));
  auto recv = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(
      byte_counts(output, output_split_sizes));
  OpPtr op = make_op(group_, OpType::kAlltoallBase, "alltoall_base", {output});
  check_call(*op, Signature(OpType::kAlltoallBase, 0).of(input.dtype(), 0),
             pg::Traffic{as_int64(send->first), as_int64(recv->first)});
  MPI_Comm comm = group_->comm;
  op->start = [in = input, out = output, send, recv, comm](std::vector<MPI_Request>& r) {
    r.emplace_back();
    check(MPI_Ialltoallv(data_or_dummy(in), send->first.data(), send->second.data(), MPI_BYTE,
                         data_or_dummy(out), recv->first.data(), recv->second.data(), MPI_BYTE,
                         comm, &r.back()),
          "MPI_Ialltoallv");
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                             const pg::AllToAllOptions& opts) {
  const int n = size();
  auto layout = [n](const std::vector<Tensor>& ts) {
    std::vector<int> counts(n), displs(n);
    size_t offset = 0;
    for (int r = 0; r < n; ++r) {
      counts[r] = count_of(ts[r].nbytes(), "alltoall part");
      displs[r] = count_of(offset, "alltoall offset");
      offset += ts[r].nbytes();
    }
    return std::make_tuple(counts, displs, offset);
  };
  auto [send_counts, send_displs, send_total] = layout(inputs);
  auto [recv_counts, recv_displs, recv_total] = layout(outputs);
  auto in = std::make_shared<Tensor>(
      Tensor::empty({static_cast<int64_t>(std::max<size_t>(send_total, 1))}, DType::kUInt8));
  auto out = std::make_shared<Tensor>(
      Tensor::empty({static_cast<int64_t>(std::max<size_t>(recv_total, 1))}, DType::kUInt8));
  char* to = in->data_as<char>();
  for (const Tensor& t : inputs) {
    if (t.nbytes() != 0) std::memcpy(to, t.data(), t.nbytes());
    to += t.nbytes();
  }
  OpPtr op = make_op(group_, OpType::kAlltoall, "alltoall", outputs);
  check_call(*op, Signature(OpType::kAlltoall, 0).of(inputs.at(0).dtype(), 0),
             pg::Traffic{as_int64(send_counts), as_int64(recv_counts)});
  MPI_Comm comm = group_->comm;
  op->start = [in, out, sc = send_counts, sd = send_displs, rc = recv_counts, rd = recv_displs,
               comm](std::vector<MPI_Request>& r) {
    r.emplace_back();
    check(MPI_Ialltoallv(in->data(), sc.data(), sd.data(), MPI_BYTE, out->data(), rc.data(),
                         rd.data(), MPI_BYTE, comm, &r.back()),
          "MPI_Ialltoallv");
  };
  op->done = [out, outs = outputs](const MPI_Status&) {
    const char* from = out->data_as<char>();
    for (const Tensor& t : outs) {
      if (t.nbytes() != 0) std::memcpy(t.data(), from, t.nbytes());
      from += t.nbytes();
    }
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

WorkPtr MpiBackend::barrier(const pg::BarrierOptions& opts) {
  OpPtr op = make_op(group_, OpType::kBarrier, "barrier", {});
  check_call(*op, Signature(OpType::kBarrier, 0));
  // Every rank's record arriving is the barrier.
  op->pack = [](std::byte*) {
  };
  op->unpack = [](const std::byte*, size_t) {
  };
  MPI_Comm comm = group_->comm;
  op->start = [comm](std::vector<MPI_Request>& r) {
    r.emplace_back();
    check(MPI_Ibarrier(comm, &r.back()), "MPI_Ibarrier");
  };
  return submit(std::move(op), opts.timeout, opts.async_op);
}

}  // namespace c10d::backends::mpi
