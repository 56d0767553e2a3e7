"""Top-K + logsumexp over contiguous vocabulary shards (one per TP rank), merged exactly into `topk_lse`'s result:
`shard_partials` [N, n] -> [N, k + 1] int64 (k keys with global ids, then the lse's fp32 bits); after an all-gather,
`merge_partials` [ranks, N, k + 1] -> (vals, ids, lse). torch ops, static shapes, graph-capturable."""

from __future__ import annotations

import torch

from .topk_lse import topk_lse

SENTINEL = -(2**63)  # below every ordering key: an empty slot of a shard with fewer than k entries
_LOW = 0x7FFFFFFF  # the low word holds 2^31-1 - id


def order_keys(vals: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """vals fp32, ids int64 (same shape; ids < 2^31) -> int64 keys, larger = ranked first."""
    bits = torch.where(vals == 0, torch.zeros_like(vals), vals).view(torch.int32)  # -0.0 ties with +0.0
    bits = torch.where(bits >= 0, bits, bits ^ _LOW)
    return (bits.to(torch.int64) << 32) | (_LOW - ids)


def key_values(keys: torch.Tensor) -> torch.Tensor:
    """int64 keys -> their fp32 values."""
    bits = (keys >> 32).to(torch.int32)
    return torch.where(bits >= 0, bits, bits ^ _LOW).view(torch.float32)


def key_ids(keys: torch.Tensor) -> torch.Tensor:
    """int64 keys -> their int64 ids."""
    return _LOW - (keys & _LOW)


def shard_partials(logits: torch.Tensor, k: int, vocab_start: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, n] of one shard (global ids from vocab_start; n may be below k, or 0) -> partials int64 [N, k + 1]
    (into `out` if given): its k best keys descending (SENTINEL past n), then its lse's fp32 bits."""
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(
            f"shard_partials: logits must be a float [N, n] shard, got {tuple(logits.shape)} {logits.dtype}"
        )
    n_rows, n = logits.shape
    if out is None:
        out = torch.empty((n_rows, k + 1), dtype=torch.int64, device=logits.device)
    elif out.shape != (n_rows, k + 1) or out.dtype != torch.int64:
        raise ValueError(f"shard_partials: out must be int64 [{n_rows}, {k + 1}], got {tuple(out.shape)} {out.dtype}")
    local = min(k, n)
    if local == 0:  # no entry of the vocabulary on this shard
        out[:, :k].fill_(SENTINEL)
        out[:, k].copy_(_lse_bits(torch.full((n_rows,), float("-inf"), device=logits.device)))
        return out
    vals, ids, lse = topk_lse(logits, local)
    out[:, :local].copy_(order_keys(vals, ids + vocab_start))
    out[:, local:k].fill_(SENTINEL)
    out[:, k].copy_(_lse_bits(lse))
    return out


def merge_partials(gathered: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """gathered int64 [ranks, N, k + 1] (every rank's `shard_partials`, in any rank order) -> (vals fp32 [N, k]
    descending, ids int64 [N, k], lse fp32 [N]): what topk_lse gives on the unsharded rows."""
    if gathered.dim() != 3 or gathered.shape[2] != k + 1 or gathered.dtype != torch.int64:
        raise ValueError(
            f"merge_partials: gathered must be int64 [ranks, N, {k + 1}], got {tuple(gathered.shape)} {gathered.dtype}"
        )
    ranks, n_rows = gathered.shape[:2]
    keys = gathered[:, :, :k].permute(1, 0, 2).reshape(n_rows, ranks * k)
    top = torch.topk(keys, k, dim=1).values  # unique keys: one order, descending
    lse = torch.logsumexp(gathered[:, :, k].to(torch.int32).view(torch.float32), dim=0)
    return key_values(top), key_ids(top), lse


def _lse_bits(lse: torch.Tensor) -> torch.Tensor:
    """fp32 [N] -> int64 [N] holding its bits (sign-extended; `merge_partials` reads the low 32)."""
    return lse.float().view(torch.int32).to(torch.int64)
