"""All-reduce bandwidth between the GPUs of this machine, the way `lilicorr train` reduces its gradients (NCCL, one
process a GPU, fp32), so a training run's tokens/s scaling can be read against what the interconnect allows:

  torchrun --nproc-per-node N -m benchmarks nccl-bench [--mib 165 1024] [--iters 10]

Prints, on rank 0, one line per size: ms per all-reduce and the bus bandwidth (2 (N - 1) / N x bytes / time, the
figure nccl-tests and the device's KINDS.md report). 165 MiB is the fp32 gradient of tp_models.py's LiLiCorr draft
(43.3 M trainable parameters).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, nargs="+", default=[165, 1024])
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args(argv)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world = dist.get_world_size()
    for mib in a.mib:
        x = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device="cuda")
        dist.all_reduce(x)  # warm-up: communicators and buffers
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t0) / a.iters
        if dist.get_rank() == 0:
            bus = 2 * (world - 1) / world * x.numel() * 4 / (ms / 1e3) / 1e9
            print(
                f"NCCL all-reduce {world} GPUs, {mib} MiB fp32: {ms:.2f} ms, bus bandwidth {bus:.0f} GB/s", flush=True
            )
    dist.destroy_process_group()
