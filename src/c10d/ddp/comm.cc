#include "c10d/ddp/comm.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "c10d/core/exception.h"

namespace c10d::ddp {
namespace {

using core::DType;
using core::Tensor;
using core::detail::str_cat;

// Waits for `work` within the group's timeout (DistTimeoutError naming the operation).
void finish(const pg::ProcessGroup& group, const pg::WorkPtr& work) {
  work->wait(group.options().timeout);
}

void broadcast_one(pg::ProcessGroup& group, Tensor& buffer, int src) {
  std::vector<Tensor> tensors{buffer};
  pg::BroadcastOptions opts;
  opts.root_rank = src;
  opts.async_op = false;
  finish(group, group.broadcast(tensors, opts));
}

// A parameter's description, as int64 values: dtype, number of dimensions, sizes, strides.
void describe(const Tensor& t, std::vector<int64_t>& out) {
  out.push_back(static_cast<int64_t>(t.dtype()));
  out.push_back(t.dim());
  out.insert(out.end(), t.sizes().begin(), t.sizes().end());
  out.insert(out.end(), t.strides().begin(), t.strides().end());  // filled in when C-order
}

std::string list(const int64_t* v, int64_t n) {
  std::ostringstream out;
  out << "[";
  for (int64_t i = 0; i < n; ++i) out << (i ? ", " : "") << v[i];
  out << "]";
  return out.str();
}

// The first way this rank's parameters differ from rank 0's, or "". `n` holds every rank's
// parameter count and description length; `theirs` is rank 0's description.
std::string compare_with_rank0(const std::vector<Tensor>& params, const std::vector<int64_t>& mine,
                               const Tensor& theirs, const int64_t* n, int rank, int size) {
  const std::string lead = "DDP expects the same model on every rank, but ";
  for (int r = 0; r < size; ++r) {
    if (n[2 * r] != static_cast<int64_t>(params.size())) {
      return str_cat(lead, "rank ", r, " has ", n[2 * r], " parameters while rank ", rank, " has ",
                     params.size());
    }
  }
  // Rank 0's parameter i starts where ours does as long as every earlier one matched.
  const int64_t* ref = theirs.data_as<int64_t>();
  const int64_t* own = mine.data();
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t dim = own[1];
    if (ref[1] != dim || !std::equal(own + 2, own + 2 + dim, ref + 2)) {
      return str_cat(lead, "parameter ", i, " on rank ", rank, " has sizes ", list(own + 2, dim),
                     " while on rank 0 it has sizes ", list(ref + 2, ref[1]));
    }
    if (own[0] != ref[0]) {
      return str_cat(lead, "parameter ", i, " on rank ", rank, " is ",
                     core::dtype_name(static_cast<DType>(own[0])), " while on rank 0 it is ",
                     core::dtype_name(static_cast<DType>(ref[0])));
    }
    if (!std::equal(own + 2 + dim, own + 2 + 2 * dim, ref + 2 + dim)) {
      return str_cat(lead, "parameter ", i, " on rank ", rank, " has strides ",
                     list(own + 2 + dim, dim), " while on rank 0 it has strides ",
                     list(ref + 2 + dim, dim));
    }
    own += 2 + 2 * dim;
    ref += 2 + 2 * dim;
  }
  return "";
}

}  // namespace

void broadcast_coalesced(const std::shared_ptr<pg::ProcessGroup>& group,
                         const std::vector<Tensor>& tensors, size_t buffer_size, int src) {
  C10D_CHECK_ARG(group != nullptr, "broadcast_coalesced: no process group");
  C10D_CHECK_ARG(src >= 0 && src < group->size(), "broadcast_coalesced: src ", src,
                 " is not a rank of a group of ", group->size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    C10D_CHECK_ARG(tensors[i].is_contiguous(), "broadcast_coalesced: tensor ", i, " (",
                   tensors[i].str(), ") is not contiguous");
  }
  const bool sender = group->rank() == src;
  size_t begin = 0;
  while (begin < tensors.size()) {
    // Tensors [begin, end) share a dtype and fit in one buffer (or are one large tensor).
    const DType dtype = tensors[begin].dtype();
    size_t end = begin;
    size_t bytes = 0;
    while (end < tensors.size() && tensors[end].dtype() == dtype &&
           (end == begin || bytes + tensors[end].nbytes() <= buffer_size)) {
      bytes += tensors[end++].nbytes();
    }
    const size_t es = core::element_size(dtype);
    Tensor flat = Tensor::empty({static_cast<int64_t>(bytes / es)}, dtype);
    char* p = flat.data_as<char>();
    if (sender) {
      for (size_t i = begin; i < end; p += tensors[i++].nbytes()) {
        std::memcpy(p, tensors[i].data(), tensors[i].nbytes());
      }
    }
    broadcast_one(*group, flat, src);
    if (!sender) {
      p = flat.data_as<char>();
      for (size_t i = begin; i < end; p += tensors[i++].nbytes()) {
        std::memcpy(tensors[i].data(), p, tensors[i].nbytes());
      }
    }
    begin = end;
  }
}

void verify_params_across_processes(const std::shared_ptr<pg::ProcessGroup>& group,
                                    const std::vector<Tensor>& params) {
  C10D_CHECK_ARG(group != nullptr, "verify_params_across_processes: no process group");
  const int rank = group->rank();
  const int size = group->size();
  std::vector<int64_t> mine;
  for (const Tensor& p : params) describe(p, mine);

  // Every rank's parameter count and description length.
  Tensor counts = Tensor::empty({2}, DType::kInt64);
  counts.data_as<int64_t>()[0] = static_cast<int64_t>(params.size());
  counts.data_as<int64_t>()[1] = static_cast<int64_t>(mine.size());
  Tensor all = Tensor::empty({2 * static_cast<int64_t>(size)}, DType::kInt64);
  pg::AllgatherOptions gather_opts;
  gather_opts.async_op = false;
  finish(*group, group->allgather_base(all, counts, gather_opts));
  const int64_t* n = all.data_as<int64_t>();

  // Rank 0's description, which every rank then compares with its own.
  Tensor theirs = Tensor::empty({std::max<int64_t>(n[1], 1)}, DType::kInt64);
  if (rank == 0 && !mine.empty()) std::memcpy(theirs.data(), mine.data(), mine.size() * 8);
  broadcast_one(*group, theirs, 0);

  // Every rank learns whether any differs, so that all of them raise (a rank that went on
  // would wait in the next collective for the one that stopped).
  const std::string problem = compare_with_rank0(params, mine, theirs, n, rank, size);
  Tensor flag = Tensor::empty({1}, DType::kInt32);
  flag.data_as<int32_t>()[0] = problem.empty() ? 0 : 1;
  Tensor flags = Tensor::empty({size}, DType::kInt32);
  finish(*group, group->allgather_base(flags, flag, gather_opts));
  C10D_CHECK(problem.empty(), problem);
  for (int r = 0; r < size; ++r) {
    C10D_CHECK(flags.data_as<int32_t>()[r] == 0,
               "DDP expects the same model on every rank, "
               "but rank ",
               r, "'s parameters differ from rank 0's (rank ", r, "'s error says how)");
  }
}

}  // namespace c10d::ddp
