"""Cosine lattice scores of the LiLiCorr head (paper Eq. 6-7), in Triton.

From the un-normalised out/in head outputs (one fused GEMM: edges [b, S, K, 2D], out in the first
D columns, in in the last D) and the un-normalised anchor out vector [b, D], one program per
(request, slot s) computes the sigma-scaled cosines of one K x K factor in fp32, the dot products
as one tl.dot per D-chunk (K padded to 16 rows): TF32 tensor cores for bf16/fp16 inputs, which TF32
holds exactly (so every product is exact in the fp32 accumulator), IEEE FMAs for fp32 inputs:

  s = 0:   start[b, j]         = sigma * cos(anchor_out, in_{1, j})
  s >= 1:  pair[b, s-1, i, j]  = sigma * cos(out_{s, i}, in_{s+1, j})

The norms are taken as F.normalize does: x / max(|x|, eps). No host syncs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _lattice_cosine_kernel(
    edge_ptr, anchor_ptr, anchor_stride, start_ptr, pair_ptr,
    S, K, D, sigma, eps,
    KP: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    ks = tl.arange(0, KP)  # KP >= 16: tl.dot's smallest tile
    kv = ks < K
    is_start = s == 0
    row_w = 2 * D
    in_rows = edge_ptr + ((req * S + s) * K + ks) * row_w + D  # [KP] in-vector rows of slot s
    # left factor rows: the anchor out vector (s = 0, row 0 only) or slot s-1's out vectors
    a_rows = tl.where(is_start, anchor_ptr + req * anchor_stride + ks * 0, edge_ptr + ((req * S + s - 1) * K + ks) * row_w)
    a_live = tl.where(is_start, ks == 0, kv)
    dot = tl.zeros((KP, KP), tl.float32)
    na = tl.zeros((KP,), tl.float32)
    nb = tl.zeros((KP,), tl.float32)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        cv = cols < D
        a = tl.load(a_rows[:, None] + cols[None, :], mask=a_live[:, None] & cv[None, :], other=0.0).to(tl.float32)
        b = tl.load(in_rows[:, None] + cols[None, :], mask=kv[:, None] & cv[None, :], other=0.0).to(tl.float32)
        dot = tl.dot(a, tl.trans(b), dot, input_precision=PRECISION)
        na += tl.sum(a * a, 1)
        nb += tl.sum(b * b, 1)
    inv_a = 1.0 / tl.maximum(tl.sqrt(na), eps)
    inv_b = 1.0 / tl.maximum(tl.sqrt(nb), eps)
    score = sigma * dot * inv_a[:, None] * inv_b[None, :]
    both = kv[:, None] & kv[None, :]
    tl.store(start_ptr + req * K + ks[:, None] * 0 + ks[None, :], score,
             mask=is_start & (ks[:, None] == 0) & both)
    tl.store(pair_ptr + ((req * (S - 1) + s - 1) * K + ks[:, None]) * K + ks[None, :], score,
             mask=(s > 0) & both)


def lattice_cosine_triton(
    edges: torch.Tensor,  # [b, S, K, 2D] out | in head outputs (un-normalised)
    anchor_out: torch.Tensor,  # [b, D] anchor out head output (un-normalised), unit column stride
    sigma: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (start fp32 [b, K], pair fp32 [b, S-1, K, K])."""
    b, s, k, two_d = edges.shape
    d = two_d // 2
    if two_d % 2 or anchor_out.shape != (b, d) or anchor_out.stride(-1) != 1:
        raise ValueError(
            f"lattice_cosine_triton: edges {tuple(edges.shape)} and anchor_out {tuple(anchor_out.shape)} "
            f"(stride {anchor_out.stride()}) disagree; expected [b, S, K, 2D] and [b, D] with unit column stride"
        )
    edges = edges.contiguous()
    start = torch.empty((b, k), dtype=torch.float32, device=edges.device)
    pair = torch.empty((b, max(s - 1, 0), k, k), dtype=torch.float32, device=edges.device)
    if b and s:
        kp = max(16, triton.next_power_of_2(k))
        block_d = max(16, min(triton.next_power_of_2(d), 128))  # two [KP, BLOCK_D] tiles per step
        _lattice_cosine_kernel[(b, s)](
            edges, anchor_out, anchor_out.stride(0), start, pair, s, k, d, float(sigma), float(eps),
            KP=kp, BLOCK_D=block_d, PRECISION="ieee" if edges.dtype == torch.float32 else "tf32", num_warps=4,
        )
    return start, pair
