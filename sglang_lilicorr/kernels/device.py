"""Facts about the device a kernel launches on, looked up once per device."""

from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 elsewhere (Triton's CPU interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def sm_major(device: torch.device) -> int:
    """Compute capability major version of a CUDA device (9 = Hopper); 0 elsewhere."""
    return torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 0


def rows_per_program(t: torch.Tensor) -> int:
    """Rows of a row kernel per program: one on a GPU, many under the CPU interpreter (cost per program)."""
    return 1 if t.is_cuda else 16


def uses_triton(t: torch.Tensor) -> bool:
    """Whether the Triton path serves tensors on t's device (CUDA, or CPU under the interpreter)."""
    return t.is_cuda or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def pdl_supported(t: torch.Tensor) -> bool:
    """Whether kernels on t's device can be launched with PDL: CUDA sm_90+ (not the interpreter)."""
    return t.is_cuda and sm_major(t.device) >= 9
