"""Teacher-forced greedy losslessness check: one float32 (or float64) target pass over prompt + output; an emitted token
passes where max logit - its logit <= tol (default one bf16 ulp of the top logit: a near-tie serving precision cannot
order). Byte equality with a plain decode is no sound test (a verify pass and a decode round differently)."""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
from torch import nn


def bf16_ulp(x: float) -> float:
    """Spacing of bfloat16 numbers (8 significant bits) at |x|."""
    x = abs(float(x))
    return 2.0 ** (math.floor(math.log2(x)) - 7) if x > 0 else 2.0**-133


@dataclasses.dataclass
class Mismatch:
    position: int  # index into the output
    emitted: int
    argmax: int
    deficit: float  # top logit - emitted token's logit
    tol: float
    ulp: float  # one bf16 ulp of the top logit


@dataclasses.dataclass
class GreedyReport:
    num_tokens: int
    not_argmax: list[Mismatch]  # emitted tokens that are not the argmax (within tol or not)
    min_top2_gap: float  # smallest top-1 - top-2 logit gap over the output (inf if empty)
    min_gap_position: int

    @property
    def failures(self) -> list[Mismatch]:
        return [m for m in self.not_argmax if not m.deficit <= m.tol]  # a NaN reference certifies nothing

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        near = len(self.not_argmax) - len(self.failures)
        return (
            f"{'PASS' if self.ok else 'FAIL'}: {self.num_tokens} tokens, {len(self.failures)} not the target's greedy "
            f"choice, {near} near-ties within tol; "
            f"smallest top-2 gap {self.min_top2_gap:.4f} at {self.min_gap_position}"
        )


def teacher_forced_logits(model: nn.Module, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """[len(output_ids), V] float64 on the CPU: `model`'s logits (its dtype, no TF32) at each output position."""
    n, out = len(prompt_ids), list(output_ids)
    ids = torch.tensor([list(prompt_ids) + out], device=next(model.parameters()).device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            return model.eval()(input_ids=ids, use_cache=False).logits[0, n - 1 : n + len(out) - 1].double().cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def check_greedy(
    model: nn.Module,
    prompt_ids: list[int],
    output_ids: list[int],
    tol: float | None = None,
    dtype=torch.float32,
    tol_ulps: float = 1.0,
) -> GreedyReport:
    """Check output_ids by a teacher-forced `dtype` pass of `model`; tol: the deficit allowed (None: tol_ulps ulps)."""
    if not prompt_ids:
        raise ValueError("check_greedy: the prompt is empty; the first output token needs a context.")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"check_greedy: dtype must be torch.float32 or torch.float64, got {dtype}.")
    if not output_ids:
        return GreedyReport(0, [], math.inf, -1)
    ref = model if all(p.dtype == dtype for p in model.parameters()) else copy.deepcopy(model).to(dtype)
    out = list(output_ids)
    logits = teacher_forced_logits(ref, prompt_ids, out)
    top2 = logits.topk(2, dim=-1) if logits.shape[-1] > 1 else logits.topk(1, dim=-1)
    deficit = (top2.values[:, 0] - logits[torch.arange(len(out)), torch.tensor(out)]).tolist()
    gaps = (top2.values[:, 0] - top2.values[:, -1]).tolist()
    ulps = [bf16_ulp(v) for v in top2.values[:, 0].tolist()]
    bad = [
        Mismatch(k, t, int(top2.indices[k, 0]), deficit[k], tol_ulps * ulps[k] if tol is None else float(tol), ulps[k])
        for k, t in enumerate(out)
        if not deficit[k] <= 0  # NaN: not the argmax of a reference that has none
    ]
    k_min = min(range(len(gaps)), key=gaps.__getitem__)
    return GreedyReport(len(out), bad, gaps[k_min], k_min)
