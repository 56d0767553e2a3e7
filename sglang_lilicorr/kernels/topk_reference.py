"""Top-K candidates and the full-vocabulary logsumexp of logits rows as PyTorch defines them (paper App. A), and
the argument checks every implementation shares. Ties go to the lowest index."""

from __future__ import annotations

import torch

MAX_TOPK = 16  # the Triton kernel keeps the K-best buffer in one lane group


def check_topk_lse_args(logits: torch.Tensor, k: int) -> None:
    """Raise a clear error for logits that are not [N, V] floats or a k outside [1, min(16, V)]."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"topk_lse: logits must be a 2-D tensor [N, V], got {shape}; flatten leading dims first")
    if not logits.is_floating_point():
        raise TypeError(f"topk_lse: logits must be floating point (bf16/fp16/fp32), got {logits.dtype}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOPK:
        raise ValueError(f"topk_lse: k must be an int in [1, {MAX_TOPK}], got {k!r}")
    if k > logits.shape[1]:
        raise ValueError(f"topk_lse: k={k} exceeds the vocabulary size V={logits.shape[1]}; lower k")
    if logits.shape[1] >= 2**31:
        raise ValueError(f"topk_lse: V={logits.shape[1]} too large; indices must fit in int32")


def topk_lse_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (vals fp32 [N, k] descending, ids int64 [N, k], lse fp32 [N])."""
    check_topk_lse_args(logits, k)
    x = logits.float()
    vals, ids = torch.sort(x, dim=-1, descending=True, stable=True)  # stable: lowest index first
    return vals[:, :k].contiguous(), ids[:, :k].contiguous(), torch.logsumexp(x, dim=-1)


def merge_topk_lse_reference(
    shards: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-shard (vals [N, k_s], global ids [N, k_s], lse [N]), k_s = min(k, shard size) -> the whole rows' (vals fp32
    [N, k], ids int64 [N, k], lse fp32 [N]): ties to the lower global id."""
    vals = torch.cat([v.float() for v, _, _ in shards], dim=1)
    ids = torch.cat([i for _, i, _ in shards], dim=1)
    by_id = torch.argsort(ids, dim=1, stable=True)
    vals, ids = vals.gather(1, by_id), ids.gather(1, by_id)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices[:, :k]  # stable: lower id first
    lse = torch.logsumexp(torch.stack([s.float() for _, _, s in shards]), dim=0)
    return vals.gather(1, order).contiguous(), ids.gather(1, order).contiguous(), lse


def sharded_topk_lse_reference(
    logits: torch.Tensor, k: int, bounds: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] split at `bounds` (0 = b_0 <= b_1 <= ... = V: shard r holds columns b_r .. b_{r+1} - 1) ->
    topk_lse_reference of each non-empty shard, merged (merge_topk_lse_reference)."""
    check_topk_lse_args(logits, k)
    if bounds[0] != 0 or bounds[-1] != logits.shape[1] or list(bounds) != sorted(bounds):
        raise ValueError(f"sharded_topk_lse_reference: bounds {bounds} do not split [0, {logits.shape[1]}] in order")
    shards = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi > lo:
            vals, ids, lse = topk_lse_reference(logits[:, lo:hi], min(k, hi - lo))
            shards.append((vals, ids + lo, lse))
    return merge_topk_lse_reference(shards, k)
