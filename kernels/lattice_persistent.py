"""The lattice transformer's layers (paper App. A) as ONE persistent Triton kernel, for small batches.

At b = 1 the fused path runs each lattice layer as 7 dependent launches (QKV GEMM, attention, out
GEMM, add+RMSNorm, FFN up + SiLU, FFN down, add+RMSNorm) of ~5 us each, while the layer's 16 MB of
weights take ~3.5 us to stream on an H200. Here one launch runs every phase of every layer: grid =
one program per SM, each phase's work items (GEMM tiles, (request, head, query block) attention
blocks, rows) strided over the programs, and a grid-wide barrier between phases (an atomic arrival
counter; the programs spin until all have arrived). Data written in the launch is read back with
.cg loads (L2, not the SM's possibly stale L1). At its start the launch sends every layer's GEMM
weights towards L2 (prefetch.global.L2, one per 128-byte line; 33.5 MB at the paper config, inside
the 50 MB L2 of an H100 / H200), so the phases after the first read weights from L2, not HBM.

Per layer l (weights stacked over layers), rows M = b * L:
  0 QKV   qkv = xn @ W_qkv[l]^T + b_qkv[l]                         [M, 3H]
  1 ATTN  attn = softmax(q k^T / sqrt(dh) + bias) v per request     [M, H]
  2 OUT   y = attn @ W_o[l]^T + b_o[l]                              [M, H]
  3 NORM  x += y; xn = RMSNorm(x) * w_mlp_norm[l]
  4 UP    up = silu(xn @ W_up[l]^T + b_up[l])                        [M, F]
  5 DOWN  y = up @ W_down[l]^T + b_down[l]                           [M, H]
  6 NORM  x += y; xn = RMSNorm(x) * w_next_norm[l] (last layer: the sum is only normalised and
          out = concat[h, h * t[request]], the factor input)
The phase bodies are the standalone kernels' own helpers (ffn_silu._gemm_acc, lattice_attention.
_attention_block, head_norm._add_rmsnorm_rows), so the two paths compute the same thing.

PHASE = -1 runs all phases with barriers (needs every program resident at once: grid <= SMs, one
program per SM); PHASE = p >= 0 runs phase p alone with no barrier, one launch per phase: the mode of
Triton's CPU interpreter (which runs programs one after another, so a barrier would never open) and
the reference the persistent mode is tested against on a GPU. The arrival counter (int32, zero between
launches: the last program to finish zeroes it) belongs to one caller stream; its third entry counts
barrier waits that gave up (see _grid_sync), which a correct launch leaves at zero.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .device import sm_count
from .ffn_silu import _bias_silu, _gemm_acc, _store_tile
from .head_norm import _add_rmsnorm_rows
from .lattice_attention import _attention_block

PHASES_PER_LAYER = 7
BLOCK_M, BLOCK_N, BLOCK_K = 64, 32, 128  # GEMM tiles (the skinny config of ffn_silu)
ATT_BLOCK_M = 32  # query nodes per attention block
NUM_WARPS = 8  # sm_90 build at the paper shape: 243 registers, no spills (4 warps spill), 152 KiB shared
MAX_ROWS = 512  # b * L rows this kernel is meant for (b <= 4 at L = 120); larger batches are GEMM-bound
MAX_SPINS = tl.constexpr(1 << 22)  # polls of a grid barrier before it gives up (~seconds)


@triton.jit
def _grid_sync(counter_ptr, target):
    """Every program of the grid waits here until `target` arrivals are counted (release / acquire).
    A wait that outlasts MAX_SPINS polls (seconds: a program that never got an SM) gives up and
    counts itself in counter[2], so a broken launch finishes with wrong values, never hangs."""
    tl.debug_barrier()  # this program's stores are done (all threads) before its arrival is counted
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    spins = 0
    while (tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu") < target) & (spins < MAX_SPINS):
        spins += 1
    if spins >= MAX_SPINS:
        tl.atomic_add(counter_ptr + 2, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _prefetch_weight(w_ptr, N, K, BLOCK_N: tl.constexpr, LINES: tl.constexpr):
    """L2 prefetch of a [N, K] 16-bit weight, one instruction per 128-byte line, its BLOCK_N-row
    tiles strided over the programs (LINES >= K / 64, a power of two)."""
    r = tl.arange(0, BLOCK_N)
    c = tl.minimum(tl.arange(0, LINES) * 64, K - 1)
    for tile in range(tl.program_id(0), tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
        rows = tl.minimum(tile * BLOCK_N + r, N - 1).to(tl.int64)
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [w_ptr + rows[:, None] * K + c[None, :]],
            dtype=tl.int32, is_pure=False, pack=1,
        )


@triton.jit
def _globaltimer(like):
    """The GPU's nanosecond clock (%globaltimer), int64 shaped like the scalar tensor `like`."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [like], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _phase_done(counter_ptr, trace_ptr, phases_done, ALL: tl.constexpr, TRACE: tl.constexpr):
    """After a phase: in the persistent launch, wait until every program has finished it. TRACE:
    trace[2 p] = when the last program finished phase p's work, trace[2 p + 1] = when program 0
    saw barrier p open (ns; phases counted from 1, trace[1] = program 0's start)."""
    if ALL:
        if TRACE:
            tl.atomic_max(trace_ptr + 2 * phases_done, _globaltimer(tl.program_id(0)), sem="relaxed", scope="gpu")
        _grid_sync(counter_ptr, phases_done * tl.num_programs(0))
        if TRACE and tl.program_id(0) == 0:
            tl.store(trace_ptr + 2 * phases_done + 1, _globaltimer(tl.program_id(0)))


@triton.jit
def _linear_phase(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
    SILU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE_F32: tl.constexpr, CACHE: tl.constexpr,
):
    """out [M, N] = x [M, K] @ w [N, K]^T + b (-> SiLU), tiles strided over the programs."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    for item in range(tl.program_id(0), tiles_m * tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = item % tiles_m, item // tiles_m  # the row tiles of one weight tile run side by side
        acc, rm, rn = _gemm_acc(x_ptr, w_ptr, M, N, K, K, K, pid_m, pid_n, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE_F32, CACHE)
        _store_tile(out_ptr, N, _bias_silu(acc, b_ptr, rn, N, True, SILU), rm, rn, M, N)


@triton.jit
def _norm_phase(
    x_ptr, y_ptr, w_ptr, out_ptr, out_stride, cross_ptr, M, L, H, eps,
    BLOCK_H: tl.constexpr, CROSS: tl.constexpr, CACHE: tl.constexpr,
):
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r = tl.arange(0, 1).to(tl.int64) + row
        _add_rmsnorm_rows(x_ptr, y_ptr, w_ptr, out_ptr, out_stride, cross_ptr, L, M, H, eps, r, BLOCK_H, CROSS, True, CACHE)


@triton.jit
def _attention_phase(
    qkv_ptr, bias_ptr, bias_head_stride, bias_row_stride, out_ptr, M, L, qk_scale,
    H: tl.constexpr, HEADS: tl.constexpr, LP: tl.constexpr, DP: tl.constexpr, ATT_BLOCK_M: tl.constexpr,
    IEEE: tl.constexpr, F32_DOT: tl.constexpr, CACHE: tl.constexpr,
):
    n_q = tl.cdiv(L, ATT_BLOCK_M)
    for item in range(tl.program_id(0), (M // L) * HEADS * n_q, tl.num_programs(0)):
        req, head, qblock = item // (HEADS * n_q), (item // n_q) % HEADS, item % n_q
        _attention_block(
            qkv_ptr, 3 * H, bias_ptr, bias_head_stride, bias_row_stride, out_ptr, L, H, H // HEADS, qk_scale,
            tl.full((), 0, tl.int64) + req, head, qblock, LP, DP, ATT_BLOCK_M, IEEE, F32_DOT, CACHE,
        )


@triton.jit
def _lattice_layers_kernel(
    x_ptr, xn_ptr, qkv_ptr, attn_ptr, y_ptr, up_ptr, out_ptr, cross_ptr, counter_ptr, trace_ptr,
    w_qkv_ptr, b_qkv_ptr, w_o_ptr, b_o_ptr, n_mlp_ptr, w_up_ptr, b_up_ptr, w_down_ptr, b_down_ptr, n_next_ptr,
    bias_ptr, bias_head_stride, bias_row_stride, M, L, eps, qk_scale,
    H: tl.constexpr, FFN: tl.constexpr, HEADS: tl.constexpr, LAYERS: tl.constexpr, PHASE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, ATT_BLOCK_M: tl.constexpr,
    LP: tl.constexpr, DP: tl.constexpr, BLOCK_H: tl.constexpr, IEEE: tl.constexpr, F32_DOT: tl.constexpr,
    PREFETCH: tl.constexpr,  # persistent launch: first send every GEMM weight of every layer towards L2
    LINES_H: tl.constexpr, LINES_F: tl.constexpr,  # 128-byte lines per weight row of width H / FFN (powers of two)
    TRACE: tl.constexpr,  # persistent launch: per-phase clock readings into trace_ptr (see _phase_done)
):
    ALL: tl.constexpr = PHASE < 0
    CACHE: tl.constexpr = ".cg" if ALL else ""
    if TRACE and tl.program_id(0) == 0:
        tl.store(trace_ptr + 1, _globaltimer(tl.program_id(0)))
    if ALL and PREFETCH:  # the weights do not depend on any phase: their HBM reads overlap the first phases
        for layer in tl.static_range(LAYERS):
            _prefetch_weight(w_qkv_ptr + layer * 3 * H * H, 3 * H, H, BLOCK_N, LINES_H)
            _prefetch_weight(w_o_ptr + layer * H * H, H, H, BLOCK_N, LINES_H)
            _prefetch_weight(w_up_ptr + layer * FFN * H, FFN, H, BLOCK_N, LINES_H)
            _prefetch_weight(w_down_ptr + layer * H * FFN, H, FFN, BLOCK_N, LINES_F)
    for layer in tl.static_range(LAYERS):
        p0 = layer * 7  # the layer's first phase (a compile-time value)
        last = layer == LAYERS - 1
        if ALL or PHASE == p0:
            _linear_phase(xn_ptr, w_qkv_ptr + layer * 3 * H * H, b_qkv_ptr + layer * 3 * H, qkv_ptr, M, 3 * H, H,
                          False, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, CACHE)
            _phase_done(counter_ptr, trace_ptr, p0 + 1, ALL, TRACE)
        if ALL or PHASE == p0 + 1:
            _attention_phase(qkv_ptr, bias_ptr, bias_head_stride, bias_row_stride, attn_ptr, M, L, qk_scale,
                             H, HEADS, LP, DP, ATT_BLOCK_M, IEEE, F32_DOT, CACHE)
            _phase_done(counter_ptr, trace_ptr, p0 + 2, ALL, TRACE)
        if ALL or PHASE == p0 + 2:
            _linear_phase(attn_ptr, w_o_ptr + layer * H * H, b_o_ptr + layer * H, y_ptr, M, H, H,
                          False, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, CACHE)
            _phase_done(counter_ptr, trace_ptr, p0 + 3, ALL, TRACE)
        if ALL or PHASE == p0 + 3:
            _norm_phase(x_ptr, y_ptr, n_mlp_ptr + layer * H, xn_ptr, H, cross_ptr, M, L, H, eps, BLOCK_H, False, CACHE)
            _phase_done(counter_ptr, trace_ptr, p0 + 4, ALL, TRACE)
        if ALL or PHASE == p0 + 4:
            _linear_phase(xn_ptr, w_up_ptr + layer * FFN * H, b_up_ptr + layer * FFN, up_ptr, M, FFN, H,
                          True, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, CACHE)
            _phase_done(counter_ptr, trace_ptr, p0 + 5, ALL, TRACE)
        if ALL or PHASE == p0 + 5:
            _linear_phase(up_ptr, w_down_ptr + layer * H * FFN, b_down_ptr + layer * H, y_ptr, M, H, FFN,
                          False, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, CACHE)
            _phase_done(counter_ptr, trace_ptr, p0 + 6, ALL, TRACE)
        if ALL or PHASE == p0 + 6:
            if last:  # concat[h, h * t] of the last residual sum
                _norm_phase(x_ptr, y_ptr, n_next_ptr + layer * H, out_ptr, 2 * H, cross_ptr, M, L, H, eps, BLOCK_H, True, CACHE)
                if TRACE:
                    tl.atomic_max(trace_ptr + 2 * (p0 + 7), _globaltimer(tl.program_id(0)), sem="relaxed", scope="gpu")
            else:
                _norm_phase(x_ptr, y_ptr, n_next_ptr + layer * H, xn_ptr, H, cross_ptr, M, L, H, eps, BLOCK_H, False, CACHE)
                _phase_done(counter_ptr, trace_ptr, p0 + 7, ALL, TRACE)
    if ALL:  # the last program out zeroes the counter for the next launch (every program is past every barrier)
        tl.debug_barrier()
        if tl.atomic_add(counter_ptr + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(counter_ptr + 1, 0, sem="relaxed", scope="gpu")


class LatticeWeights:
    """The lattice layers' parameters stacked over layers, as the kernel reads them:
    w_qkv [Ly, 3H, H], b_qkv [Ly, 3H], w_o [Ly, H, H], b_o [Ly, H], n_mlp [Ly, H] (each layer's
    mlp_norm), w_up [Ly, F, H], b_up [Ly, F], w_down [Ly, H, F], b_down [Ly, H], n_next [Ly, H]
    (the next layer's attn_norm; the output_norm after the last), one RMSNorm eps."""

    def __init__(self, layers, output_norm_weight: torch.Tensor, eps: float, heads: int) -> None:
        stack = lambda get: torch.stack([get(layer).detach() for layer in layers]).contiguous()  # noqa: E731
        self.w_qkv, self.b_qkv = stack(lambda m: m.attn.in_proj_weight), stack(lambda m: m.attn.in_proj_bias)
        self.w_o, self.b_o = stack(lambda m: m.attn.out_proj.weight), stack(lambda m: m.attn.out_proj.bias)
        self.n_mlp = stack(lambda m: m.mlp_norm.weight)
        self.w_up, self.b_up = stack(lambda m: m.mlp.up_proj.weight), stack(lambda m: m.mlp.up_proj.bias)
        self.w_down, self.b_down = stack(lambda m: m.mlp.down_proj.weight), stack(lambda m: m.mlp.down_proj.bias)
        self.n_next = torch.stack([layer.attn_norm.weight.detach() for layer in layers[1:]] + [output_norm_weight.detach()]).contiguous()
        self.eps, self.heads = float(eps), int(heads)
        self.layers, self.ffn, self.width = self.w_up.shape[0], self.w_up.shape[1], self.w_up.shape[2]
        # [arrivals, exits, barrier waits that gave up]: the first two are zero between launches
        self.counter = torch.zeros(3, dtype=torch.int32, device=self.w_up.device)


def lattice_layers_persistent(
    weights: LatticeWeights,
    x: torch.Tensor,  # [M, H] residual stream (updated in place up to the last sum)
    xn: torch.Tensor,  # [M, H] the first layer's attention input (overwritten)
    bias: torch.Tensor,  # [1 or heads, heads?, L, L] lattice attention bias, unit column stride
    cross: torch.Tensor,  # [b, H] the anchor state t
    *,
    persistent: bool | None = None,  # None: on CUDA (the CPU interpreter runs one launch per phase)
    prefetch: bool = True,  # persistent launch: L2 prefetch of all layer weights at its start
    trace: torch.Tensor | None = None,  # persistent launch: zeroed int64 [2 (phases + 1)], see phase_times
) -> torch.Tensor:
    """-> concat[h, h * t] [M, 2H] after every lattice layer (what fast_head._layers_fused returns)."""
    m, h = x.shape
    if bias.dim() == 4 and bias.shape[0] == 1:
        bias = bias[0]
    heads, length = weights.heads, bias.shape[-1]
    if h != weights.width or xn.shape != x.shape or m % max(length, 1) or cross.shape != (m // length, h):
        raise ValueError(
            f"lattice_layers_persistent: x {tuple(x.shape)}, xn {tuple(xn.shape)}, bias {tuple(bias.shape)}, "
            f"cross {tuple(cross.shape)} do not fit H = {weights.width} and L = {length} nodes per request"
        )
    if m > MAX_ROWS:
        raise ValueError(f"lattice_layers_persistent: {m} rows > {MAX_ROWS}; larger batches take the launch-per-GEMM path")
    persistent = x.is_cuda if persistent is None else bool(persistent)
    dev, dt = x.device, x.dtype
    qkv = torch.empty((m, 3 * h), device=dev, dtype=dt)
    attn, y = torch.empty_like(x), torch.empty_like(x)
    up = torch.empty((m, weights.ffn), device=dev, dtype=dt)
    out = torch.empty((m, 2 * h), device=dev, dtype=dt)
    dh = h // heads
    f32 = dt == torch.float32 or not x.is_cuda
    n_items = max(triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N) for n in (3 * h, weights.ffn))
    grid = (min(sm_count(dev), n_items),)
    w = weights
    args = (
        x, xn, qkv, attn, y, up, out, cross.contiguous(), w.counter, w.counter if trace is None else trace,
        w.w_qkv, w.b_qkv, w.w_o, w.b_o, w.n_mlp, w.w_up, w.b_up, w.w_down, w.b_down, w.n_next,
        bias, bias.stride(0), bias.stride(1), m, length, w.eps, 1.0 / math.sqrt(dh),
    )
    block_k = min(BLOCK_K, max(16, triton.next_power_of_2(h)))
    consts = dict(
        H=h, FFN=w.ffn, HEADS=heads, LAYERS=w.layers, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=block_k,
        EVEN_K=h % block_k == 0 and w.ffn % block_k == 0,
        ATT_BLOCK_M=ATT_BLOCK_M, LP=max(16, triton.next_power_of_2(length)), DP=max(16, triton.next_power_of_2(dh)),
        BLOCK_H=triton.next_power_of_2(h), IEEE=f32, F32_DOT=not x.is_cuda, PREFETCH=prefetch and persistent,
        LINES_H=triton.next_power_of_2(triton.cdiv(h, 64)), LINES_F=triton.next_power_of_2(triton.cdiv(w.ffn, 64)),
        TRACE=trace is not None and persistent, num_warps=NUM_WARPS,
    )
    for phase in [-1] if persistent else range(w.layers * PHASES_PER_LAYER):
        _lattice_layers_kernel[grid](*args, PHASE=phase, **consts)
    return out


def phase_times(trace: torch.Tensor) -> list[tuple[float, float]]:
    """A traced launch's clock readings -> per phase (us of work from the previous barrier's opening
    to the last program's finish, us from that finish to program 0 seeing the barrier open)."""
    t = trace.tolist()
    return [((t[2 * p] - t[2 * p - 1]) / 1e3, (t[2 * p + 1] - t[2 * p]) / 1e3 if p < len(t) // 2 - 1 else 0.0)
            for p in range(1, len(t) // 2)]
