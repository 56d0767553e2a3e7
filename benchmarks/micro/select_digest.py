"""Has a change moved any bit of the served select? A digest of its outputs on fixed inputs, to compare
between two commits (run it under each, the same card) or between two variants in one run.

  python3 -m benchmarks select-digest [--geometry paper] [--bs 1 4 16 32] [--variants served ...]

head_bench's head (its trained-like weights, `build_ours`) and inputs (`make_inputs`) at each bs; for each of
head_bench's VARIANTS (the select's plans), `propose` once eagerly and once replayed from a CUDA graph
(where CUDA is there). One line per (variant, bs, mode): the sha256 of the draft ids, candidate ids and log-probs, as
bytes. Kernel changes that only move loads or launch kernels elsewhere must keep every line. `--smoke`: head_bench's
tiny geometry on the CPU (tests/test_select_digest.py).
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.nn.functional as F


def digest(outputs) -> str:
    """sha256 of the tensors' bytes (on the CPU, in order) -> the first 16 hex digits."""
    h = hashlib.sha256()
    for t in outputs:
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def run(geometry: str, bs_list, variants, smoke: bool = False) -> list[str]:
    from benchmarks.micro.head_bench import GEOMETRIES, SMOKE, build_ours, build_variant, make_inputs
    from benchmarks.micro.graph_timing import capture

    geo = SMOKE if smoke else GEOMETRIES[geometry]
    cuda = torch.cuda.is_available() and not smoke
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    head = build_ours(geo, dev, dtype)
    g = torch.Generator().manual_seed(7)
    table = head.token_table(torch.randn(geo.V, geo.HM, generator=g).to(dev, dtype))
    lm_head = (torch.randn(geo.V, geo.HM, generator=g) * 0.02).to(dev, dtype)
    lines = []
    for name in variants:
        fast = build_variant(name if cuda else "torch", head, table)
        for bs in bs_list:
            hidden, anchor = make_inputs(geo, bs, dev, dtype)
            logits = F.linear(hidden.reshape(bs * geo.S, geo.HM), lm_head)
            outputs = lambda: fast.propose(logits, hidden, anchor)[:3]  # noqa: E731  draft ids, candidates, log-probs
            lines.append(f"{name} bs {bs} eager {digest(outputs())}")
            if cuda:
                graph, replayed = capture(outputs)
                graph.replay()
                torch.cuda.synchronize()
                lines.append(f"{name} bs {bs} graph {digest(replayed)}")
    return lines


def main(argv=None) -> int:
    from benchmarks.micro.head_bench import VARIANTS

    ap = argparse.ArgumentParser(description="sha256 digests of the served select's outputs on fixed inputs")
    ap.add_argument("--geometry", choices=("paper", "testbed"), default="paper")
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--variants", nargs="+", default=["served"], choices=list(VARIANTS))
    ap.add_argument("--smoke", action="store_true", help="head_bench's tiny geometry on the CPU (the PyTorch path)")
    args = ap.parse_args(argv)
    for line in run(args.geometry, args.bs, args.variants, args.smoke):
        print(line, flush=True)
    return 0
