"""Lattice decoders (paper Eq. 8, App. F) in Triton, a program per request, exactly sglang_lilicorr.walk's (ties to the
lowest index, -inf allowed): start [b, K], pair [b, S-1, K, K] -> idx [b, S] int64, or their candidate ids."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import check_pdl, grid_dependency_wait
from .device import uses_triton
from .topk_reference import MAX_TOPK

MAX_BLOCK_SIZE = 32  # B = anchor + S slots: one program unrolls the S <= 31 slots of a request's lattice


@triton.jit
def _first_argmax(x, lanes, valid):
    """Index of the largest valid entry of x [KP]; ties (and an all -inf x) -> lowest index."""
    top = tl.max(tl.where(valid, x, -float("inf")), 0)
    return tl.min(tl.where(valid & (x == top), lanes, x.shape[0]), 0)


@triton.jit
def _store_path(idx_ptr, req, S, steps, path, ids_ptr, id_b, id_s, id_k, GATHER: tl.constexpr):
    """The request's path [SP] -> idx[req, :S]: the candidate indices, or with GATHER their ids."""
    out = path.to(tl.int64)
    if GATHER:
        out = tl.load(ids_ptr + req * id_b + steps * id_s + path * id_k, mask=steps < S, other=0).to(tl.int64)
    tl.store(idx_ptr + req * S + steps, out, mask=steps < S)


@triton.jit
def _greedy_path(start, pair_ptr, S, K, pr_s, pr_i, pr_j, lanes, valid, steps, KP: tl.constexpr, SP: tl.constexpr):
    """The greedy walk's path [SP]: from the anchor's best candidate, each slot the best continuation of the last."""
    # the request's whole pair lattice in one load (no dependent loads in the walk): rows (s-1) * KP + i, columns j
    rows = tl.arange(0, SP * KP)
    r_step, r_cand = rows // KP, rows % KP
    live = (r_step < S - 1)[:, None] & (r_cand < K)[:, None] & valid[None, :]
    offs = r_step[:, None] * pr_s + r_cand[:, None] * pr_i + lanes[None, :] * pr_j
    lattice = tl.load(pair_ptr + offs, mask=live, other=-float("inf")).to(tl.float32)
    cur = _first_argmax(start, lanes, valid)
    path = tl.where(steps == 0, cur, 0)  # [SP]
    for s in range(1, S):
        row = tl.max(tl.where(rows[:, None] == (s - 1) * KP + cur, lattice, -float("inf")), 0)  # [KP]
        cur = _first_argmax(row, lanes, valid)
        path = tl.where(steps == s, cur, path)
    return path


@triton.jit
def _viterbi_path(start, pair_ptr, S, K, pr_s, pr_i, pr_j, lanes, valid, steps, KP: tl.constexpr, SP: tl.constexpr):
    """The Viterbi path [SP]: the max-sum dynamic programme forward, then its back-pointers from the last slot."""
    best = start
    back = tl.zeros((SP, KP), dtype=tl.int32)  # back[s, j]: best predecessor of candidate j at slot s+1
    tile = lanes[:, None] * pr_i + lanes[None, :] * pr_j
    tile_valid = valid[:, None] & valid[None, :]
    for s in range(1, S):
        p = tl.load(pair_ptr + (s - 1) * pr_s + tile, mask=tile_valid, other=-float("inf")).to(tl.float32)
        cand = best[:, None] + p  # [KP prev, KP next]
        best = tl.max(cand, 0)
        arg = tl.min(tl.where(valid[:, None] & (cand == best[None, :]), lanes[:, None], KP), 0)
        back = tl.where(steps[:, None] == s, arg[None, :], back)
    cur = _first_argmax(best, lanes, valid)
    path = tl.where(steps == S - 1, cur, 0)  # [SP]
    for t in range(1, S):  # follow back-pointers from slot S down to slot 1
        s = S - t
        cur = tl.sum(tl.where((steps[:, None] == s) & (lanes[None, :] == cur), back, 0), axis=None)
        path = tl.where(steps == s - 1, cur, path)
    return path


@triton.jit
def _walk_kernel(
    start_ptr,
    pair_ptr,
    idx_ptr,
    S,
    K,
    st_b,
    st_k,
    pr_b,
    pr_s,
    pr_i,
    pr_j,  # strides of start [b, K] and pair [b, S-1, K, K]
    ids_ptr,
    id_b,
    id_s,
    id_k,  # GATHER: candidate ids [b, S, K]; idx then receives ids[path]
    KP: tl.constexpr,
    SP: tl.constexpr,  # K and S rounded up to powers of two
    GATHER: tl.constexpr,
    PDL: tl.constexpr,
    VITERBI: tl.constexpr,  # the rule: the Viterbi path, else the greedy walk
):
    grid_dependency_wait(PDL)
    req = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, KP)
    valid = lanes < K
    steps = tl.arange(0, SP)
    # the request's anchor-pair scores start[req, :] as fp32 [KP] (-inf past K), and its pair lattice
    start = tl.load(start_ptr + req * st_b + lanes * st_k, mask=valid, other=-float("inf")).to(tl.float32)
    pair_ptr += req * pr_b
    if VITERBI:
        path = _viterbi_path(start, pair_ptr, S, K, pr_s, pr_i, pr_j, lanes, valid, steps, KP, SP)
    else:
        path = _greedy_path(start, pair_ptr, S, K, pr_s, pr_i, pr_j, lanes, valid, steps, KP, SP)
    _store_path(idx_ptr, req, S, steps, path, ids_ptr, id_b, id_s, id_k, GATHER)


def _check_lattice(name: str, start: torch.Tensor, pair: torch.Tensor) -> None:
    if start.dim() != 2 or pair.dim() != 4:
        raise ValueError(
            f"{name}: expected start [b, K] and pair [b, S-1, K, K], got {tuple(start.shape)} and {tuple(pair.shape)}"
        )
    b, k = start.shape
    if pair.shape[0] != b or pair.shape[2:] != (k, k):
        raise ValueError(
            f"{name}: pair {tuple(pair.shape)} does not match start {tuple(start.shape)}; expected [{b}, S-1, {k}, {k}]"
        )
    if not 1 <= k <= MAX_TOPK:
        raise ValueError(f"{name}: K={k} candidates per slot; the kernel serves 1..{MAX_TOPK}")
    if not 1 <= pair.shape[1] + 1 <= MAX_BLOCK_SIZE - 1:
        raise ValueError(
            f"{name}: S={pair.shape[1] + 1} slots; the kernel serves 1..{MAX_BLOCK_SIZE - 1} (blocks of at "
            f"most {MAX_BLOCK_SIZE} tokens)"
        )
    if not (start.is_floating_point() and pair.is_floating_point()):
        raise TypeError(f"{name}: scores must be floating point, got {start.dtype} and {pair.dtype}")
    if start.device != pair.device or not uses_triton(start):
        raise ValueError(
            f"{name}: needs start and pair on one CUDA device (or CPU with TRITON_INTERPRET=1), got "
            f"{start.device} and {pair.device}; use sglang_lilicorr.walk for the PyTorch reference"
        )


def _launch(viterbi: bool, name: str, start: torch.Tensor, pair: torch.Tensor, pdl: bool, **gather) -> torch.Tensor:
    _check_lattice(name, start, pair)
    check_pdl(pdl, start, name)
    (b, k), slots = start.shape, pair.shape[1] + 1
    idx = torch.empty((b, slots), dtype=torch.int64, device=start.device)
    if b:
        kp, sp = triton.next_power_of_2(k), triton.next_power_of_2(slots)
        args = (start, pair, idx, slots, k, *start.stride(), *pair.stride())
        meta = dict(**gather, KP=kp, SP=sp, PDL=pdl, VITERBI=viterbi, launch_pdl=pdl)
        _walk_kernel[(b,)](*args, **meta, num_warps=max(1, min(4, sp * kp * kp // 1024)))  # <= 32 scores per thread
    return idx


def _decode(
    viterbi: bool, name: str, start: torch.Tensor, pair: torch.Tensor, ids: torch.Tensor | None, pdl: bool
) -> torch.Tensor:
    if ids is None:
        return _launch(viterbi, name, start, pair, pdl, ids_ptr=start, id_b=0, id_s=0, id_k=0, GATHER=False)
    if ids.shape != (start.shape[0], pair.shape[1] + 1, start.shape[1]) or ids.device != start.device:
        raise ValueError(
            f"{name}: ids {tuple(ids.shape)} on {ids.device} must be [b, S, K] = "
            f"[{start.shape[0]}, {pair.shape[1] + 1}, {start.shape[1]}] on {start.device}"
        )
    id_b, id_s, id_k = ids.stride()
    return _launch(viterbi, name, start, pair, pdl, ids_ptr=ids, id_b=id_b, id_s=id_s, id_k=id_k, GATHER=True)


def greedy_walk_triton(
    start: torch.Tensor, pair: torch.Tensor, ids: torch.Tensor | None = None, *, pdl: bool = False
) -> torch.Tensor:
    """Greedy walk (each slot the best continuation of the one before) -> idx [b, S] int64, or their ids."""
    return _decode(False, "greedy_walk_triton", start, pair, ids, pdl)


def viterbi_triton(
    start: torch.Tensor, pair: torch.Tensor, ids: torch.Tensor | None = None, *, pdl: bool = False
) -> torch.Tensor:
    """Exact maximiser of g(c) = z_1[c_1] + sum_s pair[s, c_s, c_{s+1}] -> idx [b, S] int64, or their ids."""
    return _decode(True, "viterbi_triton", start, pair, ids, pdl)
