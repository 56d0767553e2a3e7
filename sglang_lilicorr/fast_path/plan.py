"""The select's plan: which kernels `FastLiLiCorrSelect` runs for a head at a batch size, with which launches.

  plan_for(geometry, batch, device) -> SelectPlan   kernels/tuning.py's tables, resolved for one batch size
  plans_for(geometry, device) -> SelectPlans        the plan of every batch-size bucket of a head, resolved once
                                                    (FastLiLiCorrSelect does so at construction)

A bucket is a range of batch sizes over which no table changes its answer: its bounds are the tables' batch bounds
and the GEMM tables' row bounds in whole requests of the head's lattice (S x K rows per request), so one plan serves
every batch of a bucket. Calls with fewer than S slots take the plan of their batch size.

How the tables resolve (plan_for), for a head of width H at batch size b on a device:
  fused            Triton runs there (CUDA, or the CPU interpreter); else the PyTorch path, and nothing below but the
                   top-K launch applies
  overlap          on CUDA: the pass and anchor projections on a side stream
  pdl              sm_90+, and b within PDL
  triton_gemms     with PDL and b within TRITON_GEMMS: that entry's GEMM roles; the FFN up also wherever its GEMM +
                   SiLU beats cuBLAS at b * S * K rows (tuning.GEMM_CONFIG_BY_ROWS)
  fold_norms       with PDL and b within FOLD_NORMS
  norm_epilogue    not folded, where tuning.NORM_CONFIG_BY_SHAPE prefers the GEMM + norm kernel at [b * S * K, H]
  pass_beside_topk with the folded norms and b within PASS_BESIDE_TOPK; nodes_in_gemm with it
  release_early    with PDL and b within RELEASE_EARLY
  merge_in_confidence, cosine_split (by D), attention_block_m: b within their tables
  tiles            16-bit heads only: GEMM_TILES where the norms fold, PASS_TILES where the pass runs beside the top-K
  topk_launch      TopKLaunch() with TOPK_SPLIT_LAUNCH's fields where b is within it
Unmeasured geometry: a table without an entry for the head's width (the cosine split: for D) takes the entry of the
nearest measured one (by ratio; a tie goes to the smaller), bounds in batch sizes as they stand; what the shapes
cannot hold is left out: a cosine split that does not cut D into whole steps is 1.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field

import torch

from ..kernels import tuning
from ..kernels.device import pdl_supported, uses_triton
from ..kernels.tuning import ALL_GEMMS, GEMM_CONFIGS, CosineLaunch, Measured, TopKLaunch

GEMM_ROLES = ("pass", "nodes", *ALL_GEMMS)  # roles a launch config can be set for (kernels/tuning.py)


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
    """How the select runs the calls of one batch-size bucket (module docstring). The defaults are the plain
    Triton path: one launch per step, cuBLAS GEMMs, kernels at their own default launches."""

    fused: bool = True  # Triton kernels around the GEMMs (False: PyTorch ops; the top-K and walk kernels still run)
    overlap: bool = False  # the pass and anchor projections on a side stream (CUDA)
    pdl: bool = False  # Triton kernels launched with programmatic dependent launch (CUDA sm_90+)
    triton_gemms: frozenset = frozenset()  # GEMM roles (tuning.ALL_GEMMS) run as Triton GEMMs with their epilogues
    norm_epilogue: bool = False  # unfolded: the nodes and each residual add + RMSNorm in kernels/linear_norm.py's GEMM
    fold_norms: bool = False  # the lattice as Triton GEMMs, each RMSNorm inside the GEMM that reads its output
    pass_beside_topk: bool = False  # the pass projection as a Triton GEMM that the top-K split runs beside
    nodes_in_gemm: bool = False  # ... and the node assembly as the feature down GEMM's epilogue (folded norms)
    release_early: bool = False  # the confidence kernel releases the next kernel at its start
    merge_in_confidence: bool = False  # select_from_logits: the top-K's merge inside the confidence kernel
    prefetch_weights: bool = True  # Triton GEMMs launched early fetch their weight into L2 before their wait
    tiles: dict = field(default_factory=dict)  # GEMM role (GEMM_ROLES) -> tuning.GEMM_CONFIGS name; absent: by M
    topk_launch: TopKLaunch = TopKLaunch()
    cosine_split: int = 1  # programs per factor of the cosine + walk kernel
    attention_block_m: int | None = None  # query rows per lattice-attention program; None: the kernel's default

    def __post_init__(self) -> None:
        object.__setattr__(self, "triton_gemms", frozenset(self.triton_gemms))
        problems = []
        if not self.fused:
            on = [name for name in ("overlap", "pdl", "triton_gemms", "norm_epilogue", "fold_norms", "pass_beside_topk",
                                    "release_early", "merge_in_confidence", "tiles", "attention_block_m")
                  if getattr(self, name)] + (["cosine_split"] if self.cosine_split != 1 else [])
            if on:
                problems.append(f"{on} set Triton kernels, but fused=False runs the PyTorch path")
        if self.fold_norms and self.norm_epilogue:
            problems.append("fold_norms and norm_epilogue both take the lattice's norms; pick one")
        if self.pass_beside_topk and not self.pdl:
            problems.append("pass_beside_topk runs the top-K beside the pass projection under PDL; it needs pdl")
        if self.nodes_in_gemm and not (self.pass_beside_topk and self.fold_norms):
            problems.append("nodes_in_gemm takes the pass projection made beside the top-K into the folded feature GEMM; "
                            "it needs pass_beside_topk and fold_norms")
        if self.release_early and not self.pdl:
            problems.append("release_early releases the next kernel of a PDL chain; it needs pdl")
        if not self.triton_gemms <= set(ALL_GEMMS):
            problems.append(f"triton_gemms {sorted(self.triton_gemms - set(ALL_GEMMS))} are no GEMM roles {ALL_GEMMS}")
        for role, config in self.tiles.items():
            if role not in GEMM_ROLES or config not in GEMM_CONFIGS:
                problems.append(f"tiles {role!r}: {config!r} needs a role of {GEMM_ROLES} and a config of {sorted(GEMM_CONFIGS)}")
        if not isinstance(self.cosine_split, int) or self.cosine_split < 1:
            problems.append(f"cosine_split={self.cosine_split!r} must be a positive int")
        m = self.attention_block_m
        if m is not None and (m < 16 or m & (m - 1)):
            problems.append(f"attention_block_m={m!r} must be a power of two >= 16, or None")
        if problems:
            raise ValueError("SelectPlan: " + "; ".join(problems))

    def check(self, geometry: HeadGeometry, device: Device) -> None:
        """A clear error where this plan asks for what the head or the device cannot do."""
        needs = {"fused": device.triton, "overlap": device.cuda, "pdl": device.pdl}
        missing = [name for name, ok in needs.items() if getattr(self, name) and not ok]
        if missing:
            raise ValueError(f"SelectPlan: {missing} need a device with {missing} (this one has {device}); plan for it "
                             f"with plans_for(geometry, Device.of(tensor))")
        if self.tiles and geometry.dtype == torch.float32:
            raise ValueError(f"SelectPlan: tiles {self.tiles} set 16-bit GEMM configs; an fp32 head keeps the fp32 config")
        launch = CosineLaunch(split=self.cosine_split)
        if not launch.cuts(geometry.factor_dim):
            raise ValueError(f"SelectPlan: cosine_split={self.cosine_split} does not cut D = {geometry.factor_dim} into "
                             f"whole {launch.step(geometry.factor_dim)}-column steps; pick a divisor of their number")


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
    """The table's entry for `key` (a head width, or D), else the nearest measured key's (by ratio, a tie to the smaller)."""
    if key in table:
        return table[key]
    return table[min(table, key=lambda k: (abs(math.log(k / key)), k))]


def _within(table: dict, key: int, batch: int):
    """The value of the table's entry for `key` where `batch` is within its bound, else None."""
    e = entry(table, key)
    return e.value if e.max_batch is None or batch <= e.max_batch else None


def plan_for(geometry: HeadGeometry, batch: int, device: Device) -> SelectPlan:
    """The plan of kernels/tuning.py's tables for `batch` requests of this head on this device (module docstring)."""
    h, rows = geometry.width, batch * geometry.lattice_rows
    topk_fields = _within(tuning.TOPK_SPLIT_LAUNCH, h, batch) or {}
    if not device.triton:
        return SelectPlan(fused=False, topk_launch=TopKLaunch(**topk_fields))
    pdl = device.pdl and bool(_within(tuning.PDL, h, batch))
    roles = set(_within(tuning.TRITON_GEMMS, h, batch) or ()) if pdl else set()
    if tuning.gemm_band(rows)[2]:
        roles.add("ffn_up")
    fold = pdl and bool(_within(tuning.FOLD_NORMS, h, batch))
    beside = fold and bool(_within(tuning.PASS_BESIDE_TOPK, h, batch))
    sixteen_bit = geometry.dtype != torch.float32
    tiles = dict(_within(tuning.GEMM_TILES, h, batch) or {}) if fold and sixteen_bit else {}
    pass_tiles = _within(tuning.PASS_TILES, h, batch) if beside and sixteen_bit else None
    if pass_tiles:
        tiles["pass"] = pass_tiles
    split = _within(tuning.COSINE_SPLIT, geometry.factor_dim, batch) or 1
    return SelectPlan(
        fused=True, overlap=device.cuda, pdl=pdl, triton_gemms=frozenset(roles), fold_norms=fold,
        norm_epilogue=not fold and tuning.norm_band(h, rows)[3], pass_beside_topk=beside, nodes_in_gemm=beside,
        release_early=pdl and bool(_within(tuning.RELEASE_EARLY, h, batch)),
        merge_in_confidence=bool(_within(tuning.MERGE_IN_CONFIDENCE, h, batch)), tiles=tiles,
        topk_launch=TopKLaunch(**topk_fields),
        cosine_split=split if CosineLaunch(split=split).cuts(geometry.factor_dim) else 1,
        attention_block_m=_within(tuning.ATTENTION_ROWS, h, batch),
    )


def batch_bounds(geometry: HeadGeometry) -> tuple:
    """The largest batch size of each bucket but the last: the head tables' bounds for this head, and the GEMM tables'
    row bounds in whole requests."""
    head_tables = (tuning.PDL, tuning.TRITON_GEMMS, tuning.FOLD_NORMS, tuning.PASS_BESIDE_TOPK, tuning.RELEASE_EARLY,
                   tuning.GEMM_TILES, tuning.PASS_TILES, tuning.TOPK_SPLIT_LAUNCH, tuning.MERGE_IN_CONFIDENCE,
                   tuning.ATTENTION_ROWS)
    bounds = {entry(table, geometry.width).max_batch for table in head_tables}
    bounds.add(entry(tuning.COSINE_SPLIT, geometry.factor_dim).max_batch)
    row_bounds = [row[0] for row in tuning.GEMM_CONFIG_BY_ROWS] + [row[1] for row in tuning.NORM_CONFIG_BY_SHAPE]
    bounds.update(rows // geometry.lattice_rows for rows in row_bounds if rows is not None)
    return tuple(sorted(b for b in bounds if b))


def plans_for(geometry: HeadGeometry, device: Device) -> SelectPlans:
    """plan_for at every bucket of this head (batch_bounds), each resolved at the bucket's largest batch size."""
    bounds = batch_bounds(geometry)
    at = (*bounds, (bounds[-1] if bounds else 0) + 1)
    return SelectPlans(bounds, tuple(plan_for(geometry, b, device) for b in at))

