// The collective algorithms of ShmBackend: free functions over a StepChannel (step_channel.h),
// which carries their steps between the ranks and checks them. Raw memory in and out; every
// rank passes consistent sizes (the channel fails the operation on every rank otherwise).
// collectives.cc holds the algorithms, collectives_inl.h the template ones.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "c10d/backends/shm/step_channel.h"
#include "c10d/core/deadline.h"
#include "c10d/core/dtype.h"
#include "c10d/core/reduce_op.h"

namespace c10d::backends::shm::algo {

// Rank 0 waits (the operation's timeout) for every other rank to publish its arrival, then
// publishes its verdict with the same step: the other ranks wait for that step only, so one
// that arrives after rank 0 gave up on it hears of the failure at once, and none passes
// unless rank 0 saw everyone. Rank 0 fails naming the ranks that did not arrive: the first
// one, or with `wait_all_ranks` every one, which then means waiting on for the others after
// a peer exited (until they arrive, exit too, or the deadline passes). The verdict names
// the first missing rank, so the others can too. `monitored` is the caller's timeout (rank
// 0's; the others wait theirs, pg::monitored_barrier_release_wait).
void monitored_barrier(StepChannel& ch, bool wait_all_ranks, core::Millis monitored);

void broadcast(StepChannel& ch, char* data, size_t bytes, core::DType dtype, int root);

// Reduces `count` elements of every rank's `in` (left unchanged unless it is `out`) into
// `out`; `out` is null on ranks that do not want the result. `root` is -1 when every rank
// wants it (allreduce, which allows the zero-copy path), else the one rank that does
// (reduce); it is part of the step's signature, so ranks that disagree on it fail. With
// premul_done the caller already scaled the input of a PREMUL_SUM.
void allreduce(StepChannel& ch, const char* in, char* out, size_t count, core::DType dtype,
               const core::ReduceOp& op, int root, bool premul_done = false);

// Every rank publishes `bytes` from `in`; dst(r) (null to skip) receives rank r's bytes.
template <typename Dst>
void allgather(StepChannel& ch, const char* in, size_t bytes, core::DType dtype, Dst&& dst);

// Rank `root` receives every rank's `bytes` from `in` at out_of(r) (called on the root
// only). One-sided: only the root waits.
template <typename Out>
void gather(StepChannel& ch, const char* in, size_t bytes, core::DType dtype, int root,
            Out&& out_of);

// The root sends src_of(j) (bytes each; called on the root only) to rank j's `out`.
template <typename Src>
void scatter(StepChannel& ch, Src&& src_of, char* out, size_t bytes, core::DType dtype, int root);

// block_of(j) (count elements) is this rank's contribution to rank j's `out`.
template <typename Block>
void reduce_scatter(StepChannel& ch, Block&& block_of, char* out, size_t count, core::DType dtype,
                    const core::ReduceOp& op);

// reduce_scatter of one flat input: block j (count elements) of `in` goes to rank j.
void reduce_scatter_flat(StepChannel& ch, const char* in, char* out, size_t count,
                         core::DType dtype, const core::ReduceOp& op);

// alltoall with equal parts: part j (`bytes` each) of `in` goes to rank j, whose part
// for this rank lands in part j of `out`.
void alltoall_equal(StepChannel& ch, const char* in, char* out, size_t bytes, core::DType dtype);

// This rank sends send_len[j] bytes at send[j] to rank j and receives recv_len[j] bytes from
// it. A size that does not match the sender's is reported after the exchange (so every rank
// still takes the same steps). Every rank's parts are of `dtype`.
void alltoall(StepChannel& ch, const std::vector<const char*>& send,
              const std::vector<size_t>& send_len, const std::vector<char*>& recv,
              const std::vector<size_t>& recv_len, core::DType dtype);

// The channel's calibration (StepChannel::calibrate), timing the pipelined allreduce.
void calibrate(StepChannel& ch, core::Millis timeout);

// --- the algorithms behind the collectives ---

void one_shot(StepChannel& ch, const char* in, char* out, size_t count, core::DType dtype,
              const core::ReduceOp& op, bool premul);
void one_shot_mailbox(StepChannel& ch, const char* in, char* out, size_t count, core::DType dtype,
                      const core::ReduceOp& op, bool premul);
void pipelined(StepChannel& ch, const char* in, char* out, size_t count, core::DType dtype,
               const core::ReduceOp& op, bool premul, std::optional<bool> large = std::nullopt);
// Owner computes on the ranks' own tensors (`where`, from StepChannel::locate).
void owner_computes(StepChannel& ch, const std::vector<StepChannel::Where>& where, char* data,
                    size_t count, core::DType dtype, const core::ReduceOp& op, bool premul);

// out = source(0) op source(1) op ... op source(size - 1), then op's post-step. The ranks
// that reduce the same data pass its sources in the same order, so they compute identical
// bits.
template <typename Source>
void reduce_sources(StepChannel& ch, char* out, size_t count, core::DType dtype,
                    const core::ReduceOp& op, Source&& source);

}  // namespace c10d::backends::shm::algo

#include "c10d/backends/shm/collectives_inl.h"  // the template algorithms' bodies
