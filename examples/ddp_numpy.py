"""Data-parallel training in numpy with c10d.Reducer: a two-layer regression model, each rank
training on its own shard of the data, gradients averaged bucket by bucket as the backward
pass produces them (last layer first), so every rank takes the same optimizer step.

    python3 -m c10d.run --nproc-per-node 2 examples/ddp_numpy.py
"""

import argparse
import zlib

import numpy as np

import c10d as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="shm")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    # The task: y = tanh(x @ A) @ b, learned from 256 samples per rank.
    data = np.random.default_rng(1234 + rank)
    truth = np.random.default_rng(0)
    a_true, b_true = truth.normal(size=(8, 16)), truth.normal(size=(16, 1))
    x = data.normal(size=(256, 8)).astype(np.float32)
    y = (np.tanh(x @ a_true) @ b_true).astype(np.float32)

    # Every rank starts from its own random weights; rank 0's win.
    init = np.random.default_rng(rank)
    params = [
        (init.normal(size=(8, 16)) * 0.3).astype(np.float32),
        np.zeros(16, np.float32),
        (init.normal(size=(16, 1)) * 0.3).astype(np.float32),
    ]
    dist._verify_params_across_processes(dist.group.WORLD, params)
    dist._broadcast_coalesced(dist.group.WORLD, params, 1 << 20, 0)

    grads = [np.zeros_like(p) for p in params]
    buckets, limits = dist._compute_bucket_assignment_by_size(grads, [256, 1 << 20])
    reducer = dist.Reducer(grads, buckets[::-1], limits[::-1], dist.group.WORLD)

    lr = 0.05
    for step in range(args.steps):
        w1, b1, w2 = params
        h = np.tanh(x @ w1 + b1)
        err = h @ w2 - y
        loss = float(np.mean(err**2))
        reducer.prepare_for_backward()
        # Backward, last parameter first; each gradient is handed over as soon as it exists.
        d_out = 2 * err / len(x)
        grads[2][...] = h.T @ d_out
        reducer._autograd_hook(2)
        d_h = (d_out @ w2.T) * (1 - h**2)
        grads[1][...] = d_h.sum(axis=0)
        reducer._autograd_hook(1)
        grads[0][...] = x.T @ d_h
        reducer._autograd_hook(0)  # completes the last bucket: grads now hold the averages
        for p, g in zip(params, grads):
            p -= lr * g
        if step % 50 == 0 or step == args.steps - 1:
            total = np.array([loss], np.float32)
            dist.all_reduce(total)
            if rank == 0:
                print(f"step {step:4d}  mean loss over ranks {total[0] / world:.4f}")

    # Same steps everywhere: the weights agree to the bit.
    digest = np.array([zlib.crc32(p.tobytes()) for p in params], np.int64)
    low, high = digest.copy(), digest.copy()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("weights identical on every rank:", bool((low == high).all()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
