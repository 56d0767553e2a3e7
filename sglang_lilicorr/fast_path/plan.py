"""The select's plan: which route `FastLiLiCorrSelect` runs for a head at a batch size, with which launches.

  plan_for(geometry, batch, device) -> SelectPlan   kernels/tuning.py's tables, resolved for one batch size
  plans_for(geometry, device) -> SelectPlans        the plan of every batch-size bucket of a head, resolved once
                                                    (FastLiLiCorrSelect does so at construction)

Three routes (issue 41: one PyTorch reference route and two fused ones):
  torch     the trained head's own forward (LiLiCorrHead, the code training runs) on the token table's rows, with
            walk.py's decoders: the reference, and what runs where Triton does not (no CUDA, no interpreter).
  folded    small batches, where launch count dominates: every GEMM a Triton GEMM with its epilogue
            (kernels/gemm_epilogue.py), each lattice RMSNorm folded into the GEMM that reads its output (five norm
            launches fewer), under PDL. H100, 0a138f1, post-logits folded / unfolded (ms): paper head bs 1 0.123 /
            0.128, bs 4 0.185 / 0.157; testbed head bs 1 0.070 / 0.077, bs 4 0.090 / 0.092, bs 16 0.160 / 0.128:
            folded at bs <= 1 on the paper head (width 1024), bs <= 4 on the testbed head (256) (tuning.FOLD_NORMS).
  unfolded  larger batches: cuBLAS GEMMs (the FFN up + SiLU a Triton GEMM where tuning.GEMM_CONFIG_BY_ROWS prefers it:
            the persistent TMA kernel from 513 rows, version 10: bs 32 -8 us) between Triton kernels for the features,
            nodes, residual add + RMSNorm, the lattice attention and the cosine + walk.
The plan's other fields: pdl (programmatic dependent launch, sm_90+, -0.6 us per kernel boundary, pdl_chain; the
testbed head loses 4-5 us with it from bs 16: tuning.PDL) and overlap (the pass and anchor projections on a side
stream, CUDA). Why only these two fused routes: benchmarks/PERF_NOTES.md, "Routes".

A bucket is a range of batch sizes over which no table changes its answer: its bounds are the head tables' batch
bounds and the GEMM table's row bounds in whole requests of the head's lattice (S x K rows per request), so one plan
serves every batch of a bucket. Calls with fewer than S slots take the plan of their batch size. A head width
without an entry in a head table takes the entry of the nearest measured one (by ratio; a tie goes to the smaller).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

import torch

from ..kernels import tuning
from ..kernels.device import pdl_supported, uses_triton
from ..kernels.tuning import Measured

ROUTES = ("torch", "folded", "unfolded")


@dataclass(frozen=True)
class HeadGeometry:
    """The shapes a plan depends on."""

    width: int  # H
    factor_dim: int  # D
    slots: int  # S
    topk: int  # K
    dtype: torch.dtype

    @classmethod
    def of(cls, head) -> "HeadGeometry":
        cfg = head.config
        return cls(head.width, cfg.factor_dim, cfg.num_slots, cfg.candidate_topk, head.pass_hidden_proj.weight.dtype)

    @property
    def lattice_rows(self) -> int:
        """Lattice nodes per request (S x K): the rows of the head's GEMMs per request."""
        return self.slots * self.topk


@dataclass(frozen=True)
class Device:
    """What the select's device offers."""

    triton: bool  # Triton kernels run (CUDA, or the CPU under TRITON_INTERPRET=1)
    cuda: bool  # CUDA streams
    pdl: bool  # programmatic dependent launch (CUDA sm_90+)

    @classmethod
    def of(cls, t: torch.Tensor) -> "Device":
        return cls(uses_triton(t), t.is_cuda, pdl_supported(t))


PYTORCH = Device(triton=False, cuda=False, pdl=False)  # the PyTorch path on any device


@dataclass(frozen=True)
class SelectPlan:
    """How the select runs the calls of one batch-size bucket (module docstring). The default: the unfolded route,
    one launch per step in stream order."""

    route: str = "unfolded"  # ROUTES: torch (the head's own forward), folded, unfolded
    pdl: bool = False  # Triton kernels launched with programmatic dependent launch (CUDA sm_90+)
    overlap: bool = False  # the pass and anchor projections on a side stream (CUDA)

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise ValueError(f"SelectPlan: route={self.route!r} is none of {ROUTES}")
        if self.route == "torch" and (self.pdl or self.overlap):
            raise ValueError(
                "SelectPlan: pdl and overlap launch Triton kernels, but route='torch' runs the PyTorch path"
            )

    @property
    def fused(self) -> bool:
        """Triton kernels around the GEMMs (False: the head's PyTorch forward; the top-K and walk kernels still run)."""
        return self.route != "torch"

    def check(self, device: Device) -> None:
        """A clear error where this plan asks for what the device cannot do."""
        needs = {"fused": device.triton, "overlap": device.cuda, "pdl": device.pdl}
        missing = [name for name, ok in needs.items() if getattr(self, name) and not ok]
        if missing:
            raise ValueError(
                f"SelectPlan: {missing} need a device with {missing} (this one has {device}); plan for it "
                f"with plans_for(geometry, Device.of(tensor))"
            )


@dataclass(frozen=True)
class SelectPlans:
    """A head's plans by batch size: plans[i] serves batches up to bounds[i], the last plan every larger batch."""

    bounds: tuple
    plans: tuple

    @classmethod
    def every(cls, plan: SelectPlan) -> "SelectPlans":
        """One plan at every batch size."""
        return cls((), (plan,))

    def at(self, batch: int) -> SelectPlan:
        return self.plans[bisect_left(self.bounds, batch)]

    def buckets(self):
        """(largest batch size or None for the last bucket, plan) per bucket."""
        return zip((*self.bounds, None), self.plans)

    def map(self, change) -> "SelectPlans":
        """change(plan, largest batch size or None) -> the plan to use instead, bucket by bucket."""
        return SelectPlans(self.bounds, tuple(change(plan, bound) for bound, plan in self.buckets()))


def entry(table: dict, key: int) -> Measured:
    """The table's entry for `key` (a head width), else the nearest measured key's (by ratio, a tie to the smaller)."""
    if key in table:
        return table[key]
    return table[min(table, key=lambda k: (abs(math.log(k / key)), k))]


def _within(table: dict, key: int, batch: int):
    """The value of the table's entry for `key` where `batch` is within its bound, else None."""
    e = entry(table, key)
    return e.value if e.max_batch is None or batch <= e.max_batch else None


def plan_for(geometry: HeadGeometry, batch: int, device: Device) -> SelectPlan:
    """The plan of kernels/tuning.py's tables for `batch` requests of this head on this device (module docstring)."""
    if not device.triton:
        return SelectPlan(route="torch")
    pdl = device.pdl and bool(_within(tuning.PDL, geometry.width, batch))
    folded = pdl and bool(_within(tuning.FOLD_NORMS, geometry.width, batch))
    return SelectPlan(route="folded" if folded else "unfolded", pdl=pdl, overlap=device.cuda)


def batch_bounds(geometry: HeadGeometry) -> tuple:
    """The largest batch size of each bucket but the last: the head tables' bounds for this head, and the GEMM table's
    row bounds in whole requests."""
    bounds = {entry(table, geometry.width).max_batch for table in (tuning.PDL, tuning.FOLD_NORMS)}
    bounds.update(row[0] // geometry.lattice_rows for row in tuning.GEMM_CONFIG_BY_ROWS if row[0] is not None)
    return tuple(sorted(b for b in bounds if b))


def plans_for(geometry: HeadGeometry, device: Device) -> SelectPlans:
    """plan_for at every bucket of this head (batch_bounds), each resolved at the bucket's largest batch size."""
    bounds = batch_bounds(geometry)
    at = (*bounds, (bounds[-1] if bounds else 0) + 1)
    return SelectPlans(bounds, tuple(plan_for(geometry, b, device) for b in at))
