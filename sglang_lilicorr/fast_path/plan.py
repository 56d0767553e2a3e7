"""The select's plan per batch-size bucket of a head, from kernels/tuning.py's tables: candidates (whole vocabulary or
the TP `merge`), top-K and walk as Triton or PyTorch, the `walk` rule, and the head's `route`: torch, folded (Triton
GEMMs, lattice norms folded in, under PDL) or unfolded (cuBLAS GEMMs between Triton kernels). A bucket is a batch range
over which no table changes its answer; a missing head width takes the nearest one."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels import tuning
from ..kernels.device import pdl_supported, uses_triton
from ..kernels.tuning import Measured
from ..walk import WALKS

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


# logits [N, n] of this rank's n vocabulary columns -> the whole vocabulary's (vals fp32 [N, K], ids [N, K], lse [N])
Merge = Callable[[torch.Tensor], tuple]


@dataclass(frozen=True)
class SelectPlan:
    """How the pipeline runs one batch-size bucket's calls; the default: unfolded, stream order, greedy, no merge."""

    route: str = "unfolded"  # ROUTES: torch (the head's own forward), folded, unfolded
    pdl: bool = False  # Triton kernels launched with programmatic dependent launch (CUDA sm_90+)
    overlap: bool = False  # the pass and anchor projections on a side stream (CUDA)
    kernels: bool = True  # top-K/LSE and the walk as Triton kernels (False: kernels/topk_reference.py, walk.py)
    walk: str = "greedy"  # walk.WALKS: the rule that commits the block
    merge: Merge | None = None  # tensor parallelism: this rank's candidates merged over its group (vocab_parallel.py)

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise ValueError(f"SelectPlan: route={self.route!r} is none of {ROUTES}")
        if self.walk not in WALKS:
            raise ValueError(f"SelectPlan: walk={self.walk!r} is not a decode rule; choose one of {', '.join(WALKS)}.")
        if self.route == "torch" and (self.pdl or self.overlap):
            raise ValueError(
                "SelectPlan: pdl and overlap launch Triton kernels, but route='torch' runs the PyTorch path"
            )
        if self.fused and not self.kernels:
            raise ValueError(
                f"SelectPlan: route={self.route!r} runs Triton kernels; kernels=False is the torch route's"
            )

    @property
    def fused(self) -> bool:
        """Triton kernels around the GEMMs (False: the head's PyTorch forward)."""
        return self.route != "torch"

    def check(self, device: Device) -> None:
        """A clear error where this plan asks for what the device cannot do."""
        needs = {"kernels": device.triton, "overlap": device.cuda, "pdl": device.pdl}
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


def plan_for(
    geometry: HeadGeometry, batch: int, device: Device, *, walk: str = "greedy", merge: Merge | None = None
) -> SelectPlan:
    """The plan of kernels/tuning.py's tables for `batch` requests of this head on this device."""
    if not device.triton:
        return SelectPlan(route="torch", kernels=False, walk=walk, merge=merge)
    pdl = device.pdl and bool(_within(tuning.PDL, geometry.width, batch))
    folded = pdl and bool(_within(tuning.FOLD_NORMS, geometry.width, batch))
    return SelectPlan(route="folded" if folded else "unfolded", pdl=pdl, overlap=device.cuda, walk=walk, merge=merge)


def torch_plan(device: Device, walk: str = "greedy") -> SelectPlan:
    """The torch route (top-K and walk in Triton where the device runs them): the reference decoder's, training's."""
    return SelectPlan(route="torch", kernels=device.triton, walk=walk)


def batch_bounds(geometry: HeadGeometry) -> tuple:
    """The largest batch size of each bucket but the last (head tables' bounds, GEMM row bounds in requests)."""
    bounds = {entry(table, geometry.width).max_batch for table in (tuning.PDL, tuning.FOLD_NORMS)}
    bounds.update(row[0] // geometry.lattice_rows for row in tuning.GEMM_CONFIG_BY_ROWS if row[0] is not None)
    return tuple(sorted(b for b in bounds if b))


def plans_for(
    geometry: HeadGeometry, device: Device, *, walk: str = "greedy", merge: Merge | None = None
) -> SelectPlans:
    """plan_for at every bucket of this head (batch_bounds), each resolved at the bucket's largest batch size."""
    bounds = batch_bounds(geometry)
    at = (*bounds, (bounds[-1] if bounds else 0) + 1)
    return SelectPlans(bounds, tuple(plan_for(geometry, b, device, walk=walk, merge=merge) for b in at))
