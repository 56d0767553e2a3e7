"""Cosine lattice scores of the LiLiCorr head (paper Eq. 6-7), in Triton.

From the un-normalised out/in head outputs (one fused GEMM: edges [b, S, K, 2D], out in the first
D columns, in in the last D) and the un-normalised anchor out vector [b, D], one program per
(request, slot s) computes the sigma-scaled cosines of one K x K factor in fp32:

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
    KP: tl.constexpr, BLOCK_D: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    ks = tl.arange(0, KP)
    kv = ks < K
    is_start = s == 0
    row_w = 2 * D
    in_rows = edge_ptr + ((req * S + s) * K + ks) * row_w + D  # [KP] in-vector rows of slot s
    out_rows = edge_ptr + ((req * S + s - 1) * K + ks) * row_w  # out-vector rows of slot s-1 (s >= 1)
    a_mask = tl.where(is_start, ks == 0, kv)  # start: the anchor row alone
    dot = tl.zeros((KP, KP), tl.float32)
    na = tl.zeros((KP,), tl.float32)
    nb = tl.zeros((KP,), tl.float32)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        cv = cols < D
        a = tl.load(anchor_ptr + req * anchor_stride + ks[:, None] * 0 + cols[None, :],
                    mask=is_start & a_mask[:, None] & cv[None, :], other=0.0).to(tl.float32)
        a += tl.load(out_rows[:, None] + cols[None, :],
                     mask=(s > 0) & a_mask[:, None] & cv[None, :], other=0.0).to(tl.float32)
        b = tl.load(in_rows[:, None] + cols[None, :], mask=kv[:, None] & cv[None, :], other=0.0).to(tl.float32)
        dot += tl.sum(a[:, None, :] * b[None, :, :], 2)
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
        kp = triton.next_power_of_2(k)
        block_d = max(16, min(triton.next_power_of_2(d), 16384 // (kp * kp)))  # [KP, KP, BLOCK_D] product tile
        _lattice_cosine_kernel[(b, s)](
            edges, anchor_out, anchor_out.stride(0), start, pair, s, k, d, float(sigma), float(eps),
            KP=kp, BLOCK_D=block_d, num_warps=8,
        )
    return start, pair
