"""x @ weight.T with K split over programs and the parts reduced in the same launch, in Triton.

The head's pass projection (paper Section 3.2: pass_hidden_proj over the drafter's slot states) is a
GEMM of few rows (b * S = 15 at bs 1) and a long K (the target's hidden size, 4096 at the paper
config): as one tile per output column block it runs a long serial K loop on a few SMs, and cuBLAS
takes a split-K GEMM plus a reduce kernel. Here the K extent is cut into P parts, one program per
(row tile, column tile, part), each writing its fp32 partial; then it counts itself in on the output
tile's counter (a CTA barrier, one acq_rel atomic at GPU scope), and the tile's last part to arrive
sums the P partials in part order (deterministic), rounds once and writes the tile, then resets the
counter (PERF_NOTES.md, version 18).

  x        [M, K]  unit stride along K
  weight   [N, K]  nn.Linear layout, unit stride along K
  out      [M, N]  x @ weight.T in x's dtype, fp32 accumulation, one rounding (F.linear's math)
  counters int32 zeros, >= (output tiles) entries, used by this stream only; every launch leaves them zero

No host syncs; the launch geometry depends on the shapes only (CUDA-graph capturable).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ffn_silu import gemm_tile

MIN_K_PER_PART = 512  # K columns per part at least: 8 parts at K = 4096
MAX_PARTS = 8
BLOCK_N, BLOCK_K = 64, 128  # 16 column tiles x 8 parts = 128 programs at the paper config (132 SMs)


@triton.jit
def _linear_split_k_kernel(
    x_ptr, w_ptr, part_ptr, out_ptr, count_ptr, M, N, K, k_part, stride_xm, stride_wn,
    PARTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE_F32: tl.constexpr,
):
    pid_m, pid_n, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = part * k_part
    acc = gemm_tile(x_ptr + k0, w_ptr + k0, rm, rn, M, N, tl.minimum(k_part, K - k0), stride_xm, stride_wn,
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE_F32)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    at = rm.to(tl.int64)[:, None] * N + rn[None, :]
    if PARTS == 1:
        tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + part.to(tl.int64) * M * N + at, acc, mask=mask)
        tl.debug_barrier()  # every thread's stores precede the release below
        tile = pid_m * tl.num_programs(1) + pid_n
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == PARTS - 1:  # the tile's last part: every partial is stored
            total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for p in tl.static_range(PARTS):  # in part order: the same sum whichever part arrives last
                total += tl.load(part_ptr + p * M * N + at, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + at, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")


def part_plan(k: int) -> tuple[int, int]:
    """K -> (parts P, K columns per part: a multiple of BLOCK_K); the last part may be shorter."""
    parts = max(1, min(MAX_PARTS, k // MIN_K_PER_PART))
    k_part = triton.cdiv(triton.cdiv(k, parts), BLOCK_K) * BLOCK_K
    return triton.cdiv(k, k_part), k_part


def linear_split_k_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """PyTorch definition before the one rounding: x @ weight.T in fp32 [M, N]."""
    return x.float() @ weight.float().T


def _block_m(m: int) -> int:
    return min(64, max(16, triton.next_power_of_2(m)))


def output_tiles(m: int, n: int) -> int:
    """Counters a launch at [M, N] needs (its output tiles)."""
    return triton.cdiv(m, _block_m(m)) * triton.cdiv(n, BLOCK_N)


def linear_split_k_triton(x: torch.Tensor, weight: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T -> [M, N] in x's dtype (F.linear without bias), K in part_plan(K) parts."""
    name = "linear_split_k_triton"
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{name}: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be [M, K] and [N, K] with the same K")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"{name}: x is {x.dtype} on {x.device}, weight {weight.dtype} on {weight.device}; cast / move one")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"{name}: x strides {x.stride()} / weight strides {weight.stride()} need unit stride along K")
    (m, k), n = x.shape, weight.shape[0]
    tiles = output_tiles(m, n)
    if counters.dtype != torch.int32 or counters.dim() != 1 or counters.numel() < tiles or counters.device != x.device:
        raise ValueError(f"{name}: counters must be int32 zeros with >= {tiles} entries (output tiles) on {x.device}, "
                         f"got {counters.dtype} {tuple(counters.shape)} on {counters.device}")
    parts, k_part = part_plan(k)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    partials = torch.empty((parts, m, n), dtype=torch.float32, device=x.device) if parts > 1 else out  # (PARTS == 1: unused)
    if m and n:
        block_m = _block_m(m)
        _linear_split_k_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, BLOCK_N), parts)](
            x, weight, partials, out, counters, m, n, k, k_part, x.stride(0), weight.stride(0),
            PARTS=parts, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, EVEN_K=k % k_part == 0,
            IEEE_F32=x.dtype == torch.float32 or not x.is_cuda, num_warps=4, num_stages=3,
        )
    return out
