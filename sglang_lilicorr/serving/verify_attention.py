"""The attention of the target's verify pass: SGLang's split-KV verify kernel on its Triton backend, on CUDA.

SGLang's Triton backend runs a target verify (B = 16 query tokens a request) through its prefill kernel, one program
per (request, query head), each walking the whole prefix alone: 9 programs at c = 1 on SmolLM2-135M, 3.1 ms of a
4.2 ms verify on an H100 (benchmarks/PERF_NOTES.md, "Served speed"). The same backend carries a split-KV verify kernel
(`sglang.kernels.ops.attention.verify_splitkv`: the prefix split over programs, then merged), exact for a causal chain
of one candidate per position, which every DFlash verify is; SGLang switches it on only on AMD MI350
(`TritonAttnBackend.use_verify_splitkv`). It declines, per call, whatever it cannot serve (a sliding window, sinks,
a logit cap, MLA, ragged verify lengths), and the backend then runs its prefill kernel as before.

LILICORR_VERIFY_ATTENTION picks it for the target of a LILICORR server:
  auto      (default) split-KV where the target has at most SPLITKV_MAX_QUERY_HEADS query heads per GPU: few
            programs per request is where the prefill kernel leaves the GPU idle (measured: SmolLM2's 9 heads win
            at every length; Qwen3-8B's 32 lose below ~1k tokens, benchmarks/results/verify_attention_h100/);
  split-kv  split-KV on any target;
  extend    SGLang's prefill kernel, as SGLang runs it.
The worker applies it before the target-verify CUDA graphs are captured and says which in one start-up line.

The kernel merges per-split partial results, weighting a split with no keys (a prefix shorter than the splits) by
zero, but it reads that split's partial output from scratch memory allocated uninitialized: 0 x NaN is NaN, and
stale memory can hold NaN bit patterns. `zero_scratch` makes every scratch buffer start at zero (a split with keys
then always leaves finite values behind), which tests/test_serving_verify_attention.py shows is needed.
"""
from __future__ import annotations

import functools
import os

from . import ALGORITHM_NAME
from .draft_check import ServingConfigError

ENV = "LILICORR_VERIFY_ATTENTION"
AUTO, SPLIT_KV, EXTEND = "auto", "split-kv", "extend"
CHOICES = (AUTO, SPLIT_KV, EXTEND)
SPLITKV_MAX_QUERY_HEADS = 16  # auto: split-KV up to this many query heads per GPU


def choice() -> str:
    """LILICORR_VERIFY_ATTENTION, checked."""
    value = os.environ.get(ENV, AUTO)
    if value not in CHOICES:
        raise ServingConfigError(f"{ENV}={value!r} is not a verify attention: set it to one of {', '.join(CHOICES)}.")
    return value


def wanted(setting: str, query_heads: int) -> bool:
    """Whether `setting` asks for the split-KV kernel on a target with `query_heads` query heads per GPU."""
    return setting == SPLIT_KV or (setting == AUTO and query_heads <= SPLITKV_MAX_QUERY_HEADS)


def zero_scratch() -> None:
    """Make SGLang's split-KV verify scratch buffers start at zero (module docstring). Idempotent."""
    from sglang.kernels.ops.attention.verify_splitkv import VerifySplitKV

    alloc = VerifySplitKV._alloc
    if getattr(alloc, "lilicorr_zeroed", False):
        return

    @functools.wraps(alloc)
    def zeroed(self, max_bs):
        alloc(self, max_bs)
        self.att_out.zero_()

    zeroed.lilicorr_zeroed = True
    VerifySplitKV._alloc = zeroed


def configure(backends: list, query_heads: int, setting: str | None = None) -> str:
    """Switch the target's Triton attention backends (of `backends`, those the target runs) to the split-KV verify
    kernel where `setting` (default: the environment's) asks for it; the start-up line that says what the verify runs."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    setting = choice() if setting is None else setting
    prefix = f"{ALGORITHM_NAME}: target verify attention"
    if not wanted(setting, query_heads):
        return f"{prefix}: SGLang's prefill kernel ({ENV}={setting}, {query_heads} query heads per GPU)."
    triton = [b for b in backends if isinstance(b, TritonAttnBackend) and getattr(b, "topk", 1) == 1]
    if not triton:
        names = ", ".join(sorted({type(b).__name__ for b in backends})) or "none"
        return f"{prefix}: the backend's own ({names}; {ENV}={setting} applies to SGLang's Triton backend only)."
    zero_scratch()
    for backend in triton:
        backend.use_verify_splitkv = True
    return (f"{prefix}: SGLang's split-KV verify kernel ({ENV}={setting}, {query_heads} query heads per GPU; "
            f"{ENV}={EXTEND} runs SGLang's prefill kernel).")
