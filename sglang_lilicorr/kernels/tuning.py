"""Every measured launch choice of the select path, in one module.

  launch records   the parameters of a kernel's launch (GemmLaunch, NormLaunch, TopKLaunch, CosineLaunch,
                   ConfidenceLaunch), with the measured defaults the kernels take when a caller passes none;
  kernel tables    a kernel's launch by the shape of its operands (GEMM rows, output width, batch size);
  head tables      what the select path does per head width and batch size, resolved into one plan per
                   batch-size bucket by sglang_lilicorr/fast_path/plan.py (`plan_for`).

Each measured value names the card and the commit that measured it (a `Measured` entry, or a comment);
benchmarks/PERF_NOTES.md has the numbers. A head table maps the head width (the cosine split: the factor
dimension D, which it cuts) to one `Measured` entry; fast_path/plan.py says what a width without an entry
takes. This module imports nothing of ours, so every kernel module and the select's plan can read it.
"""
from __future__ import annotations

from typing import NamedTuple


class Measured(NamedTuple):
    """`value` for batches of at most `max_batch` requests (None: every batch size; 0: none), measured on `card`
    at `commit`."""

    max_batch: int | None
    value: object
    card: str
    commit: str


# --- GEMMs with epilogues (kernels/gemm_epilogue.py) ---------------------------------------------------------


class GemmLaunch(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_stages: int
    num_warps: int
    tma: bool = False  # persistent TMA kernel: one program per SM, tiles by TMA descriptors (sm_90+)


GEMM_CONFIGS = {
    "skinny": GemmLaunch(64, 32, 128, 8, 4, 4),  # 128 programs at M = 120, N = 2048 (one wave on 132 SMs)
    "skinny_wide_k": GemmLaunch(64, 16, 256, 8, 3, 4),  # skinny's rows at K >= GEMM_WIDE_K: twice the programs, half the K steps
    "narrow": GemmLaunch(64, 16, 128, 8, 4, 4),  # skinny's rows and K steps, twice the programs (GEMM_TILES)
    "thin": GemmLaunch(16, 16, 256, 8, 4, 4),  # M <= 16 (one request's slots: PASS_TILES), mma.sync tiles
    "small": GemmLaunch(64, 128, 64, 8, 4, 4),
    "medium": GemmLaunch(128, 128, 64, 8, 4, 8),
    "large": GemmLaunch(128, 256, 64, 8, 3, 8),
    "tma_large": GemmLaunch(128, 256, 64, 8, 3, 8, tma=True),
    "tma_medium": GemmLaunch(128, 128, 64, 8, 4, 8, tma=True),
    "tma_wide_k": GemmLaunch(128, 128, 128, 8, 3, 8, tma=True),
    "fp32": GemmLaunch(64, 64, 32, 8, 3, 4),  # fp32 inputs: exact IEEE FMA dots (tests, the fp32 path)
}

# (largest M of the row band, config for 16-bit inputs, whether the GEMM + SiLU beats cuBLAS + a SiLU pass there);
# the first band with M <= bound applies, None = unbounded. H200, b3b4862 (bf16, K = 1024, N = 2048; ms ours / cuBLAS + SiLU)
GEMM_CONFIG_BY_ROWS = (
    (128, "skinny", True),  # M = 120: 0.0096 / 0.0116
    (512, "small", False),  # M = 480: 0.0134 / 0.0130
    (1024, "tma_medium", True),  # M = 960: 0.0149 / 0.0167
    (None, "tma_large", True),  # M = 1920: 0.0208 / 0.0239; M = 3840: 0.0351 / 0.0381
)
# From this K on, a band's config gives way to its wide-K twin. H100, b5e0e29: K = 2048 at M = 120 in chains of 16
# GEMMs with PDL, 6.98 us against skinny's 7.31.
GEMM_WIDE_K, GEMM_WIDE_K_CONFIG = 2048, {"skinny": "skinny_wide_k"}
# Tile elements up to which a GEMM's epilogue operands load before its K loop (H100 6e5c3c1, H200 3d9d1cf: -5 to -7 us
# at bs 1; a larger tile would spill them).
EARLY_OPERANDS_MAX_TILE = 2048


def gemm_band(m: int) -> tuple:
    """The row of GEMM_CONFIG_BY_ROWS for a GEMM of M rows."""
    return next(row for row in GEMM_CONFIG_BY_ROWS if row[0] is None or m <= row[0])


# --- GEMM + residual add + RMSNorm epilogue (kernels/linear_norm.py) -------------------------------------------


class NormLaunch(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int


NORM_CONFIGS = {
    "row16": NormLaunch(16, 256, 64, 3, 4),  # whole rows of width <= 256 (the testbed head)
    "row32": NormLaunch(32, 256, 64, 3, 4),
    "row64": NormLaunch(64, 256, 64, 3, 8),
    "split64x32": NormLaunch(64, 32, 128, 4, 4),  # rows split over column tiles (width 1024)
    "split64x64": NormLaunch(64, 64, 64, 4, 4),
    "split128x64": NormLaunch(128, 64, 64, 4, 8),
    "fp32": NormLaunch(16, 32, 32, 2, 4),  # fp32 inputs: exact IEEE FMA dots
}

# (largest N, largest M, config, whether the fused kernel beats cuBLAS + add_rmsnorm_triton there); the first row
# with N <= n_bound and M <= m_bound applies, None = unbounded. H100, 1002219 (bf16; speed-up, K = N / 2N)
NORM_CONFIG_BY_SHAPE = (
    (256, 480, "row16", False),  # M = 120: 1.00 / 0.86; M = 480: 1.03 / 0.89
    (256, None, "row16", True),  # M = 1920: 1.14 / 1.00; M = 3840: 1.21 / 1.08
    (None, None, "row64", False),  # width 1024: 0.37-0.79 at every M (GEMM tiles that cover whole rows
)  # or a fix-up over split rows lose more to cuBLAS than the saved launch)


def norm_band(n: int, m: int) -> tuple:
    """The row of NORM_CONFIG_BY_SHAPE for an [M, N] output."""
    return next(r for r in NORM_CONFIG_BY_SHAPE if (r[0] is None or n <= r[0]) and (r[1] is None or m <= r[1]))


# --- top-K + logsumexp (kernels/topk_lse_fused.py) ------------------------------------------------------------


class TopKLaunch(NamedTuple):
    """How the split kernel streams the logits (sweep: `python -m sglang_lilicorr.kernels.topk_lse_fused`).
    H200 sweeps, 0f1922e and b16a836: block, num_warps, programs_per_sm, maxnreg."""

    block: int = 1024  # logits per tile (a power of two >= 16): 32 per thread of one warp = four 16-byte loads
    num_warps: int = 1  # one warp: every reduction is in-warp (shuffles, no barriers)
    programs_per_sm: int = 16  # the split grid aims at one wave of these per SM
    maxnreg: int | None = 128  # per thread (no spills on sm_90): 16 one-warp programs fit an SM's registers
    group: int = 64  # logits per sub-tile, 128 bytes of bf16 (the chunk's end re-ranks the K best sub-tiles' K * group logits)
    collect_tiles: int = 8  # tiles at a chunk's start whose sub-tile maxima are ranked at once (a power of two)
    few_rows_tiles: int = 4  # the shortest run of tiles per split at N <= TOPK_FEW_ROWS (H100, 844aa57: 38 splits of
    # 4 tiles at the paper vocabulary, 17.6-17.9 us against 18.9-19.0 for 19)
    narrow_keys: bool = True  # bf16 logits: rank on int32 keys (H100, a195fbb: -1.5 us paper bs 1, -3.7 to -4.7 at bs >= 4)


TOPK_MIN_TILES_PER_SPLIT = 8  # small N: fewer, longer splits keep the merge's input small (H200 sweep, e18033d) ...
TOPK_FEW_ROWS = 16  # ... but N <= 16 (one request's slots) takes runs of TopKLaunch.few_rows_tiles


# --- lattice cosine scores + walk (kernels/head_scores.py) ----------------------------------------------------


class CosineLaunch(NamedTuple):
    """H200 sweep, 0f1922e (`python -m sglang_lilicorr.kernels.head_scores --sweep`)."""

    block_d: int = 128  # D columns per step (a power of two)
    num_warps: int = 4
    num_stages: int = 3  # steps in flight (sm_90, bf16, 128 columns: 104 registers, 14 KiB shared)
    f32_dot: bool = False  # 16-bit operands converted to fp32 (TF32 dots) before tl.dot: not pipelined
    split: int = 1  # programs per factor, each over D / split columns; > 1: the walk's launch only (counters per factor)

    def step(self, d: int) -> int:
        """Columns per step of a factor with D columns: block_d, or D rounded up to a power of two (>= 16) if smaller."""
        return max(16, min(1 << max(d - 1, 0).bit_length(), self.block_d))

    def cuts(self, d: int) -> bool:
        """Whether `split` programs per factor cut D into whole steps (split 1 always does)."""
        return self.split == 1 or d % (self.split * self.step(d)) == 0


# --- confidence features + up projection (kernels/head_nodes.py) ---------------------------------------------


class ConfidenceLaunch(NamedTuple):
    """The kernel's first launch (aa070e5), not measured against others; the merge's below is."""

    block_h: int = 256  # the most columns per program (a power of two)
    num_warps: int = 4


# With the top-K's merge inside (parts=): one warp, whose reductions over the partials' keys stay in-warp, on 128
# columns (H100, 7b9f8da: testbed head bs 1 -0.6 us against 256 columns on 4 warps, paper head -0.2).
CONFIDENCE_MERGE_LAUNCH = ConfidenceLaunch(block_h=128, num_warps=1)


# --- lattice attention (kernels/lattice_attention.py) ---------------------------------------------------------

ATTENTION_BLOCK_M = 64  # query rows per program (one warpgroup: Hopper's wgmma tile is 64 rows per warpgroup) ...
ATTENTION_SMALL_BATCH, ATTENTION_SMALL_BATCH_BLOCK_M = 4, 32  # ... b <= 4: more, smaller programs (H200, c89afbe:
# 4.3 vs 5.2 us at b = 1)


# --- head tables: head width -> Measured (fast_path/plan.py resolves them per batch size) -----------------------
# Roles of the select's GEMMs: pass (pass_hidden_proj, beside the top-K), nodes (the feature down GEMM with the node
# assembly in its epilogue), feature_down (without it), per lattice layer qkv / out_proj / ffn_up / ffn_down, factor
# (factor_input_proj with its per-request bias + SiLU), out_in (out_head | in_head).
ALL_GEMMS = ("feature_down", "qkv", "out_proj", "ffn_up", "ffn_down", "factor", "out_in")

# Programmatic dependent launch (kernels/pdl.py). H100, 6214b6b: the testbed head loses 4-5 us with it from bs 16.
PDL = {256: Measured(4, True, "H100", "6214b6b"), 1024: Measured(None, True, "H100", "6214b6b")}
# The GEMMs that run as Triton GEMMs with their epilogues (with PDL) instead of cuBLAS. The paper head at bs 1 (H100,
# 503dd1f, in chains of 16 with PDL): 1024 -> 1024 4.85 us against cuBLAS 5.56 and 1024 -> 2048 5.4 against 5.75;
# cuBLAS keeps the QKV (6.35 vs 6.81) and the K = 2048 FFN down (6.87 vs 6.98); the factor GEMM runs there too, its
# bias + SiLU epilogue saving a launch. The testbed head: every GEMM up to bs 4 (H100, 6214b6b).
TRITON_GEMMS = {
    256: Measured(4, ALL_GEMMS, "H100", "6214b6b"),
    1024: Measured(1, ("feature_down", "out_proj", "ffn_up", "factor", "out_in"), "H100", "503dd1f"),
}
# The lattice's RMSNorms folded into the Triton GEMMs that read them (five norm launches fewer). H100, 0a138f1,
# post-logits folded / not, ms: paper bs 1 0.123 / 0.128, bs 4 0.185 / 0.157; testbed bs 1 0.070 / 0.077, bs 4
# 0.090 / 0.092, bs 16 0.160 / 0.128.
FOLD_NORMS = {256: Measured(4, True, "H100", "0a138f1"), 1024: Measured(1, True, "H100", "0a138f1")}
# select_from_logits runs the pass projection beside the top-K, with the node assembly in the feature down GEMM (folded
# norms only). H100, 6e5c3c1, post-logits beside / not, ms: paper bs 1 0.1062 / 0.1084, testbed 0.0578 / 0.0588
# (H200, 3d9d1cf: 0.1026 / 0.1041, 0.0574 / 0.0582); at bs 4 it loses on both cards and heads (+1.3 to +1.9 us).
PASS_BESIDE_TOPK = {256: Measured(1, True, "H100", "6e5c3c1"), 1024: Measured(1, True, "H100", "6e5c3c1")}
# The confidence kernel releases the feature GEMM at its start (kernels/pdl.py). H100, ce4f6ab: paper bs 1 -1.0 us,
# testbed +-0.2 us.
RELEASE_EARLY = {256: Measured(1, True, "H100", "ce4f6ab"), 1024: Measured(1, True, "H100", "ce4f6ab")}
# GEMM role -> launch config where it differs from the config by M. H100, adfb6d8, bs 1, in-call medians of 7
# interleaved rounds against "skinny": paper head -1.5 us with the nodes and out|in GEMMs narrow (qkv, out_proj and
# ffn_down lose 1.7-5.7 us narrow), testbed -1.7 us (nodes, out_proj, ffn_up, factor); the same bits.
GEMM_TILES = {
    1024: Measured(1, {"nodes": "narrow", "out_in": "narrow"}, "H100", "adfb6d8"),
    256: Measured(1, {"nodes": "narrow", "out_proj": "narrow", "ffn_up": "narrow", "factor": "narrow"}, "H100", "adfb6d8"),
}
# The pass projection beside the top-K in 16-row tiles (its M is one request's slots). H100, 7b9f8da: paper head -0.8
# to -1.1 us alone, -1.95 with TOPK_SPLIT_LAUNCH; on the testbed head (K = 576) the same tiles measured +0.3 to +10 us.
PASS_TILES = {1024: Measured(1, "thin", "H100", "7b9f8da"), 256: Measured(0, "thin", "H100", "7b9f8da")}
# Factor dimension D -> programs per factor of the cosine + walk kernel (each sums D / split columns; the factor's last
# program adds the parts). H100, 59d1f9c: paper head (D = 1024, 8 steps of 128 columns) -2.05 us in-call over 8
# programs; the testbed head (D = 256, two steps) loses 0.7-1.6 us split.
COSINE_SPLIT = {1024: Measured(1, 8, "H100", "59d1f9c"), 256: Measured(0, 2, "H100", "59d1f9c")}
# TopKLaunch fields of the top-K split (H100, 7b9f8da, medians of 9 interleaved rounds, the same bits): sub-tiles of
# 32 logits (the chunk's end re-ranks 256 logits, not 512) and the first 4 tiles ranked at once (a chunk at bs 1 is
# 3-4 tiles); on the testbed's vocabulary chunks of 3 tiles (16 splits, not 12).
TOPK_SPLIT_LAUNCH = {
    1024: Measured(1, dict(group=32, collect_tiles=4), "H100", "7b9f8da"),
    256: Measured(1, dict(group=32, collect_tiles=4, few_rows_tiles=3), "H100", "7b9f8da"),
}
# select_from_logits merges the top-K's partials in the confidence kernel (one launch fewer). H100, 7b9f8da: testbed
# -2.5 us with its TOPK_SPLIT_LAUNCH (-1.6 without); the paper head loses 0.5 us with it.
MERGE_IN_CONFIDENCE = {256: Measured(1, True, "H100", "7b9f8da"), 1024: Measured(0, True, "H100", "7b9f8da")}
# Query rows per lattice-attention program, in place of the kernel's default by batch size. H100, 42cbb7f, 16 rows
# against 32, 9 interleaved rounds: paper -0.54 us, testbed -1.34 (H200: -1.12 / -1.54); the same bits.
ATTENTION_ROWS = {1024: Measured(1, 16, "H100", "42cbb7f"), 256: Measured(1, 16, "H100", "42cbb7f")}
