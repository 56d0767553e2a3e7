"""Lattice self-attention of the LiLiCorr head at serving time, in Triton, in place of LatticeAttention's SDPA:
qkv [b*L, 3H] (the packed QKV GEMM output, q | k | v head-major), bias [heads, L, L] (unit column stride) -> out
[b*L, H] = softmax(scale * q k^T + bias) v as out_proj reads it. L <= 256; exact fp32 softmax over one key tile."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .pdl import check_pdl, grid_dependency_wait, pdl_launch
from .tuning import ATTENTION_BLOCK_M, ATTENTION_ONE_REQUEST_BLOCK_M, ATTENTION_SMALL_BATCH
from .tuning import ATTENTION_SMALL_BATCH_BLOCK_M

MAX_NODES = 256  # one key tile per request: S [BLOCK_M, LP] fp32 must stay in registers
NUM_WARPS = 4


@triton.jit
def _lattice_attention_kernel(
    qkv_ptr,
    qkv_stride,
    bias_ptr,
    bias_head_stride,
    bias_row_stride,
    out_ptr,
    L,
    H,
    DH,
    qk_scale,
    LP: tl.constexpr,
    DP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    IEEE: tl.constexpr,
    F32_DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # query nodes of this program
    keys = tl.arange(0, LP)
    d = tl.arange(0, DP)
    rv, kv, dv = rows < L, keys < L, d < DH
    # the lattice bias is a constant: loaded before the wait, its latency hidden behind the kernel before
    bias = tl.load(
        bias_ptr + head * bias_head_stride + rows[:, None] * bias_row_stride + keys[None, :],
        mask=rv[:, None] & kv[None, :],
        other=0.0,
    )
    grid_dependency_wait(PDL)
    base = qkv_ptr + req * L * qkv_stride + head * DH  # q of (request, head); k at + H, v at + 2H
    q = tl.load(base + rows[:, None] * qkv_stride + d[None, :], mask=rv[:, None] & dv[None, :], other=0.0)
    kv_at = base + keys[:, None] * qkv_stride + d[None, :]
    kv_mask = kv[:, None] & dv[None, :]
    k = tl.load(kv_at + H, mask=kv_mask, other=0.0)  # [LP, DP]
    v = tl.load(kv_at + 2 * H, mask=kv_mask, other=0.0)  # [LP, DP]
    dtype = v.dtype
    if F32_DOT:  # the interpreter's tl.dot multiplies bf16 bit patterns: dot exact fp32 copies instead
        q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
    if IEEE:  # fp32 inputs: IEEE FMAs, not TF32
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, LP] fp32
    s = s * qk_scale + bias.to(tl.float32)  # SDPA: the scores are scaled, then the mask is added
    s = tl.where(kv[None, :], s, float("-inf"))  # padded keys; padded query rows stay finite
    m = tl.max(s, 1)
    p = tl.exp2((s - m[:, None]) * 1.4426950408889634)  # [BLOCK_M, LP] in [0, 1]
    denom = tl.sum(p, 1)
    p = p.to(dtype).to(v.dtype)  # P rounded to the input dtype, as SDPA does
    if IEEE:
        o = tl.dot(p, v, input_precision="ieee")
    else:
        o = tl.dot(p, v)  # [BLOCK_M, DP] fp32
    o = o * (1.0 / denom)[:, None]
    out = out_ptr + (req * L + rows)[:, None] * H + head * DH + d[None, :]
    tl.store(out, o.to(out_ptr.dtype.element_ty), mask=rv[:, None] & dv[None, :])


def _lattice_shapes(qkv: torch.Tensor, bias: torch.Tensor, heads: int, name: str):
    """Validate the packed layout -> (b, L, H, dh, bias [heads, L, L])."""
    if qkv.dim() != 2 or qkv.shape[1] % 3 or qkv.stride(-1) != 1:
        raise ValueError(
            f"{name}: qkv {tuple(qkv.shape)} (strides {qkv.stride()}) must be the [b*L, 3H] output of "
            f"F.linear(x, in_proj_weight, in_proj_bias), width a multiple of 3, unit column stride"
        )
    width = qkv.shape[1] // 3
    if not isinstance(heads, int) or heads < 1 or width % heads:
        raise ValueError(f"{name}: H = {width} (qkv width {3 * width} / 3) is not divisible by heads = {heads!r}")
    if bias.dim() == 4 and bias.shape[0] == 1:
        bias = bias[0]  # the select's [1, heads, L, L] view
    length = bias.shape[-1] if bias.dim() == 3 else 0
    if bias.dim() != 3 or bias.shape != (heads, length, length) or bias.stride(-1) != 1 or not bias.is_floating_point():
        raise ValueError(
            f"{name}: bias {tuple(bias.shape)} (strides {bias.stride()}, {bias.dtype}) must be a float "
            f"[heads={heads}, L, L] (or [1, heads, L, L]) additive mask with unit column stride"
        )
    if length == 0 or qkv.shape[0] % length:
        raise ValueError(
            f"{name}: qkv has {qkv.shape[0]} rows, not a multiple of the bias's L = {length} nodes per request"
        )
    if bias.device != qkv.device:
        raise ValueError(f"{name}: bias is on {bias.device} but qkv is on {qkv.device}; move it there")
    return qkv.shape[0] // length, length, width, width // heads, bias


def lattice_attention_reference(
    qkv: torch.Tensor, bias: torch.Tensor, heads: int, scale: float | None = None
) -> torch.Tensor:
    """PyTorch definition (LatticeAttention.forward between in_proj and out_proj) -> out [b*L, H]."""
    b, length, width, dh, bias = _lattice_shapes(qkv, bias, heads, "lattice_attention_reference")
    q, k, v = qkv.view(b, length, 3, heads, dh).unbind(2)  # [b, L, heads, dh]
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias.to(qkv.dtype), scale=scale
    )
    return o.transpose(1, 2).reshape(b * length, width)


def lattice_attention_triton(
    qkv: torch.Tensor,  # [b*L, 3H] q | k | v, each [heads, dh] head-major; unit column stride
    bias: torch.Tensor,  # [heads, L, L] or [1, heads, L, L], any row stride, unit column stride
    heads: int,
    scale: float | None = None,  # None: 1 / sqrt(dh), as SDPA
    *,
    block_m: int | None = None,  # query rows per program (power of two, 16..LP); None: by batch size
    num_warps: int = NUM_WARPS,
    pdl: bool = False,  # programmatic dependent launch (kernels/pdl.py); `bias` is read before the wait
    launch_pdl: bool | None = None,  # False: launched in full order all the same (after a stream join); None: pdl
) -> torch.Tensor:
    """-> softmax(scale * q k^T + bias) v as out [b*L, H] in qkv's dtype (o.transpose(1, 2) layout)."""
    check_pdl(pdl, qkv, "lattice_attention_triton")
    b, length, width, dh, bias = _lattice_shapes(qkv, bias, heads, "lattice_attention_triton")
    if qkv.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"lattice_attention_triton: qkv dtype {qkv.dtype} unsupported; use bf16, fp16 or fp32")
    if length > MAX_NODES or dh > 256:
        raise ValueError(
            f"lattice_attention_triton: L = {length} nodes, dh = {dh}; one tile holds at most "
            f"{MAX_NODES} nodes and dh <= 256; use lattice_attention_reference"
        )
    lp, dp = max(16, triton.next_power_of_2(length)), max(16, triton.next_power_of_2(dh))
    if block_m is None and b == 1:
        block_m = ATTENTION_ONE_REQUEST_BLOCK_M
    elif block_m is None:
        block_m = ATTENTION_SMALL_BATCH_BLOCK_M if b <= ATTENTION_SMALL_BATCH else ATTENTION_BLOCK_M
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"lattice_attention_triton: block_m = {block_m} must be a power of two >= 16")
    block_m = min(block_m, lp)
    out = torch.empty((qkv.shape[0], width), dtype=qkv.dtype, device=qkv.device)
    if b:
        qk_scale = 1.0 / math.sqrt(dh) if scale is None else float(scale)
        f32_dot = qkv.dtype == torch.bfloat16 and not qkv.is_cuda  # Triton on CPU = the interpreter
        args = (qkv, qkv.stride(0), bias, bias.stride(0), bias.stride(1), out, length, width, dh, qk_scale)
        _lattice_attention_kernel[(b, heads, triton.cdiv(length, block_m))](
            *args,
            LP=lp,
            DP=dp,
            BLOCK_M=block_m,
            IEEE=f32_dot or qkv.dtype == torch.float32,
            F32_DOT=f32_dot,
            **pdl_launch(pdl, launch_pdl),
            num_warps=num_warps,
        )
    return out
