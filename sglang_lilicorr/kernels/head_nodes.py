"""Lattice node assembly of the LiLiCorr head at serving time, in Triton, a program per row: `confidence_up_triton`
(top-K values + lse -> log-probs, silu(up(LayerNorm(features)))) and `lattice_nodes_triton` (node = token_table[id] +
pass_proj[slot] + feat_down + node_const[slot, k]: the residual stream and its RMSNorm, or folded its sumsq)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import rows_per_program
from .head_norm import SUMSQ_GROUP, norm_store, store_sumsq
from .pdl import check_pdl, grid_dependency_wait, pdl_launch
from .tuning import ConfidenceLaunch


@triton.jit
def _confidence_up_kernel(
    vals_ptr,
    lse_ptr,
    w_ptr,
    b_ptr,
    lp_ptr,
    out_ptr,  # [G, K] f32, [G] f32, [H, 5] f32, [H] f32, [G, K] f32, [G*K, H]
    K,
    H,
    ln_eps,
    rank_div,  # rank_div = max(K - 1, 1)
    KP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    g = tl.program_id(0)  # one (request, slot) group of K candidates
    hb = tl.program_id(1)
    ks = tl.arange(0, KP)
    kv = ks < K
    cols = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    cv = cols < H
    # the folded LayerNorm + up projection's weights are constants: loaded before the wait, in flight across it
    bias = tl.load(b_ptr + cols, mask=cv, other=0.0)[None, :]
    w0 = tl.load(w_ptr + cols * 5 + 0, mask=cv, other=0.0)[None, :]
    w1 = tl.load(w_ptr + cols * 5 + 1, mask=cv, other=0.0)[None, :]
    w2 = tl.load(w_ptr + cols * 5 + 2, mask=cv, other=0.0)[None, :]
    w3 = tl.load(w_ptr + cols * 5 + 3, mask=cv, other=0.0)[None, :]
    w4 = tl.load(w_ptr + cols * 5 + 4, mask=cv, other=0.0)[None, :]
    grid_dependency_wait(PDL)
    v = tl.load(vals_ptr + g * K + ks, mask=kv, other=0.0)
    lse = tl.load(lse_ptr + g)
    lp = v - lse
    if hb == 0:
        tl.store(lp_ptr + g * K + ks, lp, mask=kv)
    top = tl.max(tl.where(kv, lp, -float("inf")), 0)
    dtype = out_ptr.dtype.element_ty
    # the five features, rounded to the head's dtype as the reference feeds LayerNorm
    f0 = lp.to(dtype).to(tl.float32)
    f1 = tl.exp(lp).to(dtype).to(tl.float32)
    f2 = (lp - top).to(dtype).to(tl.float32)
    f3 = (ks.to(tl.float32) / rank_div).to(dtype).to(tl.float32)
    f4 = (ks == 0).to(tl.float32)
    mean = (f0 + f1 + f2 + f3 + f4) / 5.0
    d0, d1, d2, d3, d4 = f0 - mean, f1 - mean, f2 - mean, f3 - mean, f4 - mean
    rstd = 1.0 / tl.sqrt((d0 * d0 + d1 * d1 + d2 * d2 + d3 * d3 + d4 * d4) / 5.0 + ln_eps)
    acc = bias + tl.zeros((KP, BLOCK_H), tl.float32)
    acc += (d0 * rstd)[:, None] * w0
    acc += (d1 * rstd)[:, None] * w1
    acc += (d2 * rstd)[:, None] * w2
    acc += (d3 * rstd)[:, None] * w3
    acc += (d4 * rstd)[:, None] * w4
    act = acc / (1.0 + tl.exp(-acc))  # SiLU
    rows = g * K + ks
    tl.store(out_ptr + rows[:, None] * H + cols[None, :], act.to(dtype), mask=kv[:, None] & cv[None, :])


@triton.jit
def node_ids(rows, live, ids_ptr):
    """[R] candidate token ids of node rows (request * S + slot) * K + k (live: rows < n_rows)."""
    return tl.load(ids_ptr + rows, mask=live, other=0)


@triton.jit
def node_pass_rows(rows, cols, mask, pass_ptr, n_cand, H):
    """pass_proj[request, slot] [R, C] at node rows, columns cols, as loaded."""
    return tl.load(pass_ptr + (rows // n_cand)[:, None] * H + cols[None, :], mask=mask, other=0.0)


@triton.jit
def node_const_rows(rows, cols, mask, const_ptr, n_slots, n_cand, H):
    """node_const[slot, k] [R, C] at node rows, columns cols, as loaded (a constant: loaded before the PDL wait)."""
    const_row = ((rows // n_cand) % n_slots) * n_cand + rows % n_cand
    return tl.load(const_ptr + const_row[:, None] * H + cols[None, :], mask=mask, other=0.0)


@triton.jit
def table_rows(tok, cols, mask, table_ptr, H):
    """token_table[tok] [R, C] at columns cols, in fp32 (the node's gather)."""
    return tl.load(table_ptr + tok[:, None] * H + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def node_sum(feat, tok, proj, const, cols, mask, table_ptr, H):
    """node [R, C] fp32 = token_table[id] + pass_proj[slot] + feat + node_const[slot, k] (the caller rounds once)."""
    x = table_rows(tok, cols, mask, table_ptr, H)
    x += proj.to(tl.float32)
    x += feat
    return x + const.to(tl.float32)


@triton.jit(do_not_specialize=["n_rows"])  # a bound only: one build for every batch size
def _lattice_nodes_kernel(
    ids_ptr,
    table_ptr,
    pass_ptr,
    feat_ptr,
    const_ptr,
    norm_w_ptr,
    x_ptr,
    xn_ptr,
    ss_ptr,
    n_rows,
    S,
    K,
    H,
    x_stride,
    eps,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SUMSQ: tl.constexpr,
    PDL: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rv = r < n_rows
    cols = tl.arange(0, BLOCK_H)
    m = rv[:, None] & (cols < H)[None, :]
    const = node_const_rows(r, cols, m, const_ptr, S, K, H)  # a constant (fp32, cold): loaded before the wait
    grid_dependency_wait(PDL)
    feat = tl.load(feat_ptr + r[:, None] * H + cols[None, :], mask=m, other=0.0).to(tl.float32)
    tok, proj = node_ids(r, rv, ids_ptr), node_pass_rows(r, cols, m, pass_ptr, K, H)
    x = node_sum(feat, tok, proj, const, cols, m, table_ptr, H).to(x_ptr.dtype.element_ty)
    tl.store(x_ptr + r[:, None] * x_stride + cols[None, :], x, mask=m)
    xf = tl.where(m, x.to(tl.float32), 0.0)
    if SUMSQ:  # the first norm is left to the QKV GEMM (folded norms)
        store_sumsq(xf, r, 0, rv, tl.cdiv(H, SUMSQ_GROUP), ss_ptr, ROWS, BLOCK_H)
    else:
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 1) / H + eps)
        norm_store(xf, rstd, r, cols, m, H, norm_w_ptr, xn_ptr, H, xn_ptr, 1, False)


def confidence_up_triton(
    vals: torch.Tensor,
    lse: torch.Tensor,
    w_feat: torch.Tensor,
    b_feat: torch.Tensor,
    ln_eps: float,
    dtype: torch.dtype,
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vals fp32 [G, K] descending, lse fp32 [G], w_feat fp32 [H, 5], b_feat fp32 [H] -> (log-probs fp32 [G, K],
    silu(w_feat @ LayerNorm(features) + b_feat) [G*K, H]); under `pdl` the constants are read before the wait."""
    check_pdl(pdl, w_feat, "confidence_up_triton")
    (g, k), h = vals.shape, w_feat.shape[0]
    lp = torch.empty((g, k), dtype=torch.float32, device=vals.device)
    out = torch.empty((g * k, h), dtype=dtype, device=vals.device)
    launch = ConfidenceLaunch()
    block_h = min(triton.next_power_of_2(h), launch.block_h)
    if g:
        inputs = [t.contiguous() for t in (vals, lse, w_feat, b_feat)]
        args = (*inputs, lp, out, k, h, float(ln_eps), float(max(k - 1, 1)))
        meta = dict(KP=triton.next_power_of_2(k), BLOCK_H=block_h, PDL=pdl, launch_pdl=pdl, num_warps=launch.num_warps)
        _confidence_up_kernel[(g, triton.cdiv(h, block_h))](*args, **meta)
    return lp, out


def lattice_nodes_triton(
    ids: torch.Tensor,  # [b, S, K] int64 candidate token ids
    table: torch.Tensor,  # [V, H] projected token table
    pass_proj: torch.Tensor,  # [b, S, H] pass_hidden_proj without bias
    feat: torch.Tensor,  # [b*S*K, H] feature MLP output without down bias
    node_const: torch.Tensor,  # [S_max, K, H] fp32 embeddings + folded biases
    norm_weight: torch.Tensor,  # [H] first layer's attention RMSNorm weight
    eps: float,
    *,
    out: torch.Tensor | None = None,  # [b*S*K, H] where to write x (unit column stride); None: a new tensor
    sumsq_out: torch.Tensor | None = None,  # fp32 [b*S*K, cdiv(H, 16)]: x's partial sums of squares instead of the norm
    pdl: bool = False,
    launch_pdl: bool | None = None,  # False: launched in full order (after a stream join); None: pdl
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (residual stream x, RMSNorm(x)) [b*S*K, H] in table's dtype; with sumsq_out: (x, sumsq_out)."""
    check_pdl(pdl, table, "lattice_nodes_triton")
    (b, s, k), h = ids.shape, table.shape[1]
    rows = b * s * k
    x = torch.empty((rows, h), dtype=table.dtype, device=table.device) if out is None else out
    if tuple(x.shape) != (rows, h) or x.stride(1) != 1 or x.dtype != table.dtype:
        raise ValueError(
            f"lattice_nodes_triton: out {tuple(x.shape)} {x.dtype} must be [{rows}, {h}] {table.dtype}, "
            "unit column stride"
        )
    parts = triton.cdiv(h, SUMSQ_GROUP.value)
    if sumsq_out is not None and (
        tuple(sumsq_out.shape) != (rows, parts) or sumsq_out.dtype != torch.float32 or not sumsq_out.is_contiguous()
    ):
        raise ValueError(
            f"lattice_nodes_triton: sumsq_out {tuple(sumsq_out.shape)} {sumsq_out.dtype} "
            f"must be a contiguous fp32 [{rows}, {parts}]"
        )
    xn = torch.empty((rows, h), dtype=table.dtype, device=table.device) if sumsq_out is None else sumsq_out
    if rows:
        block_h, per = max(triton.next_power_of_2(h), SUMSQ_GROUP.value), rows_per_program(x)
        inputs = [t.contiguous() for t in (ids, table, pass_proj, feat, node_const)]
        args = (*inputs, norm_weight, x, xn, xn, rows, s, k, h, x.stride(0), float(eps))
        meta = dict(ROWS=per, BLOCK_H=block_h, SUMSQ=sumsq_out is not None, **pdl_launch(pdl, launch_pdl))
        _lattice_nodes_kernel[(triton.cdiv(rows, per),)](*args, **meta, num_warps=4 if block_h <= 2048 else 8)
    return x, xn
