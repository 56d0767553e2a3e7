"""Top-K candidates and the full-vocabulary logsumexp of logits rows (paper App. A: the
candidate pool of each drafted slot and its log-softmax scores).

`topk_lse_reference` is the PyTorch definition; `topk_lse` runs the fused Triton kernel
(`topk_lse_fused.py`) on CUDA tensors, or on CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1), and the reference otherwise. Ties go to the lowest index.
"""
from __future__ import annotations

import os

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


def uses_triton(t: torch.Tensor) -> bool:
    """Whether the Triton path serves tensors on t's device (CUDA, or CPU under the interpreter)."""
    return t.is_cuda or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def topk_lse(
    logits: torch.Tensor, k: int, *, pdl: bool = False, beside: bool = False, launch: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] any float dtype -> (vals fp32 [N, k] descending, ids int64 [N, k], lse fp32 [N]).
    `pdl`: launch the Triton kernels with programmatic dependent launch (kernels/pdl.py; sm_90+);
    `beside`: beside the kernel before it; `launch`: TopKLaunch fields to change from its defaults (all three:
    topk_lse_fused.topk_lse_triton)."""
    check_topk_lse_args(logits, k)
    if not uses_triton(logits):
        return topk_lse_reference(logits, k)
    from .topk_lse_fused import LAUNCH, topk_lse_triton  # imports triton only when it runs

    return topk_lse_triton(logits, k, launch=LAUNCH._replace(**(launch or {})), pdl=pdl, beside=beside)
