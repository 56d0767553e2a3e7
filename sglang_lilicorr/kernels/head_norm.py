"""Residual and fusion epilogues of the lattice transformer at serving time, in Triton: `add_rmsnorm_triton` (x += y
in place, out = RMSNorm(x) * w; with `cross` (anchor state t) out [rows, 2H] = concat[h, h * t] and x left as it was),
`rmsnorm_triton` (no add) and `row_bias_silu_triton` (pre = silu(pre + bias[row // rows_per_group]) in place)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import rows_per_program
from .pdl import check_pdl, grid_dependency_wait


@triton.jit
def norm_store(sf, rstd, rows, cols, mask, H, w_ptr, out_ptr, out_stride, cross_ptr, rows_per_req, CROSS: tl.constexpr):
    """sf [R, C] fp32 row values at (rows, cols) of width H, rstd [R] -> out[rows, cols] = sf * rstd * w
    in out's dtype; with CROSS also out[rows, H + cols] = that * t[rows // rows_per_req, cols]."""
    dtype = out_ptr.dtype.element_ty
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    n = (sf * rstd[:, None] * w[None, :]).to(dtype)
    out = out_ptr + rows[:, None] * out_stride + cols[None, :]
    tl.store(out, n, mask=mask)
    if CROSS:
        t = tl.load(cross_ptr + (rows // rows_per_req)[:, None] * H + cols[None, :], mask=mask, other=0.0)
        tl.store(out + H, (n.to(tl.float32) * t.to(tl.float32)).to(dtype), mask=mask)


SUMSQ_GROUP = tl.constexpr(16)  # columns per partial sum of squares (a row's norm left to the GEMM that reads it)


@triton.jit
def store_sumsq(v, rows, pid_n, live, n_parts, ss_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """v [BLOCK_M, BLOCK_N] fp32 (zero outside the rows), column block pid_n -> sums of squares per SUMSQ_GROUP
    columns at ss[rows, pid_n * BLOCK_N / SUMSQ_GROUP + j] (ss [M, cdiv(width, SUMSQ_GROUP)] fp32)."""
    GROUPS: tl.constexpr = BLOCK_N // SUMSQ_GROUP
    part = tl.sum(tl.reshape(v * v, [BLOCK_M, GROUPS, SUMSQ_GROUP]), 2)  # [BLOCK_M, GROUPS]
    cols = pid_n * GROUPS + tl.arange(0, GROUPS)
    at = ss_ptr + rows.to(tl.int64)[:, None] * n_parts + cols[None, :]
    tl.store(at, part, mask=live[:, None] & (cols < n_parts)[None, :])


@triton.jit
def load_sumsq(ss_ptr, rows, n_parts, PARTS: tl.constexpr):
    """The partial sums of squares of rows `rows` (store_sumsq) as loaded, [R, PARTS] fp32 (PARTS >= n_parts a
    power of two, zeros past n_parts): a load to issue early and reduce late (row_rstd)."""
    parts = tl.arange(0, PARTS)
    at = ss_ptr + rows.to(tl.int64)[:, None] * n_parts + parts[None, :]
    return tl.load(at, mask=(parts < n_parts)[None, :], other=0.0)


@triton.jit
def row_rstd(parts, eps, width):
    """[R] 1 / sqrt(mean(x^2) + eps) of rows of `width` from their loaded partials, summed in a fixed order."""
    return 1.0 / tl.sqrt(tl.sum(parts, 1) / width + eps)


def sumsq_parts(rows: int, width: int, device) -> torch.Tensor:
    """An fp32 buffer [rows, cdiv(width, SUMSQ_GROUP)] for store_sumsq / row_rstd."""
    return torch.empty((rows, triton.cdiv(width, SUMSQ_GROUP.value)), dtype=torch.float32, device=device)


@triton.jit(do_not_specialize=["n_rows"])  # a bound only: one build for every batch size
def _add_rmsnorm_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    out_ptr,
    out_stride,
    cross_ptr,
    rows_per_req,
    n_rows,
    H,
    eps,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CROSS: tl.constexpr,
    ADD: tl.constexpr,
    PDL: tl.constexpr,
):
    grid_dependency_wait(PDL)
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    m = (r < n_rows)[:, None] & (cols < H)[None, :]
    at = r[:, None] * H + cols[None, :]
    dtype = x_ptr.dtype.element_ty
    s = tl.load(x_ptr + at, mask=m, other=0.0)
    if ADD:
        s = (s.to(tl.float32) + tl.load(y_ptr + at, mask=m, other=0.0).to(tl.float32)).to(dtype)
        if not CROSS:  # the last residual sum is read by nothing but this norm
            tl.store(x_ptr + at, s, mask=m)
    sf = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, 1) / H + eps)
    norm_store(sf, rstd, r, cols, m, H, w_ptr, out_ptr, out_stride, cross_ptr, rows_per_req, CROSS)


@triton.jit(do_not_specialize=["n_rows"])
def _row_bias_silu_kernel(
    pre_ptr,
    bias_ptr,
    bias_stride,
    rows_per_group,
    n_rows,
    N,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    grid_dependency_wait(PDL)
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = (r < n_rows)[:, None] & (cols < N)[None, :]
    at = pre_ptr + r[:, None] * N + cols[None, :]
    v = tl.load(at, mask=m, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + (r // rows_per_group)[:, None] * bias_stride + cols[None, :], mask=m, other=0.0)
    v += bias.to(tl.float32)
    tl.store(at, (v / (1.0 + tl.exp(-v))).to(pre_ptr.dtype.element_ty), mask=m)


def add_rmsnorm_triton(
    x: torch.Tensor,  # [rows, H] residual stream, updated in place (without cross)
    y: torch.Tensor,  # [rows, H] branch output
    weight: torch.Tensor,  # [H]
    eps: float,
    cross: torch.Tensor | None = None,  # [b, H] anchor state; rows = b * rows_per_req
    *,
    pdl: bool = False,  # programmatic dependent launch (kernels/pdl.py), as every kernel here
) -> torch.Tensor:
    """-> RMSNorm(x + y) [rows, H], or concat[h, h * t] [rows, 2H] with `cross`."""
    check_pdl(pdl, x, "add_rmsnorm_triton")
    rows, h = x.shape
    if not (x.is_contiguous() and y.is_contiguous() and y.shape == x.shape):
        raise ValueError(f"add_rmsnorm_triton: x {tuple(x.shape)} and y {tuple(y.shape)} must be contiguous and alike")
    width = h if cross is None else 2 * h
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    rows_per_req = 1
    if cross is not None:
        if cross.shape[-1] != h or rows % max(cross.shape[0], 1):
            raise ValueError(f"add_rmsnorm_triton: cross {tuple(cross.shape)} does not tile {rows} rows of width {h}")
        cross = cross.contiguous()
        rows_per_req = rows // max(cross.shape[0], 1)
    return _launch_norm(x, y, weight, out, eps, cross, rows_per_req, add=True, pdl=pdl)


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, *, pdl: bool = False) -> torch.Tensor:
    """x [rows, H] contiguous -> RMSNorm(x) * weight [rows, H] in x's dtype (x unchanged)."""
    check_pdl(pdl, x, "rmsnorm_triton")
    if not x.is_contiguous():
        raise ValueError(f"rmsnorm_triton: x {tuple(x.shape)} must be contiguous")
    return _launch_norm(x, x, weight, torch.empty_like(x), eps, None, 1, add=False, pdl=pdl)


def _launch_norm(x, y, weight, out, eps, cross, rows_per_req, *, add, pdl) -> torch.Tensor:
    """_add_rmsnorm_kernel over x's rows into out (y read with add, cross when given) -> out."""
    rows, h = x.shape
    if rows:
        block_h, per = triton.next_power_of_2(h), rows_per_program(x)
        args = (x, y, weight, out, out.stride(0), x if cross is None else cross, rows_per_req, rows, h, float(eps))
        flags = dict(CROSS=cross is not None, ADD=add, PDL=pdl, launch_pdl=pdl)
        grid = (triton.cdiv(rows, per),)
        _add_rmsnorm_kernel[grid](*args, ROWS=per, BLOCK_H=block_h, **flags, num_warps=4 if block_h <= 2048 else 8)
    return out


def row_bias_silu_triton(
    pre: torch.Tensor, bias: torch.Tensor, rows_per_group: int, *, pdl: bool = False
) -> torch.Tensor:
    """pre [rows, N] contiguous, bias [rows / rows_per_group, N] (unit column stride) -> pre, in place."""
    check_pdl(pdl, pre, "row_bias_silu_triton")
    rows, n = pre.shape
    if not pre.is_contiguous() or bias.stride(-1) != 1 or bias.shape[-1] != n:
        raise ValueError(f"row_bias_silu_triton: pre {tuple(pre.shape)} / bias {tuple(bias.shape)} layout mismatch")
    if rows:
        block_n, per = min(triton.next_power_of_2(n), 1024), rows_per_program(pre)
        args = (pre, bias, bias.stride(0), rows_per_group, rows, n)
        grid = (triton.cdiv(rows, per), triton.cdiv(n, block_n))
        _row_bias_silu_kernel[grid](*args, ROWS=per, BLOCK_N=block_n, PDL=pdl, launch_pdl=pdl, num_warps=4)
    return pre
