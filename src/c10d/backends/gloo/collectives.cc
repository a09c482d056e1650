// GlooBackend's collectives, broadcast to barrier: each builds the body a worker (or the caller)
// runs with the operation's Gloo context, tag and timeout (see gloo_backend.h).
#include "c10d/backends/gloo/gloo_backend.h"

#include <algorithm>
#include <utility>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>

#include "c10d/backends/gloo/internal.h"
#include "c10d/core/copy.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"

namespace c10d::backends::gloo {

using core::copy_bytes;
using core::data_or_dummy;
using core::DistBackendError;
using core::DType;
using core::OpType;
using core::ReduceOp;
using core::Tensor;
using core::detail::str_cat;
using pg::Millis;
using pg::Signature;
using pg::wants_async;

namespace {

// Size of one element in Gloo's eyes. Only sizeof matters: our own reduce function does the
// arithmetic, so bfloat16, complex and bool travel as opaque elements of the right width.
template <size_t N>
struct Element {
  unsigned char bytes[N];
};

template <typename Fn>
void with_element_type(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1:
      fn.template operator()<Element<1>>();
      return;
    case 2:
      fn.template operator()<Element<2>>();
      return;
    case 4:
      fn.template operator()<Element<4>>();
      return;
    case 8:
      fn.template operator()<Element<8>>();
      return;
    case 16:
      fn.template operator()<Element<16>>();
      return;
    default:
      throw DistBackendError(str_cat("Gloo: no element type of ", element_size, " bytes"));
  }
}

// How contributions combine: AVG and PREMUL_SUM like SUM (their pre/post steps happen once,
// outside the reduction), the others as themselves.
ReduceOp combining_op(ReduceOp op) {
  if (op.kind == ReduceOp::AVG || op.kind == ReduceOp::PREMUL_SUM) op = ReduceOp(ReduceOp::SUM);
  return op;
}

// The combine step Gloo calls between contributions: out = a (op) b.
::gloo::AllreduceOptions::Func make_reduce_fn(DType dtype, ReduceOp op) {
  op = combining_op(op);
  return [dtype, op](void* out, const void* a, const void* b, size_t n) {
    core::reduce_into(out, a, b, n, dtype, op);
  };
}

// In-place allreduce of `n` elements at each pointer in `data` (all the same dtype), on the
// ring when the operation has one.
void run_allreduce(const GlooBackend::OpContext& c, const std::vector<void*>& data, size_t n,
                   DType dtype, const ReduceOp& op) {
  if (n == 0) return;
  for (void* p : data) core::apply_premul(p, n, dtype, op);
  if (c.ring) {
    // This rank's tensors are folded into the first, which the ring reduces with the peers'.
    const ReduceOp combine = combining_op(op);
    for (size_t i = 1; i < data.size(); ++i) core::reduce(data[0], data[i], n, dtype, combine);
    c.ring->allreduce(data[0], n, dtype, combine, c.timeout, c.call);
    for (size_t i = 1; i < data.size(); ++i) {
      copy_bytes(data[i], data[0], n * core::element_size(dtype));
    }
  } else {
    ::gloo::AllreduceOptions g(c.context);
    with_element_type(core::element_size(dtype), [&]<typename T>() {
      std::vector<T*> ptrs;
      ptrs.reserve(data.size());
      for (void* p : data) ptrs.push_back(static_cast<T*>(p));
      g.setOutputs(ptrs, n);
    });
    g.setReduceFunction(make_reduce_fn(dtype, op));
    g.setTag(c.tag);
    g.setTimeout(c.timeout);
    ::gloo::allreduce(g);
  }
  for (void* p : data) core::apply_postdiv(p, n, dtype, op, c.size);
}

void run_allgather(const GlooBackend::OpContext& c, void* in, void* out, size_t bytes_per_rank) {
  if (bytes_per_rank == 0) return;
  if (c.ring) {
    char* mine = static_cast<char*>(out) + c.rank * bytes_per_rank;
    if (mine != in) copy_bytes(mine, in, bytes_per_rank);
    c.ring->allgather(out, bytes_per_rank, c.timeout, c.call);
    return;
  }
  ::gloo::AllgatherOptions g(c.context);
  g.setInput(static_cast<char*>(in), bytes_per_rank);
  g.setOutput(static_cast<char*>(out), bytes_per_rank * c.size);
  g.setTag(c.tag);
  g.setTimeout(c.timeout);
  ::gloo::allgather(g);
}

// Reduce-scatter of `input` (size * output.numel() elements, not modified) into `output`:
// an allreduce of a copy, then this rank's slice. Gloo has no options-style reduce-scatter.
void run_reduce_scatter(const GlooBackend::OpContext& c, Tensor& output, const Tensor& input,
                        const ReduceOp& op) {
  const size_t n = static_cast<size_t>(output.numel());
  if (n == 0) return;
  Tensor scratch = input.contiguous_copy();
  ReduceOp sum_op = op;
  if (op.kind == ReduceOp::AVG) sum_op = ReduceOp(ReduceOp::SUM);
  run_allreduce(c, {scratch.data()}, n * c.size, input.dtype(), sum_op);
  copy_bytes(output.data(), static_cast<char*>(scratch.data()) + c.rank * output.nbytes(),
             output.nbytes());
  core::apply_postdiv(output.data(), n, output.dtype(), op, c.size);
}

// Bytes of each rank's piece of `t` split along dimension 0 by `splits` (rows; empty: evenly).
std::vector<int64_t> split_bytes(const Tensor& t, const std::vector<int64_t>& splits, int size) {
  const int64_t rows = t.dim() == 0 ? 1 : t.sizes()[0];
  const int64_t row_bytes = rows == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / rows;
  std::vector<int64_t> bytes(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) bytes[r] = (splits.empty() ? rows / size : splits[r]) * row_bytes;
  return bytes;
}

// Gloo's all-to-all with per-rank byte counts (which may be zero).
void run_alltoallv(const GlooBackend::OpContext& c, void* in, std::vector<int64_t> in_bytes,
                   void* out, std::vector<int64_t> out_bytes) {
  ::gloo::AlltoallvOptions g(c.context);
  g.setInput(static_cast<char*>(in), std::move(in_bytes));
  g.setOutput(static_cast<char*>(out), std::move(out_bytes));
  g.setTag(c.tag);
  g.setTimeout(c.timeout);
  ::gloo::alltoallv(g);
}

}  // namespace

WorkPtr GlooBackend::broadcast(std::vector<Tensor>& tensors, const pg::BroadcastOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  const size_t root_tensor = static_cast<size_t>(opts.root_tensor);
  const Signature call = Signature(OpType::kBroadcast, 0).of(tensors[0]).from(root);
  return submit(
      "broadcast", call, opts.timeout, wants_async(opts),
      [tensors, root, root_tensor](const OpContext& c) {
        const Tensor& source = tensors[root_tensor];
        const size_t bytes = source.nbytes();
        if (bytes != 0 && c.ring) {
          c.ring->broadcast(source.data(), bytes, root, c.timeout, c.call);
        } else if (bytes != 0) {
          ::gloo::BroadcastOptions g(c.context);
          g.setOutput(static_cast<char*>(source.data()), bytes);
          g.setRoot(root);
          g.setTag(c.tag);
          g.setTimeout(c.timeout);
          ::gloo::broadcast(g);
        }
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (i != root_tensor) copy_bytes(tensors[i].data(), source.data(), bytes);
        }
      },
      tensors, /*on_ring=*/true);
}

WorkPtr GlooBackend::allreduce(std::vector<Tensor>& tensors, const pg::AllreduceOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const Signature call = Signature(OpType::kAllreduce, 0).of(tensors[0]).with(op);
  return submit(
      "allreduce", call, opts.timeout, wants_async(opts),
      [tensors, op](const OpContext& c) {
        std::vector<void*> data;
        data.reserve(tensors.size());
        for (const Tensor& t : tensors) data.push_back(t.data());
        run_allreduce(c, data, static_cast<size_t>(tensors[0].numel()), tensors[0].dtype(), op);
      },
      tensors, /*on_ring=*/true);
}

WorkPtr GlooBackend::reduce(std::vector<Tensor>& tensors, const pg::ReduceOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const int root = static_cast<int>(opts.root_rank);
  const Tensor tensor = tensors[static_cast<size_t>(opts.root_tensor)];
  const Signature call = Signature(OpType::kReduce, 0).of(tensor).with(op).from(root);
  return submit(
      "reduce", call, opts.timeout, wants_async(opts),
      [tensor, op, root](const OpContext& c) {
        const size_t n = static_cast<size_t>(tensor.numel());
        if (n == 0) return;
        const DType dtype = tensor.dtype();
        // Only the root's tensor receives the result; the others keep their input, so their
        // contribution is read from the tensor (or a scaled copy) and Gloo works in scratch.
        Tensor input = tensor;
        Tensor output = tensor;
        if (c.rank == root) {
          core::apply_premul(tensor.data(), n, dtype, op);
        } else {
          if (op.kind == ReduceOp::PREMUL_SUM) {
            input = tensor.contiguous_copy();
            core::apply_premul(input.data(), n, dtype, op);
          }
          output = Tensor::empty({static_cast<int64_t>(n)}, dtype);
        }
        ::gloo::ReduceOptions g(c.context);
        with_element_type(core::element_size(dtype), [&]<typename T>() {
          if (input.data() != output.data()) g.setInput(static_cast<T*>(input.data()), n);
          g.setOutput(static_cast<T*>(output.data()), n);
        });
        g.setRoot(root);
        g.setReduceFunction(make_reduce_fn(dtype, op));
        g.setTag(c.tag);
        g.setTimeout(c.timeout);
        ::gloo::reduce(g);
        if (c.rank == root) core::apply_postdiv(tensor.data(), n, dtype, op, c.size);
      },
      tensors);
}

WorkPtr GlooBackend::allgather_base(Tensor& output, Tensor& input,
                                    const pg::AllgatherOptions& opts) {
  return submit(
      "allgather_base", Signature(OpType::kAllgatherBase, 0).of(input), opts.timeout,
      wants_async(opts),
      [output, input](const OpContext& c) {
        run_allgather(c, input.data(), output.data(), input.nbytes());
      },
      {output}, /*on_ring=*/true);
}

WorkPtr GlooBackend::allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                     std::vector<Tensor>& inputs,
                                                     const pg::AllgatherOptions& opts) {
  return submit(
      "allgather_into_tensor_coalesced", Signature(OpType::kAllgatherCoalesced, 0).of(inputs),
      opts.timeout, wants_async(opts),
      [outputs, inputs](const OpContext& c) {
        // One sequence number for the group: the pieces run one after another on every rank,
        // so reusing the tag cannot mix their messages.
        for (size_t i = 0; i < inputs.size(); ++i) {
          run_allgather(c, inputs[i].data(), outputs[i].data(), inputs[i].nbytes());
        }
      },
      outputs, /*on_ring=*/true);
}

WorkPtr GlooBackend::gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                            const pg::GatherOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  std::vector<Tensor> gathered = rank() == root ? outputs[0] : std::vector<Tensor>{};
  const Tensor input = inputs[0];
  return submit(
      "gather", Signature(OpType::kGather, 0).of(input).from(root), opts.timeout, wants_async(opts),
      [gathered, input, root](const OpContext& c) {
        const size_t per = input.nbytes();
        if (per == 0) return;
        ::gloo::GatherOptions g(c.context);
        g.setInput(static_cast<char*>(input.data()), per);
        Tensor out;
        if (c.rank == root) {
          out = Tensor::empty({static_cast<int64_t>(per * c.size)}, DType::kUInt8);
          g.setOutput(out.data_as<char>(), per * c.size);
        }
        g.setRoot(root);
        g.setTag(c.tag);
        g.setTimeout(c.timeout);
        ::gloo::gather(g);
        if (c.rank == root) {
          for (int r = 0; r < c.size; ++r) {
            copy_bytes(gathered[r].data(), out.data_as<char>() + r * per, per);
          }
        }
      },
      gathered);
}

WorkPtr GlooBackend::scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                             const pg::ScatterOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  std::vector<Tensor> sources = rank() == root ? inputs[0] : std::vector<Tensor>{};
  const Tensor output = outputs[0];
  return submit("scatter", Signature(OpType::kScatter, 0).of(output).from(root), opts.timeout,
                wants_async(opts),
                [sources, output, root](const OpContext& c) {
                  const size_t per = output.nbytes();
                  if (per == 0) return;
                  ::gloo::ScatterOptions g(c.context);
                  if (c.rank == root) {
                    std::vector<char*> ptrs;
                    for (const Tensor& t : sources) ptrs.push_back(static_cast<char*>(t.data()));
                    g.setInputs(ptrs, per);
                  }
                  g.setOutput(static_cast<char*>(output.data()), per);
                  g.setRoot(root);
                  g.setTag(c.tag);
                  g.setTimeout(c.timeout);
                  ::gloo::scatter(g);
                },
                {output});
}

WorkPtr GlooBackend::reduce_scatter(std::vector<Tensor>& outputs,
                                    std::vector<std::vector<Tensor>>& inputs,
                                    const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const Tensor output = outputs[0];
  const std::vector<Tensor> pieces = inputs[0];
  return submit(
      "reduce_scatter", Signature(OpType::kReduceScatter, 0).of(output).with(op), opts.timeout,
      wants_async(opts),
      [output, pieces, op](const OpContext& c) {
        const int64_t n = output.numel();
        if (n == 0) return;
        Tensor flat = Tensor::empty({n * c.size}, output.dtype());
        for (int r = 0; r < c.size; ++r) {
          copy_bytes(flat.data_as<char>() + r * output.nbytes(), pieces[r].data(), output.nbytes());
        }
        Tensor out = output;
        run_reduce_scatter(c, out, flat, op);
      },
      {output}, /*on_ring=*/true);
}

WorkPtr GlooBackend::reduce_scatter_base(Tensor& output, Tensor& input,
                                         const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      "reduce_scatter_base", Signature(OpType::kReduceScatterBase, 0).of(output).with(op),
      opts.timeout, wants_async(opts),
      [output, input, op](const OpContext& c) {
        Tensor out = output;
        run_reduce_scatter(c, out, input, op);
      },
      {output}, /*on_ring=*/true);
}

WorkPtr GlooBackend::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                     std::vector<Tensor>& inputs,
                                                     const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      "reduce_scatter_tensor_coalesced",
      Signature(OpType::kReduceScatterBase, 0).of(outputs).with(op), opts.timeout,
      wants_async(opts),
      [outputs, inputs, op](const OpContext& c) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          Tensor out = outputs[i];
          run_reduce_scatter(c, out, inputs[i], op);
        }
      },
      outputs, /*on_ring=*/true);
}

WorkPtr GlooBackend::alltoall_base(Tensor& output, Tensor& input,
                                   std::vector<int64_t>& output_split_sizes,
                                   std::vector<int64_t>& input_split_sizes,
                                   const pg::AllToAllOptions& opts) {
  const std::vector<int64_t> out_splits = output_split_sizes;
  const std::vector<int64_t> in_splits = input_split_sizes;
  pg::Traffic traffic{split_bytes(input, in_splits, size()),
                      split_bytes(output, out_splits, size())};
  return submit(
      "alltoall_base", Signature(OpType::kAlltoallBase, 0).of(input.dtype(), 0), opts.timeout,
      wants_async(opts),
      [output, input, out_splits, in_splits](const OpContext& c) {
        if (out_splits.empty() && in_splits.empty()) {
          // Equal splits: every rank exchanges the same number of bytes with every other.
          if (input.nbytes() == 0) return;
          ::gloo::AlltoallOptions g(c.context);
          g.setInput(static_cast<char*>(input.data()), input.nbytes());
          g.setOutput(static_cast<char*>(output.data()), output.nbytes());
          g.setTag(c.tag);
          g.setTimeout(c.timeout);
          ::gloo::alltoall(g);
          return;
        }
        run_alltoallv(c, data_or_dummy(input), split_bytes(input, in_splits, c.size),
                      data_or_dummy(output), split_bytes(output, out_splits, c.size));
      },
      {output}, /*on_ring=*/false, std::move(traffic));
}

WorkPtr GlooBackend::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                              const pg::AllToAllOptions& opts) {
  pg::Traffic traffic;
  for (int r = 0; r < size(); ++r) {
    traffic.sends.push_back(static_cast<int64_t>(inputs[r].nbytes()));
    traffic.receives.push_back(static_cast<int64_t>(outputs[r].nbytes()));
  }
  return submit(
      "alltoall", Signature(OpType::kAlltoall, 0).of(inputs[0].dtype(), 0), opts.timeout,
      wants_async(opts),
      [outputs, inputs](const OpContext& c) {
        std::vector<int64_t> in_bytes(c.size), out_bytes(c.size);
        int64_t in_total = 0, out_total = 0;
        for (int r = 0; r < c.size; ++r) {
          in_bytes[r] = static_cast<int64_t>(inputs[r].nbytes());
          out_bytes[r] = static_cast<int64_t>(outputs[r].nbytes());
          in_total += in_bytes[r];
          out_total += out_bytes[r];
        }
        Tensor in = Tensor::empty({std::max<int64_t>(in_total, 1)}, DType::kUInt8);
        Tensor out = Tensor::empty({std::max<int64_t>(out_total, 1)}, DType::kUInt8);
        char* cursor = in.data_as<char>();
        for (int r = 0; r < c.size; ++r) {
          copy_bytes(cursor, inputs[r].data(), in_bytes[r]);
          cursor += in_bytes[r];
        }
        run_alltoallv(c, in.data(), in_bytes, out.data(), out_bytes);
        cursor = out.data_as<char>();
        for (int r = 0; r < c.size; ++r) {
          copy_bytes(outputs[r].data(), cursor, out_bytes[r]);
          cursor += out_bytes[r];
        }
      },
      outputs, /*on_ring=*/false, std::move(traffic));
}

WorkPtr GlooBackend::barrier(const pg::BarrierOptions& opts) {
  // The operations issued before it have finished when it runs (the queue runs them in
  // order), as torch's Gloo barrier waits for them.
  return submit(
      "barrier", Signature(OpType::kBarrier, 0), opts.timeout, wants_async(opts),
      [](const OpContext& c) {
        if (c.ring) {
          // Every member's byte is in the result: nobody finishes before all started.
          uint8_t byte = 0;
          c.ring->allreduce(&byte, 1, DType::kUInt8, ReduceOp(ReduceOp::MAX), c.timeout, c.call);
          return;
        }
        ::gloo::BarrierOptions g(c.context);
        g.setTag(c.tag);
        g.setTimeout(c.timeout);
        ::gloo::barrier(g);
      },
      {}, /*on_ring=*/true);
}

}  // namespace c10d::backends::gloo
