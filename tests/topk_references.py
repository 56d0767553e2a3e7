"""Top-K + logsumexp over a vocabulary split into shards, as PyTorch defines it: what kernels/topk_shards.py's merge
must give (the product merges by kernels/topk_shards.py alone)."""

from __future__ import annotations

import torch

from sglang_lilicorr.kernels.topk_reference import check_topk_lse_args, topk_lse_reference


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
