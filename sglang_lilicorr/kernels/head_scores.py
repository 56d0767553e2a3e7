"""Cosine lattice scores of the LiLiCorr head in Triton, a program per (request, slot): edges [b, S, K, 2D] (out | in),
anchor out [b, D] -> fp32 sigma-scaled cosines start[b, j], pair[b, s-1, i, j]; WALK: the last program walks."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import check_pdl, grid_dependency_wait
from .tuning import CosineLaunch

WALK_MAX_K = 16  # the walk packs a factor's successors 4 bits per candidate into one int64


@triton.jit
def _lattice_cosine_kernel(
    edge_ptr,
    anchor_ptr,
    anchor_stride,
    start_ptr,
    pair_ptr,
    S,
    K,
    D,
    sigma,
    eps,
    succ_ptr,
    count_ptr,
    ids_ptr,
    id_b,
    id_s,
    id_k,
    draft_ptr,  # WALK: [b, S] int64, [b] int32, ids [b, S, K], [b, S]
    KP: tl.constexpr,
    BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
    WALK: tl.constexpr,
    SP: tl.constexpr,  # SP: S rounded up to a power of two
):
    grid_dependency_wait(PDL)
    req = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    ks = tl.arange(0, KP)  # KP >= 16: tl.dot's smallest tile
    kv = ks < K
    is_start = s == 0
    row_w = 2 * D
    in_rows = edge_ptr + ((req * S + s) * K + ks) * row_w + D  # [KP] in-vector rows of slot s
    # left factor rows: the anchor out vector (s = 0, row 0 only) or slot s-1's out vectors
    a_rows = tl.where(
        is_start, anchor_ptr + req * anchor_stride + ks * 0, edge_ptr + ((req * S + s - 1) * K + ks) * row_w
    )
    a_live = tl.where(is_start, ks == 0, kv)
    dot = tl.zeros((KP, KP), tl.float32)  # a b^T
    gram_a = tl.zeros((KP, KP), tl.float32)  # a a^T: squared norms on the diagonal
    gram_b = tl.zeros((KP, KP), tl.float32)
    for d0 in range(0, D, BLOCK_D):  # all of D, the last step maybe partial
        cols = d0 + tl.arange(0, BLOCK_D)
        dot, gram_a, gram_b = _gram_step(a_rows, in_rows, a_live, kv, cols, D, dot, gram_a, gram_b, F32_DOT, PRECISION)
    # the factor's sigma-scaled cosines, stored (start or pair)
    eye = ks[:, None] == ks[None, :]
    inv_a = 1.0 / tl.maximum(tl.sqrt(tl.sum(tl.where(eye, gram_a, 0.0), 1)), eps)  # [KP] along rows
    inv_b = 1.0 / tl.maximum(tl.sqrt(tl.sum(tl.where(eye, gram_b, 0.0), 0)), eps)  # [KP] along columns
    score = sigma * dot * inv_a[:, None] * inv_b[None, :]
    both = kv[:, None] & kv[None, :]
    tl.store(start_ptr + req * K + ks[:, None] * 0 + ks[None, :], score, mask=is_start & (ks[:, None] == 0) & both)
    tl.store(pair_ptr + ((req * (S - 1) + s - 1) * K + ks[:, None]) * K + ks[None, :], score, mask=(s > 0) & both)
    if WALK:  # store this factor's successors; the request's last program walks all S slots (see module doc)
        masked = tl.where(both, score, -float("inf"))
        top = tl.max(masked, 1)  # [KP] per row candidate i
        succ = tl.min(tl.where(both & (masked == top[:, None]), ks[None, :], KP), 1)  # first argmax over j (< K <= 16)
        # one int64 per factor: candidate i's successor in bits 4i..4i+3 (s = 0: the anchor's, in bits 0..3)
        word = tl.sum(tl.where(kv & (~is_start | (ks == 0)), succ.to(tl.int64) << (4 * ks).to(tl.int64), 0), 0)
        tl.store(succ_ptr + req * S + s, word)
        tl.debug_barrier()  # every thread's stores precede the release below
        arrived = tl.atomic_add(count_ptr + req, 1, sem="acq_rel", scope="gpu")
        if arrived == S - 1:  # the request's last factor: every successor is stored
            steps = tl.arange(0, SP)
            cur = tl.load(succ_ptr + req * S, cache_modifier=".cg")  # the anchor's choice (bits 0..3; the rest zero)
            path = tl.where(steps == 0, cur, 0)
            for t in tl.static_range(1, SP):  # the loads do not depend on the path: all in flight at once
                word = tl.load(succ_ptr + req * S + t, mask=t < S, other=0, cache_modifier=".cg")
                cur = tl.where(t < S, (word >> (4 * cur)) & 15, cur)  # the walk's step: a shift, no reduction
                path = tl.where(steps == t, cur, path)
            tokens = tl.load(ids_ptr + req * id_b + steps * id_s + path * id_k, mask=steps < S, other=0)
            tl.store(draft_ptr + req * S + steps, tokens.to(tl.int64), mask=steps < S)
            tl.atomic_xchg(count_ptr + req, 0, sem="relaxed", scope="gpu")


@triton.jit
def _gram_step(
    a_rows, in_rows, a_live, kv, cols, D, dot, gram_a, gram_b, F32_DOT: tl.constexpr, PRECISION: tl.constexpr
):
    """One BLOCK_D-column step of the factor's three Grams: a b^T, a a^T, b b^T."""
    cv = cols < D
    a = tl.load(a_rows[:, None] + cols[None, :], mask=a_live[:, None] & cv[None, :], other=0.0)
    b = tl.load(in_rows[:, None] + cols[None, :], mask=kv[:, None] & cv[None, :], other=0.0)
    if F32_DOT:
        a, b = a.to(tl.float32), b.to(tl.float32)
    dot = tl.dot(a, tl.trans(b), dot, input_precision=PRECISION)
    gram_a = tl.dot(a, tl.trans(a), gram_a, input_precision=PRECISION)
    gram_b = tl.dot(b, tl.trans(b), gram_b, input_precision=PRECISION)
    return dot, gram_a, gram_b


def lattice_cosine_triton(
    edges: torch.Tensor,  # [b, S, K, 2D] out | in head outputs (un-normalised)
    anchor_out: torch.Tensor,  # [b, D] anchor out head output (un-normalised), unit column stride
    sigma: float,
    eps: float,
    launch: CosineLaunch = CosineLaunch(),
    *,
    pdl: bool = False,  # programmatic dependent launch (kernels/pdl.py)
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (start fp32 [b, K], pair fp32 [b, S-1, K, K])."""
    return _launch_cosine("lattice_cosine_triton", edges, anchor_out, sigma, eps, launch, pdl)[:2]


def lattice_cosine_walk_triton(
    edges: torch.Tensor,  # [b, S, K, 2D] out | in head outputs (un-normalised)
    anchor_out: torch.Tensor,  # [b, D] anchor out head output (un-normalised), unit column stride
    sigma: float,
    eps: float,
    ids: torch.Tensor,  # [b, S, K] candidate token ids
    counters: torch.Tensor,  # int32 zeros, >= b entries (one per request); left zero (reused across calls and replays)
    launch: CosineLaunch = CosineLaunch(),
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (start fp32 [b, K], pair fp32 [b, S-1, K, K], the greedy walk's candidates' ids [b, S] int64)."""
    b, s, k = edges.shape[:3]
    if k > WALK_MAX_K:
        raise ValueError(
            f"lattice_cosine_walk_triton: K={k} candidates; the walk packs 4-bit successors, K <= {WALK_MAX_K}"
        )
    if tuple(ids.shape) != (b, s, k) or ids.device != edges.device:
        raise ValueError(
            f"lattice_cosine_walk_triton: ids {tuple(ids.shape)} on {ids.device} "
            f"must be [b, S, K] = [{b}, {s}, {k}] on {edges.device}"
        )
    if counters.dtype != torch.int32 or counters.dim() != 1 or counters.numel() < b or counters.device != edges.device:
        raise ValueError(
            f"lattice_cosine_walk_triton: counters must be int32 zeros with >= {b} entries on {edges.device}, "
            f"got {counters.dtype} {tuple(counters.shape)} on {counters.device}"
        )
    return _launch_cosine("lattice_cosine_walk_triton", edges, anchor_out, sigma, eps, launch, pdl, (ids, counters))


def _launch_cosine(name, edges, anchor_out, sigma, eps, launch, pdl, walk=None):
    check_pdl(pdl, edges, name)
    b, s, k, two_d = edges.shape
    d = two_d // 2
    if two_d % 2 or anchor_out.shape != (b, d) or anchor_out.stride(-1) != 1:
        raise ValueError(
            f"{name}: edges {tuple(edges.shape)} and anchor_out {tuple(anchor_out.shape)} "
            f"(stride {anchor_out.stride()}) disagree; expected [b, S, K, 2D] and [b, D] with unit column stride"
        )
    if anchor_out.dtype != edges.dtype:
        raise ValueError(f"{name}: anchor_out is {anchor_out.dtype} but edges are {edges.dtype}; cast one")
    edges = edges.contiguous()
    dev = edges.device
    start = torch.empty((b, k), dtype=torch.float32, device=dev)
    pair = torch.empty((b, max(s - 1, 0), k, k), dtype=torch.float32, device=dev)
    kp = max(16, triton.next_power_of_2(k))
    draft = None
    block_d = launch.step(d)
    walk_args = (start, start, start, 0, 0, 0, start)  # unused without the walk (start stands in for the pointers)
    if walk is not None:
        (ids, counters), draft = walk, torch.empty((b, s), dtype=torch.int64, device=dev)
        succ = torch.empty((b, s), dtype=torch.int64, device=dev)
        walk_args = (succ, counters, ids, *ids.stride(), draft)
    if b and s:
        f32 = edges.dtype == torch.float32 or not edges.is_cuda  # IEEE fp32 dots
        f32_dot = launch.f32_dot or f32
        args = (edges, anchor_out, anchor_out.stride(0), start, pair, s, k, d, float(sigma), float(eps), *walk_args)
        _lattice_cosine_kernel[(b, s)](
            *args,
            KP=kp,
            BLOCK_D=block_d,
            F32_DOT=f32_dot,
            PRECISION="ieee" if f32 else "tf32",
            PDL=pdl,
            WALK=walk is not None,
            SP=triton.next_power_of_2(s),
            launch_pdl=pdl,
            num_warps=launch.num_warps,
            num_stages=1 if f32_dot else launch.num_stages,  # fp32 tiles: no room to pipeline
        )
    return start, pair, draft
