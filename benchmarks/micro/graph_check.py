"""Stand-alone GPU check of the LiLiCorr proposal outside SGLang: random paper-geometry head at
SmolLM2 scale (Hm 576, V 49152), bf16, captured in a CUDA graph per batch size; the replay must
equal the eager run, and the replay time is printed.

  python -m benchmarks graph-check [--bs 1 4 16] [--hidden 576] [--vocab 49152]   (with sglang_lilicorr installed)

Prints one line per batch size, then GRAPH_CHECK PASS|FAIL (exit status 1 on FAIL).
"""

from __future__ import annotations

import argparse

import torch

from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.serving.proposer import LiLiCorrProposer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bs", type=int, nargs="*", default=[1, 4, 16])
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--vocab", type=int, default=49152)
    a = p.parse_args(argv)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    head = LiLiCorrHead(LiLiCorrConfig(), a.hidden).to(dev, dtype)
    lm = torch.randn(a.vocab, a.hidden, device=dev, dtype=dtype) * 0.05
    proposer = LiLiCorrProposer(head=head, lm_head_weight=lm, embed_weight=lm, block_size=head.config.block_size)
    proposer.allocate(num_request_slots=max(a.bs) + 1, max_rows=max(a.bs))
    ok = True
    for bs in a.bs:
        slots = torch.arange(1, bs + 1, device=dev)
        proposer.publish_anchors(torch.randn(bs, a.hidden, device=dev, dtype=dtype), slots)
        proposer.stage_anchors(slots)
        hidden = torch.randn(bs * proposer.block_size, a.hidden, device=dev, dtype=dtype)
        for _ in range(2):  # warm-up: Triton compiles outside the capture
            proposer(hidden)
        eager = proposer.out[: bs * proposer.slots].clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            proposer(hidden)
        proposer.out.zero_()
        graph.replay()
        same = torch.equal(proposer.out[: bs * proposer.slots], eager)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        ok &= same
        print(
            f"bs={bs}: replay == eager: {same}; replay {start.elapsed_time(end) / 50:.3f} ms "
            f"({torch.cuda.get_device_name()})",
            flush=True,
        )
    print("GRAPH_CHECK", "PASS" if ok else "FAIL")
    raise SystemExit(0 if ok else 1)
