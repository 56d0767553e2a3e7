"""Top-K candidates and the full-vocabulary logsumexp of logits rows: `topk_lse` runs the fused Triton kernel
(`topk_lse_fused.py`) on CUDA tensors, or on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1), and the
PyTorch definition (`topk_reference.py`) otherwise. Ties go to the lowest index.
"""

from __future__ import annotations

import torch

from .device import uses_triton
from .topk_reference import check_topk_lse_args, topk_lse_reference
from .tuning import TopKLaunch


def topk_lse(
    logits: torch.Tensor, k: int, *, pdl: bool = False, launch: TopKLaunch = TopKLaunch()
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] any float dtype -> (vals fp32 [N, k] descending, ids int64 [N, k], lse fp32 [N]).
    `pdl`: launch the Triton kernels with programmatic dependent launch (kernels/pdl.py; sm_90+);
    `launch`: the split kernel's streaming (both: topk_lse_fused.topk_lse_triton)."""
    check_topk_lse_args(logits, k)
    if not uses_triton(logits):
        return topk_lse_reference(logits, k)
    from .topk_lse_fused import topk_lse_triton  # imports triton only when it runs

    return topk_lse_triton(logits, k, launch=launch, pdl=pdl)
