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
