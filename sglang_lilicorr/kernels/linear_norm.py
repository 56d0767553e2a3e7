"""The lattice layer's residual add + RMSNorm as the epilogue of the GEMM before it (paper App. A),
and the node assembly (Section 3.2) as the epilogue of the feature MLP's down projection.

  linear_add_rmsnorm_triton(a, weight, bias, x, norm_weight, eps, counters, cross=None)
      y  = a @ weight.T + bias      the attention out projection or the FFN down projection,
                                    rounded to x's dtype as F.linear returns it
      x += y                        in place, rounded (with `cross`, the last residual sum, x is
                                    left as it was: nothing but this norm reads that sum)
      -> RMSNorm(x) * norm_weight [M, N], or concat[h, h * t] [M, 2N] with cross (t [b, N])
  equals add_rmsnorm_triton(x, F.linear(a, weight, bias), norm_weight, eps, cross) in one launch
  instead of two.

  lattice_nodes_linear_triton(up, w_down, ids, table, pass_proj, node_const, norm_weight, eps, counters)
      node = table[id] + pass_proj[slot] + up @ w_down.T + node_const[slot, rank] in place of x + y
      -> (x, RMSNorm(x) * norm_weight): head_nodes.lattice_nodes_triton on F.linear(up, w_down).

The norm needs whole rows; a GEMM tile holds BLOCK_N columns of BLOCK_M rows. Grid (column tiles,
row tiles): the column tiles of a row tile are adjacent in launch order. Each program adds its
tile into the residual stream and writes its rows' partial sums of squares, then counts itself in
on the row tile's counter (a CTA barrier, then one acq_rel atomic at GPU scope: the pattern of a
split-K fix-up). The program that arrives last normalises the row tile: it sums the partials in
column order (deterministic), reads the sums back from L2 and writes the norm, then resets the
counter, so the next launch and every CUDA-graph replay start from zero. With one column tile
(N <= BLOCK_N: the testbed's width 256 in a 256-wide tile) the tile normalises itself: no
partials, no atomics.

`counters` is an int32 buffer of zeros with at least cdiv(M, BLOCK_M) entries that only one stream
uses (`FastLiLiCorrSelect` owns one); every launch leaves it zero.

Launch configs from a static table by (N, M) (tuning.NORM_CONFIG_BY_SHAPE, which also says where the fused kernel
beats cuBLAS + add_rmsnorm_triton: the select's plan reads that); `python -m sglang_lilicorr.kernels.linear_norm`
times both on the serving GPU. Under the CPU interpreter 16-bit operands are dotted as fp32 copies
(gemm_tile). tests/test_linear_norm.py lowers every config to sm_90 under both Tritons.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from . import tuning
from .gemm_epilogue import gemm_tile
from .head_nodes import node_sum_in_order
from .head_norm import add_rmsnorm_triton, norm_store
from .tuning import NORM_CONFIGS


def select_config(n: int, m: int, dtype: torch.dtype) -> str:
    """Name of the launch config (tuning.NORM_CONFIGS) for an [M, N] output of `dtype` (fp32 has its own config)."""
    return "fp32" if dtype == torch.float32 else tuning.norm_band(n, m)[2]


def row_tiles(m: int, n: int, dtype: torch.dtype, config: str | None = None) -> int:
    """Counters a launch at [M, N] needs (its row tiles)."""
    return triton.cdiv(m, NORM_CONFIGS[config or select_config(n, m, dtype)].block_m)


@triton.jit(do_not_specialize=["M"])  # rows (b * L): bounds and wrapping only, one build for every batch size
def _linear_add_rmsnorm_kernel(
    a_ptr, w_ptr, bias_ptr, x_ptr, out_ptr, norm_w_ptr, cross_ptr, part_ptr, count_ptr,
    ids_ptr, table_ptr, pass_ptr, const_ptr,  # NODES only: the node sum replaces the residual stream
    M, N, K, stride_am, stride_wn, out_stride, rows_per_req, n_slots, n_cand, eps,
    HAS_BIAS: tl.constexpr, CROSS: tl.constexpr, NODES: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, EVEN_K: tl.constexpr, IEEE_F32: tl.constexpr,
):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = gemm_tile(a_ptr, w_ptr, rm, rn, M, N, K, stride_am, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE_F32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    dtype = x_ptr.dtype.element_ty
    rows, live = rm.to(tl.int64), rm < M
    m = live[:, None] & (rn < N)[None, :]
    at = rows[:, None] * N + rn[None, :]
    y = acc.to(dtype).to(tl.float32)  # the branch output, rounded as F.linear returns it
    if NODES:  # node = token_table[id] + pass_proj[slot] + feature down + node_const[slot, rank]
        s = node_sum_in_order(y, rows, live, rn, m, ids_ptr, table_ptr, pass_ptr, const_ptr, n_slots, n_cand, N).to(dtype)
    else:
        s = (tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32) + y).to(dtype)
    sf = tl.where(m, s.to(tl.float32), 0.0)  # wrapped rows / columns of the GEMM tile count nothing
    if N_TILES == 1:
        if not CROSS:
            tl.store(x_ptr + at, s, mask=m)
        rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, 1) / N + eps)
        norm_store(sf, rstd, rows, rn, m, N, norm_w_ptr, out_ptr, out_stride, cross_ptr, rows_per_req, CROSS)
    else:
        # the sums wait for the row's norm in x (or, with CROSS, in the output's first half)
        if CROSS:
            tl.store(out_ptr + rows[:, None] * out_stride + rn[None, :], s, mask=m)
        else:
            tl.store(x_ptr + at, s, mask=m)
        tl.store(part_ptr + rows * N_TILES + pid_n, tl.sum(sf * sf, 1), mask=live)
        tl.debug_barrier()  # every thread's stores precede the release below
        arrived = tl.atomic_add(count_ptr + pid_m, 1, sem="acq_rel", scope="gpu")
        if arrived == N_TILES - 1:  # the last column tile of this row tile: normalise the rows
            sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for t in range(N_TILES):
                sumsq += tl.load(part_ptr + rows * N_TILES + t, mask=live, other=0.0, cache_modifier=".cg")
            rstd = 1.0 / tl.sqrt(sumsq / N + eps)
            for t in range(N_TILES):
                cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
                mt = live[:, None] & (cols < N)[None, :]
                if CROSS:
                    src = out_ptr + rows[:, None] * out_stride + cols[None, :]
                else:
                    src = x_ptr + rows[:, None] * N + cols[None, :]
                v = tl.load(src, mask=mt, other=0.0, cache_modifier=".cg").to(tl.float32)
                norm_store(v, rstd, rows, cols, mt, N, norm_w_ptr, out_ptr, out_stride, cross_ptr, rows_per_req, CROSS)
            tl.atomic_xchg(count_ptr + pid_m, 0, sem="relaxed", scope="gpu")


def linear_add_rmsnorm_reference(a, weight, bias, x, norm_weight, eps, cross=None):
    """PyTorch definition: the branch GEMM, then the residual add + RMSNorm of add_rmsnorm_triton
    (x updated in place unless cross) -> [M, N], or concat[h, h * t] [M, 2N] with cross."""
    y = F.linear(a, weight, bias)
    s = x + y
    if cross is None:
        x.copy_(s)
    h = F.rms_norm(s.float(), (s.shape[-1],), norm_weight.float(), eps).to(x.dtype)
    if cross is None:
        return h
    t = cross.repeat_interleave(x.shape[0] // cross.shape[0], dim=0)
    return torch.cat([h, (h.float() * t.float()).to(x.dtype)], dim=-1)


def lattice_nodes_linear_reference(up, w_down, ids, table, pass_proj, node_const, norm_weight, eps):
    """PyTorch definition of lattice_nodes_linear_triton -> (x, RMSNorm(x) * norm_weight)."""
    b, s, k = ids.shape
    h = table.shape[1]
    feat = F.linear(up, w_down).view(b, s, k, h)
    x = (table[ids].float() + pass_proj.float().unsqueeze(2) + feat.float() + node_const[:s].float()).to(table.dtype)
    x = x.reshape(b * s * k, h)
    return x, F.rms_norm(x.float(), (h,), norm_weight.float(), eps).to(x.dtype)


def _check(a, weight, bias, x, norm_weight, cross) -> None:
    name = "linear_add_rmsnorm_triton"
    if a.dim() != 2 or weight.dim() != 2 or a.shape[1] != weight.shape[1]:
        raise ValueError(f"{name}: a {tuple(a.shape)} and weight {tuple(weight.shape)} must be [M, K] and [N, K] (nn.Linear layout)")
    m, n = a.shape[0], weight.shape[0]
    if tuple(x.shape) != (m, n) or not x.is_contiguous():
        raise ValueError(f"{name}: the residual stream x {tuple(x.shape)} must be a contiguous [{m}, {n}]")
    if norm_weight.shape != (n,) or (bias is not None and bias.shape != (n,)):
        raise ValueError(f"{name}: norm weight {tuple(norm_weight.shape)} and bias must be [{n}]")
    if cross is not None and (cross.dim() != 2 or cross.shape[1] != n or not cross.shape[0] or m % cross.shape[0]):
        raise ValueError(f"{name}: cross {tuple(cross.shape)} must be [b, {n}] with b dividing the {m} rows")
    if len({t.dtype for t in (a, weight, x) + (() if bias is None else (bias,))}) != 1:
        raise ValueError(f"{name}: a, weight, bias and x must share one dtype; cast the parameters to x's dtype")
    if a.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"{name}: a strides {a.stride()} and weight strides {weight.stride()} need unit stride along K")
    if not a.is_cuda and not isinstance(_linear_add_rmsnorm_kernel, InterpretedFunction):
        raise ValueError(f"{name}: tensors on {a.device}; Triton runs CUDA tensors, or CPU ones with TRITON_INTERPRET=1 set before triton is imported")


def linear_add_rmsnorm_triton(
    a: torch.Tensor,  # [M, K] branch input (attention output or FFN hidden), unit stride along K
    weight: torch.Tensor,  # [N, K] (nn.Linear)
    bias: torch.Tensor | None,  # [N]
    x: torch.Tensor,  # [M, N] residual stream, contiguous; updated in place unless cross
    norm_weight: torch.Tensor,  # [N]
    eps: float,
    counters: torch.Tensor,  # int32 zeros, >= row_tiles(M, N, dtype, config) entries, left zero
    cross: torch.Tensor | None = None,  # [b, N] anchor state t, M = b * rows per request
    *,
    config: str | None = None,  # a NORM_CONFIGS key; None: select_config(N, M, dtype)
) -> torch.Tensor:
    """-> RMSNorm(x + a @ weight.T + bias) * norm_weight [M, N], or concat[h, h * t] [M, 2N]; one launch."""
    _check(a, weight, bias, x, norm_weight, cross)
    return _launch(a, weight, bias, x, norm_weight, eps, counters, cross, config, None)


def lattice_nodes_linear_triton(
    up: torch.Tensor,  # [b*S*K, H] the confidence MLP's SiLU output (kernels/head_nodes.py)
    w_down: torch.Tensor,  # [H, H] its down projection (bias folded into node_const)
    ids: torch.Tensor,  # [b, S, K] int64 candidate token ids
    table: torch.Tensor,  # [V, H] projected token table
    pass_proj: torch.Tensor,  # [b, S, H] pass_hidden_proj without bias
    node_const: torch.Tensor,  # [S_max, K, H] fp32 slot + rank embeddings + folded biases
    norm_weight: torch.Tensor,  # [H] the first layer's attention RMSNorm
    eps: float,
    counters: torch.Tensor,
    *,
    config: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The node assembly in the feature down GEMM's epilogue: node = table[id] + pass_proj[slot] +
    up @ w_down.T + node_const[slot, rank] -> (residual stream x [b*S*K, H], RMSNorm(x) [b*S*K, H]);
    equals head_nodes.lattice_nodes_triton on F.linear(up, w_down), in one launch instead of two."""
    b, s, k = ids.shape
    rows, h = b * s * k, table.shape[1]
    x = torch.empty((rows, h), dtype=table.dtype, device=table.device)
    _check(up, w_down, None, x, norm_weight, None)
    if tuple(pass_proj.shape) != (b, s, h) or node_const.shape[1:] != (k, h) or node_const.shape[0] < s:
        raise ValueError(
            f"lattice_nodes_linear_triton: pass_proj {tuple(pass_proj.shape)} / node_const {tuple(node_const.shape)} "
            f"do not match ids [{b}, {s}, {k}] and width {h}"
        )
    nodes = (ids.contiguous(), table.contiguous(), pass_proj.contiguous(), node_const.contiguous(), s, k)
    return x, _launch(up, w_down, None, x, norm_weight, eps, counters, None, config, nodes)


def _launch(a, weight, bias, x, norm_weight, eps, counters, cross, config, nodes) -> torch.Tensor:
    """One launch of _linear_add_rmsnorm_kernel -> the normalised rows (x written in place)."""
    if config is not None and config not in NORM_CONFIGS:
        raise ValueError(f"linear_add_rmsnorm_triton: config {config!r} unknown; use one of {sorted(NORM_CONFIGS)}")
    (m, k), n = a.shape, weight.shape[0]
    name = config or select_config(n, m, x.dtype)
    c = NORM_CONFIGS[name]
    n_tiles, m_tiles = triton.cdiv(n, c.block_n), triton.cdiv(m, c.block_m)
    if n_tiles > 1 and (counters.dtype != torch.int32 or counters.numel() < m_tiles or counters.device != x.device):
        raise ValueError(
            f"linear_add_rmsnorm_triton: counters ({counters.dtype}, {counters.numel()} on {counters.device}) must be "
            f"int32 zeros on {x.device} with at least {m_tiles} entries (row tiles of config {name})"
        )
    width = n if cross is None else 2 * n
    out = torch.empty((m, width), dtype=x.dtype, device=x.device)
    if m:
        # partial sums of squares of split rows; whole-row tiles never touch it (the counters stand in)
        part = torch.empty((m, n_tiles), dtype=torch.float32, device=x.device) if n_tiles > 1 else counters
        ids, table, pass_proj, node_const, n_slots, n_cand = nodes or (x, x, x, x, 1, 1)
        _linear_add_rmsnorm_kernel[(n_tiles, m_tiles)](
            a, weight, out if bias is None else bias, x, out, norm_weight,
            x if cross is None else cross.contiguous(), part, counters, ids, table, pass_proj, node_const,
            m, n, k, a.stride(0), weight.stride(0), width, 1 if cross is None else m // cross.shape[0], n_slots, n_cand, float(eps),
            HAS_BIAS=bias is not None, CROSS=cross is not None, NODES=nodes is not None, BLOCK_M=c.block_m,
            BLOCK_N=c.block_n, BLOCK_K=c.block_k, N_TILES=n_tiles, EVEN_K=k % c.block_k == 0,
            IEEE_F32=x.dtype == torch.float32 or not x.is_cuda, num_stages=c.num_stages, num_warps=c.num_warps,
        )
    return out


def bench_linear_norm(shapes=None, m_list=(120, 480, 1920, 3840), *, dtype=torch.bfloat16, rep_ms: int = 100) -> list[dict]:
    """On CUDA: ms per call (graph replay, median) of linear_add_rmsnorm_triton under every 16-bit
    config and of F.linear + add_rmsnorm_triton, for each (K, N) in `shapes` (default: the paper's
    out projection 1024 -> 1024 and FFN down 2048 -> 1024, the testbed's 256 -> 256 and 512 -> 256)
    at each M -> rows {K, N, M, config, fused_ms, unfused_ms, speedup}; '*' marks the selected config."""
    from .graph_timing import graph_ms

    if not torch.cuda.is_available():
        raise RuntimeError("bench_linear_norm: needs a CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(0)
    counters = torch.zeros(4096, dtype=torch.int32, device="cuda")
    rows = []
    for k, n in shapes or ((1024, 1024), (2048, 1024), (256, 256), (512, 256)):
        weight = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) * k**-0.5
        bias, norm_w = torch.randn(n, device="cuda", dtype=dtype, generator=gen), torch.ones(n, device="cuda", dtype=dtype)
        for m in m_list:
            a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
            x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
            unfused = graph_ms(lambda: add_rmsnorm_triton(x, F.linear(a, weight, bias), norm_w, 1e-6), rep_ms)[0]
            chosen = select_config(n, m, dtype)
            for name in (c for c in NORM_CONFIGS if c != "fp32"):
                ms = graph_ms(lambda: linear_add_rmsnorm_triton(a, weight, bias, x, norm_w, 1e-6, counters, config=name), rep_ms)[0]
                rows.append(dict(K=k, N=n, M=m, config=name + ("*" if name == chosen else ""), fused_ms=ms, unfused_ms=unfused, speedup=unfused / ms))
    return rows


def format_bench(rows: list[dict]) -> str:
    """The rows of bench_linear_norm as a text table."""
    lines = [f"{'K':>5} {'N':>5} {'M':>5} {'config':>12} {'fused ms':>9} {'unfused ms':>10} {'speedup':>8}"]
    lines += [
        f"{r['K']:>5} {r['N']:>5} {r['M']:>5} {r['config']:>12} {r['fused_ms']:>9.4f} {r['unfused_ms']:>10.4f} {r['speedup']:>8.2f}"
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(f"{torch.cuda.get_device_name()}, bf16, triton {triton.__version__}, torch {torch.__version__}")
    print(format_bench(bench_linear_norm()))
