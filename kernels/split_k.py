"""x @ weight.T as split-K partials, in Triton, for a consumer that sums them in its own epilogue.

The head's pass projection (paper Section 3.2: pass_hidden_proj over the drafter's slot states) is a
GEMM of few rows (b * S = 15 at bs 1) and a long K (the target's hidden size, 4096 at the paper
config): as one tile per output column block it runs a long serial K loop on a few SMs. Here the K
extent is cut into P parts, one program per (row tile, column tile, part), each writing its fp32
partial; nothing reduces them in this launch. The node epilogue that reads the projection sums the P
partials in order (kernels/head_nodes.node_sum), so the reduction costs no launch (PERF_NOTES.md,
version 18).

  x        [M, K]     unit stride along K
  weight   [N, K]     nn.Linear layout, unit stride along K
  partials [P, M, N]  fp32; sum over P (in order) = x @ weight.T in fp32

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
    x_ptr, w_ptr, part_ptr, M, N, K, k_part, stride_xm, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, IEEE_F32: tl.constexpr,
):
    pid_m, pid_n, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = part * k_part
    acc = gemm_tile(x_ptr + k0, w_ptr + k0, rm, rn, M, N, tl.minimum(k_part, K - k0), stride_xm, stride_wn,
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE_F32)
    at = part.to(tl.int64) * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(part_ptr + at, acc, mask=(rm < M)[:, None] & (rn < N)[None, :])


def part_plan(k: int) -> tuple[int, int]:
    """K -> (parts P, K columns per part: a multiple of BLOCK_K); the last part may be shorter."""
    parts = max(1, min(MAX_PARTS, k // MIN_K_PER_PART))
    k_part = triton.cdiv(triton.cdiv(k, parts), BLOCK_K) * BLOCK_K
    return triton.cdiv(k, k_part), k_part


def linear_split_k_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """PyTorch definition of the partials' sum: x @ weight.T in fp32 [M, N]."""
    return x.float() @ weight.float().T


def linear_split_k_triton(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T -> fp32 partials [P, M, N] (P = part_plan(K)[0]) whose sum is the product."""
    name = "linear_split_k_triton"
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{name}: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be [M, K] and [N, K] with the same K")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"{name}: x is {x.dtype} on {x.device}, weight {weight.dtype} on {weight.device}; cast / move one")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"{name}: x strides {x.stride()} / weight strides {weight.stride()} need unit stride along K")
    (m, k), n = x.shape, weight.shape[0]
    parts, k_part = part_plan(k)
    out = torch.empty((parts, m, n), dtype=torch.float32, device=x.device)
    if m and n:
        block_m = min(64, max(16, triton.next_power_of_2(m)))
        _linear_split_k_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, BLOCK_N), parts)](
            x, weight, out, m, n, k, k_part, x.stride(0), weight.stride(0),
            BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, EVEN_K=k % k_part == 0,
            IEEE_F32=x.dtype == torch.float32 or not x.is_cuda, num_warps=4, num_stages=3,
        )
    return out
