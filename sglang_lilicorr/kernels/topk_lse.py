"""Top-K candidates and the full-vocabulary logsumexp of logits rows: the fused Triton kernel (topk_lse_fused.py) on
CUDA or under TRITON_INTERPRET=1, else the PyTorch definition (topk_reference.py). Ties go to the lowest index."""

from __future__ import annotations

import torch

from .device import uses_triton
from .topk_reference import check_topk_lse_args, topk_lse_reference
from .tuning import TopKLaunch


def topk_lse(
    logits: torch.Tensor, k: int, *, pdl: bool = False, launch: TopKLaunch = TopKLaunch()
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] any float dtype -> (vals fp32 [N, k] descending, ids int64 [N, k], lse fp32 [N]); `pdl` and
    `launch` as topk_lse_fused.topk_lse_triton takes them."""
    check_topk_lse_args(logits, k)
    if not uses_triton(logits):
        return topk_lse_reference(logits, k)
    from .topk_lse_fused import topk_lse_triton  # imports triton only when it runs

    return topk_lse_triton(logits, k, launch=launch, pdl=pdl)
