"""Triton kernels (triton imported on first use), each with its PyTorch reference; README.md lists them."""

from .device import uses_triton
from .topk_lse import topk_lse
from .topk_reference import MAX_TOPK, topk_lse_reference

_TRITON_ONLY = {
    "topk_lse_triton": "topk_lse_fused",
    "greedy_walk_triton": "walk",
    "viterbi_triton": "walk",
    "lattice_attention_triton": "lattice_attention",
    "gemm_epilogue_triton": "gemm_epilogue",
    "linear_silu_triton": "gemm_epilogue",
}

__all__ = ["MAX_TOPK", "topk_lse", "topk_lse_reference", "uses_triton", *_TRITON_ONLY]


def __getattr__(name: str):
    """Import the Triton modules lazily, so importing the package does not import triton."""
    if name not in _TRITON_ONLY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_TRITON_ONLY[name]}", __name__), name)
