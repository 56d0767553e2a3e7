"""What programmatic dependent launch (kernels/pdl.py) saves per kernel boundary: the measurement
behind PERF_NOTES.md.

  python3 -m benchmarks pdl-chain [--n 16] [--out pdl_chain.json]

Chains of n dependent launches at the head's bs-1 shapes (M = 120 lattice rows, width 1024), each
replayed as one CUDA graph (kernels/graph_timing.py), without and with PDL:

  gemm    gemm_epilogue_triton 1024 -> 1024, each on the previous output
  norm    rmsnorm_triton, each on the previous output
  mixed   gemm then norm, alternating (2n launches: the lattice's GEMM + epilogue pattern)
  cublas  F.linear on the gemm chain (a cuBLAS kernel cannot launch early: the baseline)

It prints us per launch and the saving per boundary, and checks that every PDL chain ends with the
bytes of its plain twin. `--smoke` builds the chains at tiny shapes on CPU under the Triton interpreter
(no PDL, no timing: tests/test_pdl_chain.py).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F


def chains(m: int, h: int, n: int, device, dtype, seed: int = 0) -> tuple[dict, torch.Tensor]:
    """-> ({name: fn(pdl) -> last output}, the chain input x [m, h])."""
    from sglang_lilicorr.kernels.gemm_epilogue import gemm_epilogue_triton
    from sglang_lilicorr.kernels.head_norm import rmsnorm_triton

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=gen).to(device, dtype)
    weights = [(torch.randn(h, h, generator=gen) / h**0.5).to(device, dtype) for _ in range(n)]
    norm_w = torch.ones(h, device=device, dtype=dtype)

    def gemm(pdl):
        y = x
        for w in weights:
            y = gemm_epilogue_triton(y, w, pdl=pdl)
        return y

    def norm(pdl):
        y = x
        for _ in range(n):
            y = rmsnorm_triton(y, norm_w, 1e-6, pdl=pdl)
        return y

    def mixed(pdl):
        y = x
        for w in weights:
            y = rmsnorm_triton(gemm_epilogue_triton(y, w, pdl=pdl), norm_w, 1e-6, pdl=pdl)
        return y

    def cublas(pdl):
        y = x
        for w in weights:
            y = F.linear(y, w)
        return y

    return {"gemm": gemm, "norm": norm, "mixed": mixed, "cublas": cublas}, x


def run(n: int, rep_ms: int) -> dict:
    from benchmarks.micro.graph_timing import graph_ms

    res = {"card": torch.cuda.get_device_name(), "n": n, "M": 120, "H": 1024, "rows": []}
    fns, _ = chains(120, 1024, n, "cuda", torch.bfloat16)
    for name, fn in fns.items():
        launches = 2 * n if name == "mixed" else n
        plain_ms, plain = graph_ms(lambda: fn(False), rep_ms)
        row = {"chain": name, "launches": launches, "plain_us_per_launch": plain_ms * 1e3 / launches}
        if name != "cublas":
            pdl_ms, with_pdl = graph_ms(lambda: fn(True), rep_ms)
            row |= {
                "pdl_us_per_launch": pdl_ms * 1e3 / launches,
                "saved_us_per_boundary": (plain_ms - pdl_ms) * 1e3 / (launches - 1),
                "pdl_equals_plain": bool(torch.equal(with_pdl, plain)),
            }
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="per-boundary saving of programmatic dependent launch at the head's bs-1 shapes"
    )
    ap.add_argument("--n", type=int, default=16, help="GEMMs (or norms) per chain")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument(
        "--smoke", action="store_true", help="build and run the chains at tiny shapes on CPU (interpreter, no PDL)"
    )
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "pdl_chain.json"))
    args = ap.parse_args(argv)
    if args.smoke:
        fns, x = chains(8, 32, 2, "cpu", torch.float32)
        res = {"card": "cpu (--smoke)", "rows": [{"chain": k, "shape": list(fn(False).shape)} for k, fn in fns.items()]}
    elif not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9):
        print("pdl_chain needs a CUDA GPU of compute capability 9.0+ (--smoke: a CPU dry run)")
        return 2
    else:
        res = run(args.n, args.rep_ms)
        for r in res["rows"]:
            extra = (
                ""
                if "pdl_us_per_launch" not in r
                else (
                    f" -> with PDL {r['pdl_us_per_launch']:.2f} us: "
                    f"{r['saved_us_per_boundary']:.2f} us saved per boundary"
                    f" (output equal: {r['pdl_equals_plain']})"
                )
            )
            print(f"{r['chain']:>7}: {r['launches']} launches, {r['plain_us_per_launch']:.2f} us each{extra}")
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0
