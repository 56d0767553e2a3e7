"""Fused top-K + full-vocabulary logsumexp over logits rows, in Triton: stage 1 ("split") streams each chunk of a row
once (running max and sum of exponentials, the K best sub-tiles re-loaded for the exact top-K); stage 2 ("merge")
combines a row's chunks. Elements rank by unique int64 keys (value descending, index ascending); bf16 by int32 keys."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .device import sm_count
from .pdl import check_pdl, grid_dependency_wait, pdl_launch
from .topk_reference import check_topk_lse_args
from .tuning import TOPK_FEW_ROWS, TOPK_MIN_TILES_PER_SPLIT, TopKLaunch

SENTINEL = tl.constexpr(-(2**63))  # below every ordering key
NARROW_SENTINEL = tl.constexpr(-(2**31))  # ... of the narrow keys
NARROW_SPAN = 2**16  # narrow keys: indices (chunk offsets, partial positions) below this


@triton.jit
def _order_bits(x):
    """fp32 -> int32 whose signed order is the values' (-0.0 ties with +0.0, as in torch.sort)."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _order_key(x, index, NARROW: tl.constexpr):
    """fp32, int32 (same shape) -> keys: value descending, then index ascending. Wide: int64. NARROW (bf16-exact
    values, 0 <= index < NARROW_SPAN): int32, the top 16 order bits (a negative value's low 16 are all ones)."""
    if NARROW:
        key = (_order_bits(x) & -65536) | (0xFFFF - index)
    else:
        key = (_order_bits(x).to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)
    return key


@triton.jit
def _bottom(NARROW: tl.constexpr):
    """The key below every real key (an empty or removed slot) and the one above every real key."""
    if NARROW:
        low, high = tl.full((), NARROW_SENTINEL, tl.int32), tl.full((), 2**31 - 1, tl.int32)
    else:
        low, high = tl.full((), SENTINEL, tl.int64), tl.full((), 2**63 - 1, tl.int64)
    return low, high


@triton.jit
def _narrow_index(key):
    """narrow keys -> their int32 indices (chunk offsets or positions)."""
    return 0xFFFF - (key & 0xFFFF)


@triton.jit
def _narrow_value(key):
    """narrow keys -> their fp32 (bf16-exact) values."""
    bits = key & -65536
    return tl.where(bits >= 0, bits, bits ^ 0x7FFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _widen(key, origin):
    """narrow keys (none the bottom key), indices counted from `origin` -> the int64 keys of the same elements."""
    return _order_key(_narrow_value(key), origin + _narrow_index(key), False)


@triton.jit
def key_value(key):
    """int64 keys -> their fp32 values."""
    bits = (key >> 32).to(tl.int32)
    bits = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def key_index(key):
    """int64 keys -> their int64 indices."""
    return 0x7FFFFFFF - (key & 0x7FFFFFFF)


@triton.jit
def _decode(key, NARROW: tl.constexpr):
    """keys -> (their fp32 values, their indices), narrow or wide."""
    if NARROW:
        value, index = _narrow_value(key), _narrow_index(key)
    else:
        value, index = key_value(key), key_index(key)
    return value, index


@triton.jit
def _top_keys(keys, slots, K: tl.constexpr, NARROW: tl.constexpr):
    """The K largest of `keys` [T], descending, in a [KP] vector (slots >= K: the bottom key)."""
    bottom, _ = _bottom(NARROW)
    best_keys = tl.full(slots.shape, 0, keys.dtype) + bottom
    for i in tl.static_range(K):
        best = tl.max(keys, 0)
        best_keys = tl.where(slots == i, best, best_keys)
        keys = tl.where(keys == best, bottom, keys)
    return best_keys


@triton.jit
def _store_keys(best_keys, slots, vals_ptr, ids_ptr, K: tl.constexpr):
    """Write K keys [KP] (descending) as one vals/ids row."""
    tl.store(vals_ptr + slots, key_value(best_keys), mask=slots < K)
    tl.store(ids_ptr + slots, key_index(best_keys), mask=slots < K)


@triton.jit
def _stream_tile(row_ptr, start, hi, tile, x_next, run_max, run_sum, BLOCK: tl.constexpr):
    """Load the next tile, fold x_next into the running max / sum -> (next, sub-tile maxima, max, run_max, run_sum)."""
    LOG2E: tl.constexpr = 1.4426950408889634
    x = x_next.to(tl.float32)
    # the next tile's load before this tile's reductions: two tiles in flight (PERF_NOTES.md)
    nxt = start + BLOCK + tile
    x_next = tl.load(row_ptr + nxt, mask=nxt < hi, other=-float("inf"))
    sub_max = tl.max(x, 1)  # [R]; masked logits are -inf, ranked after every real one
    tile_max = tl.max(sub_max, 0)
    new_max = tl.maximum(run_max, tile_max)
    shift = tl.where(new_max == -float("inf"), 0.0, new_max) * LOG2E  # keeps all -inf tiles NaN-free
    run_sum = run_sum * tl.exp2(run_max * LOG2E - shift) + tl.sum(tl.exp2(x * LOG2E - shift))  # one FMA each
    return x_next, sub_max, tile_max, new_max, run_sum


@triton.jit
def _topk_lse_split_kernel(
    logits_ptr,
    row_stride,
    V,
    chunk,  # logits [N, V] (unit column stride); chunk: logits per split
    part_key_ptr,
    part_max_ptr,
    part_sum_ptr,  # [N, SPLITS, KP] int64, [N, SPLITS] fp32 x2
    vals_ptr,
    ids_ptr,
    lse_ptr,  # [N, K] fp32, [N, K] int64, [N] fp32 (written when FINAL)
    K: tl.constexpr,
    KP: tl.constexpr,
    R: tl.constexpr,
    G: tl.constexpr,
    TP: tl.constexpr,  # TP: tiles collected first
    FINAL: tl.constexpr,
    PDL: tl.constexpr,
    NARROW: tl.constexpr,  # narrow keys, indices counted from the chunk's start (bf16 logits, chunk <= NARROW_SPAN)
):
    grid_dependency_wait(PDL)
    row = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    lo = split * chunk  # a multiple of R * G
    hi = tl.minimum(lo + chunk, V)
    subs = tl.arange(0, R)
    tiles = tl.arange(0, TP)
    tile = subs[:, None] * G + tl.arange(0, G)[None, :]  # [R, G] offsets within a tile
    slots = tl.arange(0, KP)
    BLOCK: tl.constexpr = R * G
    bottom, top = _bottom(NARROW)
    if NARROW:
        origin = lo  # where the keys' indices count from
    else:
        origin = lo * 0

    # 1) the first TP tiles: every sub-tile maximum kept, ranked once
    maxima = tl.full((TP, R), -float("inf"), tl.float32)  # [tile, sub-tile]
    run_max = tl.full((), -float("inf"), tl.float32)
    run_sum = tl.full((), 0.0, tl.float32)
    x_next = tl.load(row_ptr + lo + tile, mask=lo + tile < hi, other=-float("inf"))
    mid = tl.minimum(lo + TP * BLOCK, hi)
    for start in range(lo, mid, BLOCK):
        x_next, sub_max, tile_max, run_max, run_sum = _stream_tile(
            row_ptr, start, hi, tile, x_next, run_max, run_sum, BLOCK
        )
        maxima = tl.where(tiles[:, None] == (start - lo) // BLOCK, sub_max[None, :], maxima)
    live_tile = tiles[:, None] < tl.cdiv(mid - lo, BLOCK)
    sub_keys = tl.where(
        live_tile, _order_key(maxima, (lo - origin) // G + tiles[:, None] * R + subs[None, :], NARROW), bottom
    )
    buf = _top_keys(tl.reshape(sub_keys, [TP * R]), slots, K, NARROW)  # the K best so far, descending

    # 2) the rest of the chunk: a K-best buffer of sub-tile keys (unsorted), which tiles below its
    #    worst key skip; padding slots >= K hold the top key (never "worst")
    buf = tl.where(slots < K, buf, top)
    worst = tl.min(buf, 0)  # smallest key in the buffer: the one a better sub-tile evicts
    worst_value, _ = _decode(worst, NARROW)
    floor = tl.where(worst == bottom, -float("inf"), worst_value)  # tiles below it cannot enter
    for start in range(mid, hi, BLOCK):
        x_next, sub_max, tile_max, run_max, run_sum = _stream_tile(
            row_ptr, start, hi, tile, x_next, run_max, run_sum, BLOCK
        )
        if tile_max >= floor:
            keys = _order_key(sub_max, (start - origin) // G + subs, NARROW)
            n_better = tl.minimum(tl.sum((keys > worst).to(tl.int32), 0), K)
            for _ in range(n_better):
                best = tl.max(keys, 0)
                evict = tl.min(tl.where(buf == worst, slots, KP), 0)
                buf = tl.where((slots == evict) & (best > worst), best, buf)
                keys = tl.where(keys == best, bottom, keys)
                worst = tl.min(buf, 0)
            worst_value, _ = _decode(worst, NARROW)
            floor = tl.where(worst == bottom, -float("inf"), worst_value)

    # exact top-K among the chosen sub-tiles' logits (re-loaded: just streamed, so cache hits)
    live = (slots < K) & (buf != bottom)
    _, sub_index = _decode(buf, NARROW)
    sub_start = origin + (sub_index * G).to(tl.int32)  # [KP]
    offs = sub_start[:, None] + tl.arange(0, G)[None, :]  # [KP, G]
    inside = live[:, None] & (offs < hi)
    x = tl.load(row_ptr + offs, mask=inside, other=-float("inf")).to(tl.float32)
    keys = tl.reshape(tl.where(inside, _order_key(x, offs - origin, NARROW), bottom), [KP * G])
    best = _top_keys(keys, slots, K, NARROW)
    if NARROW:
        best = tl.where(best == bottom, SENTINEL, _widen(best, origin))

    if FINAL:
        # run_sum >= 1 whenever run_max is finite; an all -inf row gives -inf + log(1) = -inf
        tl.store(lse_ptr + row, run_max + tl.log(tl.maximum(run_sum, 1.0)))
        _store_keys(best, slots, vals_ptr + row * K, ids_ptr + row * K, K)
    else:
        part = row * n_splits + split
        tl.store(part_key_ptr + part * KP + slots, best)
        tl.store(part_max_ptr + part, run_max)
        tl.store(part_sum_ptr + part, run_sum)


@triton.jit
def merge_row(
    part_key_ptr,
    part_max_ptr,
    part_sum_ptr,
    n_splits,
    row,
    slots,
    K: tl.constexpr,
    KP: tl.constexpr,
    SP: tl.constexpr,
    NARROW: tl.constexpr,
):
    """Stage 2 for one row: its partials -> (lse, its K best keys [KP] descending, SENTINEL past K)."""
    splits = tl.arange(0, SP)
    live = splits < n_splits
    part = row * n_splits + splits
    LOG2E: tl.constexpr = 1.4426950408889634

    m = tl.load(part_max_ptr + part, mask=live, other=-float("inf"))
    s = tl.load(part_sum_ptr + part, mask=live, other=0.0)
    row_max = tl.max(m, 0)
    shift = tl.where(row_max == -float("inf"), 0.0, row_max)
    total = tl.sum(s * tl.exp2((m - shift) * LOG2E), 0)
    lse = row_max + tl.log(tl.maximum(total, 1.0))  # total >= 1 unless all -inf

    at = part_key_ptr + part[:, None] * KP + slots[None, :]
    keys = tl.load(at, mask=live[:, None] & (slots[None, :] < K), other=SENTINEL)  # [SP, KP]
    keys = tl.reshape(keys, [SP * KP])  # position split * KP + slot
    if NARROW:
        position = tl.arange(0, SP * KP)
        narrow = tl.where(keys == SENTINEL, NARROW_SENTINEL, ((keys >> 32).to(tl.int32) & -65536) | (0xFFFF - position))
        best = _top_keys(narrow, slots, K, True)
        first = part_key_ptr + row * n_splits * KP  # the row's partials, by position
        best = tl.load(first + _narrow_index(best), mask=best != NARROW_SENTINEL, other=SENTINEL)
    else:
        best = _top_keys(keys, slots, K, False)
    return lse, best


@triton.jit(do_not_specialize=["n_splits"])  # chunks per row, by batch size (split_plan): a bound only
def _topk_lse_merge_kernel(
    part_key_ptr,
    part_max_ptr,
    part_sum_ptr,
    n_splits,  # partials of stage 1
    vals_ptr,
    ids_ptr,
    lse_ptr,  # [N, K] fp32, [N, K] int64, [N] fp32
    K: tl.constexpr,
    KP: tl.constexpr,
    SP: tl.constexpr,
    PDL: tl.constexpr,  # SP: splits rounded up to a power of 2
    NARROW: tl.constexpr,  # TopKParts.narrow
):
    grid_dependency_wait(PDL)
    row = tl.program_id(0)
    slots = tl.arange(0, KP)
    lse, best_keys = merge_row(part_key_ptr, part_max_ptr, part_sum_ptr, n_splits, row, slots, K, KP, SP, NARROW)
    tl.store(lse_ptr + row, lse)
    _store_keys(best_keys, slots, vals_ptr + row * K, ids_ptr + row * K, K)


def min_tiles(n_rows: int, launch: TopKLaunch = TopKLaunch()) -> int:
    """The shortest run of tiles per split for N rows (launch.few_rows_tiles up to TOPK_FEW_ROWS, else the default)."""
    return launch.few_rows_tiles if n_rows <= TOPK_FEW_ROWS else TOPK_MIN_TILES_PER_SPLIT


def split_plan(n_rows: int, vocab: int, device: torch.device, launch: TopKLaunch = TopKLaunch()) -> tuple[int, int]:
    """(splits per row, logits per split) for N rows: about one wave of programs, runs of >= min_tiles(N) tiles."""
    tiles = triton.cdiv(vocab, launch.block)
    want = max(1, launch.programs_per_sm * sm_count(device) // n_rows)  # CPU interpreter: 1 SM, a few splits
    tiles_per_split = max(triton.cdiv(tiles, min(want, tiles)), min(min_tiles(n_rows, launch), tiles))
    return triton.cdiv(tiles, tiles_per_split), tiles_per_split * launch.block


def even_splits(vocab: int, splits: int, block: int) -> tuple[int, int]:
    """(splits per row, logits per split) for about `splits` equal chunks of whole `block`-logit tiles."""
    chunk = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    return triton.cdiv(vocab, chunk), chunk


class TopKParts(NamedTuple):
    """Stage 1's per-chunk partials of N rows, which stage 2 merges (merge_row)."""

    keys: torch.Tensor  # int64 [N * splits, KP]: each chunk's K best keys
    maxima: torch.Tensor  # fp32 [N * splits]: each chunk's running max ...
    sums: torch.Tensor  # fp32 [N * splits]: ... and sum of exponentials
    splits: int  # chunks per row
    width: int  # SP, merge_row's constexpr: splits rounded up to a power of two
    k: int  # candidates per row
    narrow: bool  # merge_row's NARROW: the values are bf16 (and the launch's narrow_keys is on)


def topk_lse_triton(
    logits: torch.Tensor, k: int, splits: int | None = None, launch: TopKLaunch = TopKLaunch(), *, pdl: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (vals fp32 [N, k] descending, ids int64 [N, k], lse fp32 [N]), ties: lowest id; no host sync."""
    (vals, ids, lse), parts = _split_stage("topk_lse_triton", logits, k, splits, launch, pdl)
    if parts is not None and logits.shape[0]:
        # the merge is launched in full stream order (launched early it was slower: PERF_NOTES.md, row 18)
        kp = parts.keys.shape[1]
        args = (parts.keys, parts.maxima, parts.sums, parts.splits, vals, ids, lse)
        _topk_lse_merge_kernel[(logits.shape[0],)](
            *args,
            K=k,
            KP=kp,
            SP=parts.width,
            NARROW=parts.narrow,
            **pdl_launch(pdl, launch_pdl=False),
            num_warps=1 if parts.width * kp <= 512 else 4,  # 512 keys: 16 per lane of one warp
        )
    return vals, ids, lse


def _split_stage(name, logits, k, splits, launch, pdl):
    """Launch stage 1 -> ((vals, ids, lse), partials); with one chunk per row it writes the outputs (partials None)."""
    check_topk_lse_args(logits, k)
    check_pdl(pdl, logits, name)
    block = launch.block
    if block < 16 or block & (block - 1):
        raise ValueError(f"{name}: launch.block must be a power of two >= 16, got {block}")
    for field in ("group", "collect_tiles"):
        value = getattr(launch, field)
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name}: launch.{field} must be a power of two, got {value}")
    if launch.few_rows_tiles < 1:
        raise ValueError(f"{name}: launch.few_rows_tiles must be >= 1, got {launch.few_rows_tiles}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n, vocab = logits.shape
    dev = logits.device
    outputs = (
        torch.empty((n, k), dtype=torch.float32, device=dev),
        torch.empty((n, k), dtype=torch.int64, device=dev),
        torch.empty((n,), dtype=torch.float32, device=dev),
    )
    if not n:  # no rows: nothing to launch (and no split plan for zero rows)
        splits, chunk = 1, vocab
    elif splits is None:
        splits, chunk = split_plan(n, vocab, dev, launch)
    else:
        splits, chunk = even_splits(vocab, splits, block)
    kp = triton.next_power_of_2(k)
    final = splits == 1  # one chunk per row: the split kernel writes the outputs itself
    rows = 0 if final else n * splits
    # two merge widths per vocabulary (N <= TOPK_FEW_ROWS and above), not one per N: no compile per batch size
    width = triton.next_power_of_2(max(splits, triton.cdiv(triton.cdiv(vocab, block), min_tiles(n, launch))))
    narrow = launch.narrow_keys and logits.dtype == torch.bfloat16 and width * kp <= NARROW_SPAN  # merge positions
    keys = torch.empty((rows, kp), dtype=torch.int64, device=dev)
    maxima, sums = (torch.empty((rows,), dtype=torch.float32, device=dev) for _ in range(2))
    parts = TopKParts(keys, maxima, sums, splits, width, k, narrow)
    if n:
        group = min(launch.group, block)
        args = (logits, logits.stride(0), vocab, chunk, parts.keys, parts.maxima, parts.sums, *outputs)
        _topk_lse_split_kernel[(n, splits)](
            *args,
            K=k,
            KP=kp,
            R=block // group,
            G=group,
            TP=launch.collect_tiles,
            FINAL=final,
            PDL=pdl,
            NARROW=narrow and chunk <= NARROW_SPAN,
            launch_pdl=pdl,
            num_warps=launch.num_warps,
            **({"maxnreg": launch.maxnreg} if launch.maxnreg else {}),
        )
    return outputs, None if final else parts
