"""Triton kernels of sglang-lilicorr (imports torch and triton only; triton on first use): the select path's top-K and
logsumexp (`topk_lse`, `topk_shards` across tensor-parallel ranks), lattice decoders, the lattice attention, GEMMs with
their epilogues and the head's fused row kernels. Each has its PyTorch reference; every measured launch is in
tuning.py. README.md in this folder lists them with their contracts."""

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
