"""Triton kernels of sglang-lilicorr (imports torch and triton only; triton on first use).

- topk_lse(logits [N, V], k) -> (vals fp32 [N, k], ids int64 [N, k], lse fp32 [N]):
  fused top-K + full-vocabulary logsumexp; Triton on CUDA, PyTorch reference elsewhere.
- topk_shards.shard_partials / merge_partials: the same over a vocabulary split among tensor-parallel ranks (each
  rank's partials, one all-gather, an exact merge).
- greedy_walk_triton / viterbi_triton(start [b, K], pair [b, S-1, K, K][, ids [b, S, K]]) -> idx (or ids) [b, S] int64:
  the decoders of sglang_lilicorr.walk, one program per request.
- lattice_attention_triton(qkv [b*L, 3H], bias [heads, L, L], heads) -> out [b*L, H]:
  the lattice transformer's self-attention on the packed QKV GEMM output (replaces SDPA).
- gemm_epilogue_triton(x [M, K], weight [N, K], bias [N] | None, ...) -> [M, N]: a GEMM with its epilogue in one
  launch (bias, SiLU, per-request bias, pre-norm, residual add, node assembly); linear_silu_triton is the lattice
  FFN's up projection with bias + SiLU.
Their launches come from kernels/tuning.py, which holds every measured launch table. See README.md in this folder
for launch geometry and references.
"""

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
