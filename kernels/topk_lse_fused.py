"""Fused top-K + full-vocabulary logsumexp over logits rows, in Triton.

Stage 1 ("split") streams one chunk of one row: a running max / sum-of-exponentials for the
logsumexp and a running K-best buffer for the top-K, both in registers, in a single read of the
logits. Stage 2 ("merge") combines the per-chunk partials of a row. With one chunk per row the
split kernel finishes the row itself and stage 2 is not launched.

Ordering keys: every element gets a unique int64 key whose order is "larger value first, then
lower index first" (the float's bits mapped to an order-preserving int32 in the high word,
2^31-1-index in the low word), so top-K is "the K largest keys" with no tie special cases and
-inf values are ordinary keys. SENTINEL (int64 min) is below every real key and marks an empty
or removed slot.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .topk_lse import check_topk_lse_args

SENTINEL = tl.constexpr(-(2**63))  # below every ordering key
BLOCK = 2048  # logits per tile: 16 bf16 (two 16-byte loads) per thread at 4 warps
NUM_WARPS = 4
MAX_REGISTERS = 64  # per thread: 8 resident stage-1 programs of 128 threads fill an SM's 64K
PROGRAMS_PER_SM = 8  # stage-1 grid aims at one wave of these


@triton.jit
def _order_key(x, index):
    """fp32 [T], int32 [T] -> int64 [T] keys: value descending, then index ascending."""
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties with +0.0, as in torch.sort
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (bits.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def _key_value(key):
    """int64 keys -> their fp32 values."""
    bits = (key >> 32).to(tl.int32)
    bits = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _key_index(key):
    """int64 keys -> their int64 vocabulary indices."""
    return 0x7FFFFFFF - (key & 0x7FFFFFFF)


@triton.jit
def _store_sorted(keys, slots, vals_ptr, ids_ptr, K: tl.constexpr):
    """Write the K largest of `keys` [T] in descending order to one vals/ids row."""
    best_keys = tl.full(slots.shape, SENTINEL, tl.int64)
    for i in tl.static_range(K):
        best = tl.max(keys, 0)
        best_keys = tl.where(slots == i, best, best_keys)
        keys = tl.where(keys == best, SENTINEL, keys)
    tl.store(vals_ptr + slots, _key_value(best_keys), mask=slots < K)
    tl.store(ids_ptr + slots, _key_index(best_keys), mask=slots < K)


@triton.jit
def _topk_lse_split_kernel(
    logits_ptr, row_stride, V, chunk,  # logits [N, V] (unit column stride); chunk: logits per split
    part_key_ptr, part_max_ptr, part_sum_ptr,  # [N, SPLITS, KP] int64, [N, SPLITS] fp32 x2
    vals_ptr, ids_ptr, lse_ptr,  # [N, K] fp32, [N, K] int64, [N] fp32 (written when FINAL)
    K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, FINAL: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    lo = split * chunk
    hi = tl.minimum(lo + chunk, V)
    lanes = tl.arange(0, BLOCK)
    slots = tl.arange(0, KP)
    LOG2E: tl.constexpr = 1.4426950408889634

    # K-best buffer (unsorted); padding slots >= K hold int64 max so they are never "worst".
    buf = tl.where(slots < K, SENTINEL, 0x7FFFFFFFFFFFFFFF).to(tl.int64)
    worst = tl.min(buf, 0)  # smallest key in the buffer: the one a better element evicts
    floor = tl.full((), -float("inf"), tl.float32)  # value of `worst`: tiles below it cannot enter
    run_max = tl.full((), -float("inf"), tl.float32)
    run_sum = tl.full((), 0.0, tl.float32)
    x_next = tl.load(row_ptr + lo + lanes, mask=lo + lanes < hi, other=-float("inf"))
    for start in range(lo, hi, BLOCK):
        offs = start + lanes
        inside = offs < hi
        x = x_next.to(tl.float32)
        # issue the next tile's load before this tile's reductions: two tiles in flight
        x_next = tl.load(row_ptr + BLOCK + offs, mask=BLOCK + offs < hi, other=-float("inf"))
        tile_max = tl.max(x, 0)
        new_max = tl.maximum(run_max, tile_max)
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # keeps all -inf tiles NaN-free
        run_sum = run_sum * tl.exp2((run_max - shift) * LOG2E) + tl.sum(tl.exp2((x - shift) * LOG2E), 0)
        run_max = new_max
        if tile_max >= floor:
            keys = tl.where(inside, _order_key(x, offs), SENTINEL)
            n_better = tl.minimum(tl.sum((keys > worst).to(tl.int32), 0), K)
            for _ in range(n_better):
                best = tl.max(keys, 0)
                evict = tl.min(tl.where(buf == worst, slots, KP), 0)
                buf = tl.where((slots == evict) & (best > worst), best, buf)
                keys = tl.where(keys == best, SENTINEL, keys)
                worst = tl.min(buf, 0)
            floor = tl.where(worst == SENTINEL, -float("inf"), _key_value(worst))
    buf = tl.where(slots < K, buf, SENTINEL)

    if FINAL:
        # run_sum >= 1 whenever run_max is finite; an all -inf row gives -inf + log(1) = -inf
        tl.store(lse_ptr + row, run_max + tl.log(tl.maximum(run_sum, 1.0)))
        _store_sorted(buf, slots, vals_ptr + row * K, ids_ptr + row * K, K)
    else:
        part = row * n_splits + split
        tl.store(part_key_ptr + part * KP + slots, buf)
        tl.store(part_max_ptr + part, run_max)
        tl.store(part_sum_ptr + part, run_sum)


@triton.jit
def _topk_lse_merge_kernel(
    part_key_ptr, part_max_ptr, part_sum_ptr, n_splits,  # partials of stage 1
    vals_ptr, ids_ptr, lse_ptr,  # [N, K] fp32, [N, K] int64, [N] fp32
    K: tl.constexpr, KP: tl.constexpr, SP: tl.constexpr,  # SP: splits rounded up to a power of 2
):
    row = tl.program_id(0)
    splits = tl.arange(0, SP)
    slots = tl.arange(0, KP)
    live = splits < n_splits
    part = row * n_splits + splits
    LOG2E: tl.constexpr = 1.4426950408889634

    m = tl.load(part_max_ptr + part, mask=live, other=-float("inf"))
    s = tl.load(part_sum_ptr + part, mask=live, other=0.0)
    row_max = tl.max(m, 0)
    shift = tl.where(row_max == -float("inf"), 0.0, row_max)
    total = tl.sum(s * tl.exp2((m - shift) * LOG2E), 0)
    tl.store(lse_ptr + row, row_max + tl.log(tl.maximum(total, 1.0)))  # total >= 1 unless all -inf

    keys = tl.load(
        part_key_ptr + part[:, None] * KP + slots[None, :],
        mask=live[:, None] & (slots[None, :] < K),
        other=SENTINEL,
    )  # [SP, KP]
    _store_sorted(tl.reshape(keys, [SP * KP]), slots, vals_ptr + row * K, ids_ptr + row * K, K)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # Triton's CPU interpreter: a few splits, so tests cover the merge stage
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_plan(n_rows: int, vocab: int, device: torch.device, block: int = BLOCK) -> tuple[int, int]:
    """(splits per row, logits per split): as many stage-1 programs as fit one wave on the GPU
    (PROGRAMS_PER_SM per SM), each a run of whole tiles."""
    tiles = triton.cdiv(vocab, block)
    want = max(1, PROGRAMS_PER_SM * _sm_count(device) // n_rows)
    tiles_per_split = triton.cdiv(tiles, min(want, tiles))
    return triton.cdiv(tiles, tiles_per_split), tiles_per_split * block


def topk_lse_triton(
    logits: torch.Tensor, k: int, splits: int | None = None, block: int = BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (vals fp32 [N, k] descending, ids int64 [N, k], lse fp32 [N]).

    Ties go to the lowest index. `splits` overrides the number of chunks per row (tests).
    No host syncs: safe to capture in a CUDA graph.
    """
    check_topk_lse_args(logits, k)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n, vocab = logits.shape
    dev = logits.device
    vals = torch.empty((n, k), dtype=torch.float32, device=dev)
    ids = torch.empty((n, k), dtype=torch.int64, device=dev)
    lse = torch.empty((n,), dtype=torch.float32, device=dev)
    if n == 0:
        return vals, ids, lse
    if splits is None:
        splits, chunk = split_plan(n, vocab, dev, block)
    else:
        chunk = triton.cdiv(triton.cdiv(vocab, splits), block) * block
        splits = triton.cdiv(vocab, chunk)
    kp = triton.next_power_of_2(k)
    final = splits == 1  # one chunk per row: the split kernel writes the outputs itself
    parts = 0 if final else n * splits
    part_key = torch.empty((parts, kp), dtype=torch.int64, device=dev)
    part_max = torch.empty((parts,), dtype=torch.float32, device=dev)
    part_sum = torch.empty((parts,), dtype=torch.float32, device=dev)
    _topk_lse_split_kernel[(n, splits)](
        logits, logits.stride(0), vocab, chunk,
        part_key, part_max, part_sum, vals, ids, lse,
        K=k, KP=kp, BLOCK=block, FINAL=final, num_warps=NUM_WARPS, maxnreg=MAX_REGISTERS,
    )
    if not final:
        _topk_lse_merge_kernel[(n,)](
            part_key, part_max, part_sum, splits, vals, ids, lse,
            K=k, KP=kp, SP=triton.next_power_of_2(splits), num_warps=NUM_WARPS,
        )
    return vals, ids, lse
