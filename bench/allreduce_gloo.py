#!/usr/bin/python3
"""The torch.distributed (gloo) side of bench/allreduce: WORLD processes on 127.0.0.1 run
all_reduce(SUM) on float32 tensors of each size, timed exactly as the C++ workers time theirs
(warm-up, barrier, ITERS calls, slowest rank's mean), and rank 0 writes `bytes,iters,seconds`
rows to OUT.

  allreduce_gloo.py --world 4 --sizes 1024,4096,... --out gloo.csv
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iterations(size_bytes):
    # Keep in step with iterations() in bench/allreduce.cpp.
    return max(5, min(500, (512 << 20) // size_bytes))


def worker(rank, world, port, sizes, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    for size in sizes:
        n = size // 4
        check = torch.full((n,), float(rank + 1))
        dist.all_reduce(check)
        expected = world * (world + 1) / 2
        assert bool((check == expected).all()), f"gloo all_reduce gave a wrong sum at {size} bytes"
        buf = torch.zeros(n)
        iters = iterations(size)
        for _ in range(max(1, iters // 10)):
            dist.all_reduce(buf)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        rows.append((size, iters, elapsed.item()))
    if rank == 0:
        with open(out, "w") as f:
            for size, iters, seconds in rows:
                f.write(f"{size},{iters},{seconds:.9g}\n")
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--sizes", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sizes = [int(x) for x in a.sizes.split(",")]
    mp.spawn(worker, args=(a.world, port, sizes, a.out), nprocs=a.world, join=True)
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
