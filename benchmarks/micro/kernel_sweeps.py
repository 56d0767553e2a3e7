"""`python -m benchmarks kernel-sweeps KERNEL`: one kernel timed alone on a GPU (CUDA-graph replay, median ms) at its
default launch and, with --sweep, at the alternatives below, against its PyTorch definition. The launch tables these
runs chose are sglang_lilicorr/kernels/tuning.py's (each entry names the card and commit of its sweep)."""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton

from sglang_lilicorr.kernels.gemm_epilogue import gemm_epilogue_reference, linear_silu_triton, select_config
from sglang_lilicorr.kernels.head_scores import CosineLaunch, lattice_cosine_triton
from sglang_lilicorr.kernels.lattice_attention import lattice_attention_reference, lattice_attention_triton
from sglang_lilicorr.kernels.topk_lse_fused import TopKLaunch, even_splits, split_plan, topk_lse_triton
from sglang_lilicorr.kernels.topk_reference import topk_lse_reference
from sglang_lilicorr.kernels.tuning import GEMM_CONFIGS

from .graph_timing import graph_ms

TOPK_SWEEP = (  # the launches `bench_topk_lse(sweep=True)` times beside the default TopKLaunch()
    TopKLaunch(block=512, maxnreg=64),  # 512-logit tiles in 64 registers
    TopKLaunch(programs_per_sm=8),
    TopKLaunch(programs_per_sm=24),  # 80 registers used: 25 one-warp programs fit an SM
    TopKLaunch(block=2048, maxnreg=255, programs_per_sm=8),
)


def bench_topk_lse(
    n_list=(15, 60, 240, 480),
    vocab: int = 151936,
    k: int = 8,
    *,
    sweep: bool = False,
    splits_list=(),
    rep_ms: int = 100,
    pdl: bool = False,
):
    """On CUDA, bf16 logits [N, V]: ms per call (graph replay, median) of topk_lse_triton with the default launch
    (and with each TOPK_SWEEP launch, and with the default at each of `splits_list` chunks per row instead of
    split_plan's) and of torch.topk + logsumexp -> rows {N, launch, splits, ms, torch_ms, equal}.
    `pdl`: the kernels launched as the select path launches them under PDL (sm_90+)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench_topk_lse: needs a CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for n in n_list:
        logits = torch.randn(n, vocab, device="cuda", dtype=torch.bfloat16, generator=gen) * 4
        torch_ms = graph_ms(lambda: (logits.float().topk(k, dim=-1), logits.float().logsumexp(-1)), rep_ms)[0]
        ref_vals, ref_ids, ref_lse = topk_lse_reference(logits, k)
        runs = [(launch, None) for launch in ((TopKLaunch(), *TOPK_SWEEP) if sweep else (TopKLaunch(),))]
        runs += [(TopKLaunch(), splits) for splits in splits_list]
        for launch, splits in runs:
            ms, got = graph_ms(lambda: topk_lse_triton(logits, k, splits, launch=launch, pdl=pdl), rep_ms)
            vals, ids, lse = got
            same = (
                torch.equal(ids, ref_ids)
                and torch.equal(vals, ref_vals)
                and bool(torch.allclose(lse, ref_lse, atol=1e-4))
            )
            planned = (
                split_plan(n, vocab, logits.device, launch)
                if splits is None
                else even_splits(vocab, splits, launch.block)
            )[0]
            rows.append(dict(N=n, launch=launch._asdict(), splits=planned, ms=ms, torch_ms=torch_ms, equal=same))
    return rows


COSINE_SWEEP = (  # the launches `bench_lattice_cosine(sweep=True)` times beside the default CosineLaunch()
    CosineLaunch(f32_dot=True),  # fp32 copies of the operands (then not pipelined)
    CosineLaunch(num_stages=1),
    CosineLaunch(block_d=64, num_stages=4),
    CosineLaunch(block_d=128, num_stages=5),
    CosineLaunch(block_d=256, num_stages=4),
    CosineLaunch(block_d=128, num_warps=8, num_stages=4),
)


def bench_lattice_cosine(
    bs_list=(1, 4, 16, 32), S: int = 15, K: int = 8, D: int = 1024, *, sweep: bool = False, rep_ms: int = 100
):
    """On CUDA, bf16 edges [b, S, K, 2D] (paper geometry): ms per call (graph replay, median) of
    lattice_cosine_triton with the default launch (and each COSINE_SWEEP launch) -> rows {bs, launch, ms, max_err}
    (max_err: against the fp32 F.normalize definition)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench_lattice_cosine: needs a CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for bs in bs_list:
        edges = torch.randn(bs, S, K, 2 * D, device="cuda", dtype=torch.bfloat16, generator=gen)
        anchor = torch.randn(bs, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        out_v, in_v = F.normalize(edges.float().view(bs, S, K, 2, D), dim=-1).unbind(3)
        ref_start = 8.0 * torch.einsum("bd,bkd->bk", F.normalize(anchor.float(), dim=-1), in_v[:, 0])
        ref_pair = 8.0 * out_v[:, :-1] @ in_v[:, 1:].transpose(-1, -2)
        for launch in (CosineLaunch(), *COSINE_SWEEP) if sweep else (CosineLaunch(),):
            ms, (start, pair) = graph_ms(lambda: lattice_cosine_triton(edges, anchor, 8.0, 1e-6, launch), rep_ms)
            err = max(float((start - ref_start).abs().max()), float((pair - ref_pair).abs().max()))
            rows.append(dict(bs=bs, launch=launch._asdict(), ms=ms, max_err=err))
    return rows


def bench_lattice_attention(bs_list=(1, 4, 32), launches=((64, 4), (128, 8), (32, 4), (16, 4)), *, rep_ms: int = 100):
    """On CUDA, bf16 at the paper shape (8 heads of 128, L = 120): ms per call (graph replay, median) of
    LatticeAttention's SDPA call and of this kernel at each (block_m, num_warps) -> rows {bs, launch, ms, sdpa_ms}."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench_lattice_attention: needs a CUDA device")
    heads, dh, length = 8, 128, 120
    gen = torch.Generator(device="cuda").manual_seed(0)
    bias = torch.randn(heads, length, length, device="cuda", dtype=torch.bfloat16, generator=gen)
    rows = []
    for bs in bs_list:
        qkv = torch.randn(bs * length, 3 * heads * dh, device="cuda", dtype=torch.bfloat16, generator=gen)
        sdpa_ms = graph_ms(lambda: lattice_attention_reference(qkv, bias, heads), rep_ms)[0]
        for block_m, warps in launches:
            ms = graph_ms(lambda: lattice_attention_triton(qkv, bias, heads, block_m=block_m, num_warps=warps), rep_ms)[
                0
            ]
            rows.append(dict(bs=bs, launch=dict(block_m=block_m, num_warps=warps), ms=ms, sdpa_ms=sdpa_ms))
    return rows


def bench_linear_silu(
    m_list=(120, 480, 960, 1920, 3840),
    K: int = 1024,
    N: int = 2048,
    *,
    dtype=torch.bfloat16,
    sweep: bool = False,
    rep_ms: int = 100,
) -> list[dict]:
    """On CUDA: ms per call (median of triton.testing.do_bench over the replay of a CUDA graph that
    captured one call; do_bench flushes L2 between calls) of linear_silu_triton and of
    F.silu(F.linear(...)) at each M -> rows {M, config, triton_ms, torch_ms, speedup}. With sweep,
    one row per 16-bit config at each M (the selected one is marked with '*'; TMA configs from M > 128)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench_linear_silu: needs a CUDA device")

    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(N, K, device="cuda", dtype=dtype, generator=gen) * K**-0.5
    bias = torch.randn(N, device="cuda", dtype=dtype, generator=gen)
    rows = []
    for m in m_list:
        x = torch.randn(m, K, device="cuda", dtype=dtype, generator=gen)
        torch_ms = graph_ms(lambda: gemm_epilogue_reference(x, weight, bias, silu=True), rep_ms)[0]
        chosen = select_config(m, dtype)
        for name in (
            [c for c in GEMM_CONFIGS if c != "fp32" and (m > 128 or not GEMM_CONFIGS[c].tma)] if sweep else [chosen]
        ):
            ms = graph_ms(lambda: linear_silu_triton(x, weight, bias, config=name), rep_ms)[0]
            label = name + ("*" if sweep and name == chosen else "")
            rows.append(dict(M=m, config=label, triton_ms=ms, torch_ms=torch_ms, speedup=torch_ms / ms))
    return rows


def format_bench(rows: list[dict]) -> str:
    """The rows of bench_linear_silu as a text table."""
    lines = [f"{'M':>6} {'config':>11} {'triton ms':>10} {'torch ms':>10} {'speedup':>8}"]
    lines += [
        f"{r['M']:>6} {r['config']:>11} {r['triton_ms']:>10.4f} {r['torch_ms']:>10.4f} {r['speedup']:>8.2f}"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("kernel", choices=("topk-lse", "lattice-cosine", "lattice-attention", "linear-silu"))
    p.add_argument("--sweep", action="store_true", help="also every launch of the kernel's sweep")
    p.add_argument("--n", type=int, nargs="+", default=[15, 60, 240, 480], help="topk-lse: rows N")
    p.add_argument("--splits", type=int, nargs="*", default=[], help="topk-lse: also the default at these chunks/row")
    p.add_argument("--pdl", action="store_true", help="topk-lse: launched as the select path does under PDL (sm_90+)")
    args = p.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}, bf16, triton {triton.__version__}, torch {torch.__version__}")
    if args.kernel == "linear-silu":
        print(format_bench(bench_linear_silu(sweep=args.sweep)))
        return 0
    rows = {
        "topk-lse": lambda: bench_topk_lse(args.n, sweep=args.sweep, splits_list=args.splits, pdl=args.pdl),
        "lattice-cosine": lambda: bench_lattice_cosine(sweep=args.sweep),
        "lattice-attention": bench_lattice_attention,
    }[args.kernel]()
    for r in rows:
        print(json.dumps(r), flush=True)
    return 0
