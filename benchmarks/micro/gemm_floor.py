"""How fast can the head's GEMMs go at bs = 1 (M = 120 lattice rows)? The measurement behind the bs = 1
floor argument of PERF_NOTES.md: at M = 120 every head GEMM is a weight stream, so
its floor is weight bytes / HBM bandwidth, and the question is how close one launch gets.

  python3 -m benchmarks gemm-floor [--out gemm_floor.json]

For each of the head's GEMM shapes at the paper config (K -> N: QKV 1024 -> 3072, out 1024 -> 1024,
FFN up 1024 -> 2048, FFN down 2048 -> 1024, factor 2048 -> 1024, out|in 1024 -> 2048, pass 4096 -> 1024),
ms per call (CUDA-graph replay, L2 flushed between replays, median) of:

  cublas   F.linear (bf16 out)
  splitk   a Triton split-K GEMM: grid (N tiles, K splits), each program one [128, BLOCK_N] tile of all
           rows over K / splits, fp32 atomics into a zeroed fp32 output (the zeroing is a second
           launch, included). Atomic order varies, so its low bits do too: a probe of the speed an
           HBM-streaming GEMM reaches, not a serving kernel.

and the byte floor (weights + activations once, at the card's HBM bandwidth). `--smoke` runs it on CPU
under the Triton interpreter at tiny shapes (a dry run; tests/test_gemm_floor.py).

`--chain` times the GEMMs as the head runs them, inside a chain instead of alone: per shape, a CUDA graph of
16 launches (each its own weight, 16 x the weight bytes, so the weights stream from HBM as in the head),
us per launch, for cuBLAS and for each of CHAIN_CONFIGS, launch configs of kernels/gemm_epilogue.py's
gemm_epilogue_triton at M = 120, launched with programmatic dependent launch as the select path does, so that
each prefetches its weight into L2 while the one before runs;
`skinny_no_prefetch` is the served config without that prefetch.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sglang_lilicorr.kernels.tuning import GEMM_CONFIGS, GemmLaunch

SHAPES = {
    "qkv": (1024, 3072),
    "out": (1024, 1024),
    "ffn_up": (1024, 2048),
    "ffn_down": (2048, 1024),
    "factor": (2048, 1024),
    "out_in": (1024, 2048),
    "pass": (4096, 1024),
}
HBM_TB_S = {"H100": 3.35, "H200": 4.8}
CHAIN_CONFIGS = {  # (block_m, block_n, block_k, group_m, stages, warps): the served `skinny`, then one row tile of 128
    "skinny": GEMM_CONFIGS["skinny"],
    "m128_n32_k128": GemmLaunch(128, 32, 128, 1, 4, 4),
    "m128_n32_k64": GemmLaunch(128, 32, 64, 1, 5, 4),
    "m128_n16_k256": GemmLaunch(128, 16, 256, 1, 3, 4),
    "m128_n64_k64": GemmLaunch(128, 64, 64, 1, 4, 4),
    "m128_n64_k128": GemmLaunch(128, 64, 128, 1, 3, 4),
    "m128_n64_k64_w8": GemmLaunch(128, 64, 64, 1, 4, 8),
    "m64_n64_k64": GemmLaunch(64, 64, 64, 8, 4, 4),
    "m64_n16_k256": GemmLaunch(64, 16, 256, 8, 3, 4),
}


@triton.jit
def _splitk_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE_F32: tl.constexpr,
):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_k * k_per_split
    am, bn = rm % M, rn % N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k0, k0 + k_per_split, BLOCK_K):
        kv = (k + rk) < K
        a = tl.load(x_ptr + am[:, None] * K + (k + rk)[None, :], mask=kv[None, :], other=0.0)
        b = tl.load(w_ptr + bn[None, :] * K + (k + rk)[:, None], mask=kv[:, None], other=0.0)
        if IEEE_F32:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.atomic_add(out_ptr + rm[:, None] * N + rn[None, :], acc, mask=mask, sem="relaxed")


def splitk_linear(
    x: torch.Tensor, weight: torch.Tensor, splits: int, block_n: int = 64, block_k: int = 64
) -> torch.Tensor:
    """x [M <= 128, K] @ weight [N, K].T -> fp32 [M, N] (zeroed, then split-K partial tiles added atomically)."""
    m, k = x.shape
    n = weight.shape[0]
    if m > 128 or weight.shape[1] != k or not (x.is_contiguous() and weight.is_contiguous()):
        raise ValueError(
            f"splitk_linear: x {tuple(x.shape)} (M <= 128) and weight {tuple(weight.shape)} "
            "must be contiguous with one K"
        )
    out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    per = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    _splitk_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, per))](
        x,
        weight,
        out,
        m,
        n,
        k,
        per,
        BLOCK_M=128,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        IEEE_F32=x.dtype == torch.float32 or not x.is_cuda,
        num_warps=4,
        num_stages=3,
    )
    return out


def run(shapes: dict, m: int, splits_list, dtype, rep_ms: int) -> dict:
    from benchmarks.micro.graph_timing import graph_ms

    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    bw = next((v for c, v in HBM_TB_S.items() if c in card), None)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for name, (k, n) in shapes.items():
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        x = torch.randn(m, k, generator=gen).to(dev, dtype)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dev, dtype)
        ref = F.linear(x.float(), w.float())
        row = {"gemm": name, "K": k, "N": n, "M": m, "weight_MB": n * k * x.element_size() / 1e6}
        if bw:
            row["floor_ms"] = (n * k + m * k + m * n) * x.element_size() / (bw * 1e9)
        for splits in splits_list:
            err = (splitk_linear(x, w, splits) - ref).abs().max().item()
            row[f"splitk{splits}_max_err"] = err
            if torch.cuda.is_available():
                row[f"splitk{splits}_ms"] = graph_ms(lambda: splitk_linear(x, w, splits), rep_ms)[0]
        if torch.cuda.is_available():
            row["cublas_ms"] = graph_ms(lambda: F.linear(x, w), rep_ms)[0]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"card": card, "hbm_tb_s": bw, "rows": rows}


def run_chain(shapes: dict, m: int, n_chain: int, dtype, rep_ms: int, configs: dict = CHAIN_CONFIGS) -> dict:
    """-> {card, rows: [{gemm, K, N, M, cublas_us, <config>_us, <config>_max_err, skinny_no_prefetch_us}]}: us per
    launch in a chain of n_chain launches (each its own weight), Triton configs with PDL where the GPU has it
    (each launched early, so it prefetches its weight into L2 first; the served config also without that)."""
    from sglang_lilicorr.kernels.gemm_epilogue import gemm_epilogue_triton
    from benchmarks.micro.graph_timing import graph_ms
    from sglang_lilicorr.kernels.pdl import pdl_supported

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    card = torch.cuda.get_device_name() if cuda else "cpu"
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, (k, n) in shapes.items():
        x = torch.randn(m, k, generator=gen).to(dev, dtype)
        ws = [(torch.randn(n, k, generator=gen) / k**0.5).to(dev, dtype) for _ in range(n_chain)]
        ref = F.linear(x.float(), ws[-1].float())
        pdl = cuda and pdl_supported(x)
        row = {"gemm": name, "K": k, "N": n, "M": m, "chain": n_chain, "pdl": pdl}
        if cuda:
            row["cublas_us"] = graph_ms(lambda: [F.linear(x, w) for w in ws][-1], rep_ms)[0] * 1e3 / n_chain
        runs = {cname: (cfg, None) for cname, cfg in configs.items()}
        if pdl and "skinny" in configs:
            runs["skinny_no_prefetch"] = (configs["skinny"], False)
        for cname, (cfg, prefetch) in runs.items():

            def chain(cfg=cfg, prefetch=prefetch):
                return [gemm_epilogue_triton(x, w, config=cfg, pdl=pdl, prefetch=prefetch) for w in ws][-1]

            try:  # a config may not fit the card (shared memory): recorded, not fatal
                ms, out = graph_ms(chain, rep_ms) if cuda else (None, chain())
            except Exception as e:  # noqa: BLE001
                row[f"{cname}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                continue
            row[f"{cname}_max_err"] = (out.float() - ref).abs().max().item()
            if cuda:
                row[f"{cname}_us"] = ms * 1e3 / n_chain
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"card": card, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="cuBLAS vs a split-K Triton GEMM vs the byte floor at M = 120")
    ap.add_argument("--splits", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under the Triton interpreter")
    ap.add_argument(
        "--chain", type=int, default=0, metavar="N", help="time chains of N launches per shape and config instead"
    )
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gemm_floor.json"))
    args = ap.parse_args(argv)
    if args.chain:

        def measure(shapes, m, dtype):
            configs = {"fp32": GEMM_CONFIGS["fp32"]} if dtype == torch.float32 else CHAIN_CONFIGS
            return run_chain(shapes, m, args.chain, dtype, args.rep_ms, configs)

        def summary(r):
            best = min((r[f"{c}_us"], c) for c in CHAIN_CONFIGS if f"{c}_us" in r)
            return (
                f"{r['gemm']:>9} {r['K']:>5}->{r['N']:<5} in a chain: cuBLAS {r['cublas_us']:5.2f} us, "
                f"skinny {r['skinny_us']:5.2f} us "
                f"(without its weight prefetch {r.get('skinny_no_prefetch_us', float('nan')):5.2f}), "
                f"best {best[1]} {best[0]:5.2f} us per launch"
            )
    else:

        def measure(shapes, m, dtype):
            return run(shapes, m, args.splits, dtype, args.rep_ms)

        def summary(r):
            best = min((r[f"splitk{s}_ms"], s) for s in args.splits)
            return (
                f"{r['gemm']:>9} {r['K']:>5}->{r['N']:<5} floor {r.get('floor_ms', 0) * 1e3:6.1f} us  "
                f"cuBLAS {r['cublas_ms'] * 1e3:6.1f} us  "
                f"split-K best {best[0] * 1e3:6.1f} us (splits {best[1]})"
            )

    if args.smoke:
        res = measure({"tiny": (96, 80)}, 20, torch.float32)
    elif not torch.cuda.is_available():
        print("gemm_floor needs a CUDA GPU (--smoke: a CPU dry run)")
        return 2
    else:
        res = measure(SHAPES, 120, torch.bfloat16)
        for r in res["rows"]:
            print(summary(r))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0
