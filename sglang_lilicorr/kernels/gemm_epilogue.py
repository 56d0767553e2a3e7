"""A GEMM with its epilogue in one Triton kernel (kernels/README.md): y = act(rstd * (x @ weight.T) + bias +
group_bias[row // rows_per_group]), plus `residual` (out += y), `sumsq_out` (partial sums of squares for the next norm),
`norm` (the folded pre-norm) and `cross` (also out * t). x [M, K], weight [N, K] -> out [M, N] in x's dtype, fp32
accumulation. Pointer-load and persistent TMA kernels share the epilogue; configs by rows (tuning.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from . import tuning
from .device import sm_count, sm_major
from .head_norm import SUMSQ_GROUP, load_sumsq, row_rstd, store_sumsq
from .pdl import check_pdl, grid_dependency_wait, pdl_launch
from .prefetch import lines_per_row, prefetch_rows_l2
from .tuning import GEMM_CONFIGS, GemmLaunch

WITHOUT_TMA = {"tma_large": "large", "tma_medium": "medium", "tma_wide_k": "medium"}  # for epilogues TMA stores lack


def select_config(m: int, dtype: torch.dtype, k: int = 0) -> str:
    """Name of the launch config for M rows of `dtype` by K (fp32 has its own small-tile config)."""
    if dtype == torch.float32:
        return "fp32"
    name = tuning.gemm_band(m)[1]
    return tuning.GEMM_WIDE_K_CONFIG.get(name, name) if k >= tuning.GEMM_WIDE_K else name


@triton.jit
def _tile_coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order (GROUP_M row tiles take the column tiles in turn; weights stay in L2) -> (row, col) tile."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows_in_group, (tile % per_group) // rows_in_group


@triton.jit
def _bias_tile(b_ptr, rn, N, HAS_BIAS: tl.constexpr):
    """bias[rn] as fp32 [1, BLOCK_N] (HAS_BIAS; else a placeholder): a constant, loaded before the PDL wait."""
    return tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :] if HAS_BIAS else 0.0


@triton.jit
def _group_bias_tile(gb_ptr, rm, rn, M, N, gb_stride, rows_per_group, GROUP_BIAS: tl.constexpr):
    """group_bias[rm // rows_per_group, rn] as loaded [BLOCK_M, BLOCK_N] (GROUP_BIAS; else a placeholder)."""
    at = gb_ptr + ((rm % M) // rows_per_group).to(tl.int64)[:, None] * gb_stride + rn[None, :]
    return tl.load(at, mask=(rn < N)[None, :], other=0.0) if GROUP_BIAS else 0.0


@triton.jit
def _epilogue(acc, bias, group_bias, HAS_BIAS: tl.constexpr, GROUP_BIAS: tl.constexpr, SILU: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] fp32 (+ bias) (+ group_bias) -> SiLU of that (SILU) or that, fp32."""
    if HAS_BIAS:
        acc += bias
    if GROUP_BIAS:
        acc += group_bias.to(tl.float32)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    return acc


@triton.jit
def gemm_tile(
    x_ptr,
    w_ptr,
    rm,
    rn,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE_F32: tl.constexpr,
):
    """x[rm] @ weight[rn].T -> acc [BLOCK_M, BLOCK_N] fp32, by pointer loads. Rows and columns past
    M, N are wrapped (index mod M, N) so the K loop loads without masks; the caller masks its store."""
    rk = tl.arange(0, BLOCK_K)
    am, bn = (rm % M).to(tl.int64), (rn % N).to(tl.int64)
    a_ptrs = x_ptr + am[:, None] * stride_xm + rk[None, :]  # [BLOCK_M, BLOCK_K]
    b_ptrs = w_ptr + bn[None, :] * stride_wn + rk[:, None]  # [BLOCK_K, BLOCK_N] = weight tile transposed
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < left, other=0.0)
        if IEEE_F32:  # fp32 inputs, or 16-bit ones under the interpreter: exact fp32 FMAs
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc


EARLY_OPERANDS_MAX_TILE = tl.constexpr(tuning.EARLY_OPERANDS_MAX_TILE)


@triton.jit
def _group_bias_and_parts(
    gb_ptr,
    ss_in_ptr,
    rm,
    rn,
    M,
    N,
    gb_stride,
    rows_per_group,
    n_parts_in,
    GROUP_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    PARTS_IN: tl.constexpr,
):
    """The epilogue operands earlier kernels wrote, as loaded: the group bias tile, the input's sumsq partials."""
    group_bias = _group_bias_tile(gb_ptr, rm, rn, M, N, gb_stride, rows_per_group, GROUP_BIAS)
    parts = load_sumsq(ss_in_ptr, rm % M, n_parts_in, PARTS_IN) if NORM else 0.0
    return group_bias, parts


@triton.jit
def _cross_tile(t_ptr, rm, rn, mask, N, rows_per_req):
    """t[rm // rows_per_req, rn] as loaded (the request's anchor state, for the cross output x * t)."""
    return tl.load(t_ptr + (rm // rows_per_req).to(tl.int64)[:, None] * N + rn[None, :], mask=mask, other=0.0)


@triton.jit(do_not_specialize=["M"])  # rows (b * L): bounds and wrapping only, so one build for every batch size
def _gemm_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    gb_ptr,
    out_ptr,
    ss_in_ptr,
    ss_out_ptr,
    t_ptr,
    xt_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    gb_stride,
    rows_per_group,
    rows_per_req,
    n_parts_in,
    norm_width,
    eps,
    HAS_BIAS: tl.constexpr,
    GROUP_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    NORM: tl.constexpr,
    PARTS_IN: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SUMSQ_OUT: tl.constexpr,
    CROSS_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE_F32: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    live = rm < M
    mask = live[:, None] & (rn < N)[None, :]
    at = rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    dtype = out_ptr.dtype.element_ty
    if PREFETCH_LINES:  # launched early under PDL: the first row tile's programs pull the weight slice into L2
        if pid_m == 0:
            prefetch_rows_l2(w_ptr, rn % N, K, stride_wn, PREFETCH_LINES)
    # epilogue operands loaded early (constants before the PDL wait, earlier kernels' outputs before the K loop) so
    # their latency hides; small tiles only (tuning.EARLY_OPERANDS_MAX_TILE), a larger tile's would spill
    EARLY: tl.constexpr = BLOCK_M * BLOCK_N <= EARLY_OPERANDS_MAX_TILE
    bias = _bias_tile(b_ptr, rn, N, HAS_BIAS)
    grid_dependency_wait(PDL)
    if EARLY:
        group_bias, parts = _group_bias_and_parts(
            gb_ptr, ss_in_ptr, rm, rn, M, N, gb_stride, rows_per_group, n_parts_in, GROUP_BIAS, NORM, PARTS_IN
        )
        old = tl.load(out_ptr + at, mask=mask, other=0.0) if RESIDUAL else 0.0
        t = _cross_tile(t_ptr, rm, rn, mask, N, rows_per_req) if CROSS_OUT else 0.0
    acc = gemm_tile(x_ptr, w_ptr, rm, rn, M, N, K, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE_F32)
    if not EARLY:  # after the loop; the residual and t each where it is used (fewer live registers)
        group_bias, parts = _group_bias_and_parts(
            gb_ptr, ss_in_ptr, rm, rn, M, N, gb_stride, rows_per_group, n_parts_in, GROUP_BIAS, NORM, PARTS_IN
        )
    if NORM:  # RMSNorm(x) @ W.T = rstd * (x @ (W * g).T): the gain g folded into the weight
        acc = acc * row_rstd(parts, eps, norm_width)[:, None]
    y = _epilogue(acc, bias, group_bias, HAS_BIAS, GROUP_BIAS, SILU)
    if RESIDUAL:  # out += y, y rounded as F.linear returns it, the sum rounded as the residual add
        if not EARLY:
            old = tl.load(out_ptr + at, mask=mask, other=0.0)
        y = old.to(tl.float32) + y.to(dtype).to(tl.float32)
    y = y.to(dtype)
    tl.store(out_ptr + at, y, mask=mask)
    yf = y.to(tl.float32)
    if SUMSQ_OUT:  # for the next GEMM's norm of these rows
        store_sumsq(tl.where(mask, yf, 0.0), rm, pid_n, live, tl.cdiv(N, SUMSQ_GROUP), ss_out_ptr, BLOCK_M, BLOCK_N)
    if CROSS_OUT:  # x * t, the numerator of the factor input's h * t (the norm's rstd and gain come later)
        if not EARLY:
            t = _cross_tile(t_ptr, rm, rn, mask, N, rows_per_req)
        tl.store(xt_ptr + at, (yf * t.to(tl.float32)).to(dtype), mask=mask)


@triton.jit(do_not_specialize=["M"])  # as _gemm_kernel's; the program count is the grid's, not a constexpr
def _gemm_tma_kernel(
    x_desc,
    w_desc,
    out_desc,
    b_ptr,
    gb_ptr,
    M,
    N,
    K,
    gb_stride,
    rows_per_group,
    HAS_BIAS: tl.constexpr,
    GROUP_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PDL: tl.constexpr,
):
    """Persistent: the grid's programs stride over the output tiles; x / weight tiles arrive by TMA
    (rows and K past the tensor read as zeros), the output tile leaves by TMA (clipped at M, N)."""
    grid_dependency_wait(PDL)
    n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), flatten=True):
        pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m, off_n = pid_m * BLOCK_M, pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = x_desc.load([off_m, k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
            b = w_desc.load([off_n, k * BLOCK_K])  # [BLOCK_N, BLOCK_K]
            acc = tl.dot(a, b.T, acc)
        rm, rn = off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N)
        group_bias = _group_bias_tile(gb_ptr, rm, rn, M, N, gb_stride, rows_per_group, GROUP_BIAS)
        y = _epilogue(acc, _bias_tile(b_ptr, rn, N, HAS_BIAS), group_bias, HAS_BIAS, GROUP_BIAS, SILU)
        out_desc.store([off_m, off_n], y.to(out_desc.dtype))


def gemm_epilogue_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    silu: bool = False,
    group_bias: torch.Tensor | None = None,
    rows_per_group: int = 1,
    norm_eps: float | None = None,
    norm_width: int | None = None,
    residual: torch.Tensor | None = None,
    cross: torch.Tensor | None = None,
) -> torch.Tensor:
    """PyTorch definition of gemm_epilogue_triton in fp32, rounded after the activation; rstd = 1 / sqrt(mean(
    x[:, :norm_width]^2) + norm_eps) with norm_eps, else 1; residual += y in place; cross (t [b, N]) -> (y, y * t)."""
    xf = x.float()
    y = xf @ weight.float().T
    if norm_eps is not None:
        y = y * torch.rsqrt(xf[:, : norm_width or x.shape[1]].pow(2).mean(-1, keepdim=True) + norm_eps)
    if bias is not None:
        y = y + bias.float()
    if group_bias is not None:
        y = (y.view(-1, rows_per_group, y.shape[-1]) + group_bias.float().unsqueeze(1)).view(y.shape)
    y = (F.silu(y) if silu else y).to(x.dtype)
    if residual is not None:
        y = residual.copy_((residual.float() + y.float()).to(residual.dtype))
    if cross is None:
        return y
    return y, (y.float() * cross.float().repeat_interleave(y.shape[0] // cross.shape[0], dim=0)).to(y.dtype)


def _check(
    name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group_bias, rows_per_group
) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"{name}: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be [M, K] and [N, K] "
            f"(nn.Linear layout) with the same K; reshape x to 2-D rows first"
        )
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{name}: x dtype {x.dtype} unsupported; use bf16, fp16 or fp32")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        got = f"weight {weight.dtype}" + ("" if bias is None else f", bias {bias.dtype}")
        raise ValueError(f"{name}: x is {x.dtype} but {got}; cast the parameters to x's dtype")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"{name}: bias {tuple(bias.shape)} must be [N] = [{weight.shape[0]}] (weight's rows)")
    if x.stride(1) != 1 or weight.stride(1) != 1 or (bias is not None and bias.stride(0) != 1):
        raise ValueError(
            f"{name}: x strides {x.stride()}, weight strides {weight.stride()} need unit stride along K "
            f"(and a contiguous bias); pass .contiguous() copies"
        )
    if group_bias is not None:
        groups = x.shape[0] // rows_per_group if rows_per_group >= 1 else -1
        if (
            rows_per_group < 1
            or groups * rows_per_group != x.shape[0]
            or group_bias.dim() != 2
            or tuple(group_bias.shape) != (groups, weight.shape[0])
            or group_bias.stride(1) != 1
        ):
            raise ValueError(
                f"{name}: group_bias {tuple(group_bias.shape)} (strides {group_bias.stride()}) with rows_per_group = "
                f"{rows_per_group} must be [M / rows_per_group, N] = [{groups}, {weight.shape[0]}], unit column stride"
            )
        if group_bias.dtype != x.dtype or group_bias.device != x.device:
            raise ValueError(f"{name}: group_bias is {group_bias.dtype} on {group_bias.device}; cast / move it to x's")
    if weight.device != x.device or (bias is not None and bias.device != x.device):
        raise ValueError(f"{name}: weight / bias are not on x's device {x.device}; move them there")
    if not x.is_cuda and not isinstance(_gemm_kernel, InterpretedFunction):
        raise ValueError(
            f"{name}: x is on {x.device}; Triton runs CUDA tensors, or CPU ones only with TRITON_INTERPRET=1 "
            f"set before triton is imported; use gemm_epilogue_reference on CPU"
        )


def _check_tensor(name: str, what: str, t: torch.Tensor, shape: tuple, dtype: torch.dtype, device) -> None:
    if tuple(t.shape) != shape or t.stride(-1) != 1 or t.dtype != dtype or t.device != device:
        raise ValueError(
            f"{name}: {what} is {tuple(t.shape)} {t.dtype} on {t.device} (strides {t.stride()}); it must be "
            f"{list(shape)} {dtype} on {device} with unit column stride"
        )


def _check_epilogue(name: str, x, weight, norm, norm_width, residual, out, sumsq_out, cross) -> None:
    """The norm / residual / extra outputs of gemm_epilogue_triton against x [M, K] and weight [N, K]."""
    (m, k), n = x.shape, weight.shape[0]
    if residual is not None and out is not None:
        raise ValueError(f"{name}: residual is the output; pass it without out")
    if norm is not None:
        width = norm_width or k
        if not 0 < width <= k:
            raise ValueError(f"{name}: norm_width {norm_width} must be in 1..{k} (x's columns)")
        parts = (m, -(-width // SUMSQ_GROUP.value))
        _check_tensor(name, "norm's sum-of-squares partials", norm[0], parts, torch.float32, x.device)
    for what, t in (("residual", residual), ("out", out)):
        if t is not None:
            _check_tensor(name, what, t, (m, n), x.dtype, x.device)
    if sumsq_out is not None:
        _check_tensor(name, "sumsq_out", sumsq_out, (m, -(-n // SUMSQ_GROUP.value)), torch.float32, x.device)
    if cross is not None:
        t, xt = cross
        if t.dim() != 2 or t.shape[1] != n or not t.shape[0] or m % t.shape[0]:
            raise ValueError(f"{name}: cross t {tuple(t.shape)} must be [b, {n}], b dividing the {m} rows")
        _check_tensor(name, "cross t", t.contiguous(), tuple(t.shape), x.dtype, x.device)
        _check_tensor(name, "cross output", xt, (m, n), x.dtype, x.device)
        row_stride = out.stride(0) if out is not None else residual.stride(0) if residual is not None else n
        if xt.stride(0) != row_stride:
            raise ValueError(
                f"{name}: the cross output must share the output's row stride (e.g. two halves of one buffer)"
            )


def gemm_epilogue_triton(
    x: torch.Tensor,  # [M, K], unit stride along K
    weight: torch.Tensor,  # [N, K] (nn.Linear), unit stride along K
    bias: torch.Tensor | None = None,  # [N]
    *,
    silu: bool = False,
    group_bias: torch.Tensor | None = None,  # [M / rows_per_group, N]
    rows_per_group: int = 1,
    norm: tuple[torch.Tensor, float] | None = None,  # (sum-of-squares partials of x's rows [M, cdiv(w, 16)], eps)
    norm_width: int | None = None,  # w: x's first columns that the norm covers (default all K)
    residual: torch.Tensor | None = None,  # [M, N]: add the result into it (in place) and return it
    out: torch.Tensor | None = None,  # [M, N] where to write the result (unit column stride); None: a new tensor
    sumsq_out: torch.Tensor | None = None,  # [M, cdiv(N, 16)] fp32: the result rows' partial sums of squares
    cross: tuple[torch.Tensor, torch.Tensor] | None = None,  # (t [b, N], xt [M, N]): also xt = result * t per request
    config: str | GemmLaunch | None = None,  # a GEMM_CONFIGS key or a GemmLaunch; None: select_config(M, dtype, K)
    pdl: bool = False,  # programmatic dependent launch (kernels/pdl.py; sm_90+); `bias` is read before the wait
    launch_pdl: bool | None = None,  # False: a PDL kernel launched in full order (after a stream join); None: pdl
    prefetch: bool | None = None,  # weight into L2 before the PDL wait (kernels/prefetch.py); None: when launched early
    name: str = "gemm_epilogue_triton",
) -> torch.Tensor:
    """-> act(x @ weight.T + bias + group_bias[row // rows_per_group]) [M, N], one launch (module docstring)."""
    _check(name, x, weight, bias, group_bias, rows_per_group)
    _check_epilogue(name, x, weight, norm, norm_width, residual, out, sumsq_out, cross)
    check_pdl(pdl, x, name)
    launch = pdl_launch(pdl, launch_pdl)
    early = launch["launch_pdl"]
    if prefetch and not early:
        raise ValueError(
            f"{name}: prefetch=True fetches the weight while the previous kernel runs, which needs a launch with PDL "
            f"(pdl=True, launch_pdl not False); got pdl={pdl}, launch_pdl={launch_pdl}"
        )
    if isinstance(config, str) and config not in GEMM_CONFIGS:
        raise ValueError(f"{name}: config {config!r} unknown; use one of {sorted(GEMM_CONFIGS)}")
    (m, k), n = x.shape, weight.shape[0]
    if residual is not None:
        out = residual
    elif out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    plain = all(e is None for e in (norm, residual, sumsq_out, cross)) and out.is_contiguous()
    if m and n:
        if isinstance(config, GemmLaunch):
            c = config
        else:  # the selected config, or its non-TMA twin where an epilogue needs pointer stores
            chosen = config or select_config(m, x.dtype, k)
            c = GEMM_CONFIGS[chosen if plain or config else WITHOUT_TMA.get(chosen, chosen)]
        common = dict(
            b_ptr=out if bias is None else bias,
            gb_ptr=out if group_bias is None else group_bias,
            gb_stride=0 if group_bias is None else group_bias.stride(0),
            rows_per_group=rows_per_group,
            HAS_BIAS=bias is not None,
            GROUP_BIAS=group_bias is not None,
            SILU=silu,
            **c.tiles(),
            **launch,
            num_stages=c.num_stages,
            num_warps=c.num_warps,
        )
        if c.tma and not plain:
            raise ValueError(
                f"{name}: config {c} (TMA) has no norm / residual / extra-output epilogue; pass a non-TMA config"
            )
        if c.tma and prefetch:
            raise ValueError(f"{name}: config {c} (TMA) has no weight prefetch; pass a non-TMA config or prefetch=None")
        if c.tma:
            _launch_tma(name, x, weight, out, common)
        else:
            t, xt = (cross[0].contiguous(), cross[1]) if cross is not None else (out, out)
            n_parts_in = norm[0].shape[1] if norm is not None else 1
            _gemm_kernel[(triton.cdiv(m, c.block_m) * triton.cdiv(n, c.block_n),)](
                x_ptr=x,
                w_ptr=weight,
                out_ptr=out,
                ss_in_ptr=out if norm is None else norm[0],
                ss_out_ptr=out if sumsq_out is None else sumsq_out,
                t_ptr=t,
                xt_ptr=xt,
                M=m,
                N=n,
                K=k,
                stride_xm=x.stride(0),
                stride_wn=weight.stride(0),
                stride_om=out.stride(0),
                rows_per_req=1 if cross is None else m // t.shape[0],
                n_parts_in=n_parts_in,
                norm_width=norm_width or k,
                eps=0.0 if norm is None else float(norm[1]),
                NORM=norm is not None,
                PARTS_IN=triton.next_power_of_2(n_parts_in),
                RESIDUAL=residual is not None,
                SUMSQ_OUT=sumsq_out is not None,
                CROSS_OUT=cross is not None,
                EVEN_K=k % c.block_k == 0,
                IEEE_F32=x.dtype == torch.float32 or not x.is_cuda,
                PREFETCH_LINES=lines_per_row(c.block_n, c.num_warps) if early and prefetch is not False else 0,
                **common,
            )
    return out


def fold_norm_gain(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] with an RMSNorm's gain folded in along K: RMSNorm(x) @ W.T = rstd(x) * (x @ (W * g).T)."""
    g = norm_weight.float().repeat(weight.shape[1] // norm_weight.shape[0])
    return (weight.float() * g).to(weight.dtype).contiguous()


def linear_silu_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: str | GemmLaunch | None = None,
    pdl: bool = False,
    prefetch: bool | None = None,
) -> torch.Tensor:
    """-> silu(x @ weight.T + bias) [M, N] in x's dtype (the FFN up projection), one launch."""
    return gemm_epilogue_triton(
        x, weight, bias, silu=True, config=config, pdl=pdl, prefetch=prefetch, name="linear_silu_triton"
    )


def _launch_tma(name: str, x, weight, out, common: dict) -> None:
    """The persistent TMA kernel with `common` (epilogue, tiles, launch options): one program per SM."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if x.dtype == torch.float32 or sm_major(x.device) < 9:  # 0 off CUDA
        raise ValueError(
            f"{name}: TMA configs need 16-bit CUDA tensors on sm_90+, got {x.dtype} on {x.device}; use a non-TMA config"
        )
    if any(t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16 for t in (x, weight)):
        raise ValueError(
            f"{name}: TMA needs 16-byte aligned x / weight rows; pass .contiguous() copies or a non-TMA config"
        )
    (m, k), n = x.shape, weight.shape[0]
    bm, bn, bk = common["BLOCK_M"], common["BLOCK_N"], common["BLOCK_K"]
    programs = min(sm_count(x.device), triton.cdiv(m, bm) * triton.cdiv(n, bn))
    _gemm_tma_kernel[(programs,)](
        x_desc=TensorDescriptor.from_tensor(x, [bm, bk]),
        w_desc=TensorDescriptor.from_tensor(weight, [bn, bk]),
        out_desc=TensorDescriptor.from_tensor(out, [bm, bn]),
        M=m,
        N=n,
        K=k,
        **common,
    )
