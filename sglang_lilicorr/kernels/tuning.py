"""Every measured launch choice of the select path (imports nothing of ours): launch records (measured defaults), kernel
tables by operand shape, head tables by head width and batch size (fast_path/plan.py), naming card and commit."""

from __future__ import annotations

from typing import NamedTuple


class Measured(NamedTuple):
    """`value` for batches of at most `max_batch` requests (None: all; 0: none), measured on `card` at `commit`."""

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

    def tiles(self) -> dict:
        """The tile sizes as the GEMM kernels' constexprs."""
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k, GROUP_M=self.group_m)


GEMM_CONFIGS = {
    "skinny": GemmLaunch(64, 32, 128, 8, 4, 4),  # 128 programs at M = 120, N = 2048 (one wave on 132 SMs)
    # skinny's rows at K >= GEMM_WIDE_K: twice the programs, half the K steps
    "skinny_wide_k": GemmLaunch(64, 16, 256, 8, 3, 4),
    "small": GemmLaunch(64, 128, 64, 8, 4, 4),
    "medium": GemmLaunch(128, 128, 64, 8, 4, 8),
    "large": GemmLaunch(128, 256, 64, 8, 3, 8),
    "tma_large": GemmLaunch(128, 256, 64, 8, 3, 8, tma=True),
    "tma_medium": GemmLaunch(128, 128, 64, 8, 4, 8, tma=True),
    "tma_wide_k": GemmLaunch(128, 128, 128, 8, 3, 8, tma=True),
    "fp32": GemmLaunch(64, 64, 32, 8, 3, 4),  # fp32 inputs: exact IEEE FMA dots (tests, the fp32 path)
}

# (largest M of the row band, config for 16-bit inputs, whether the GEMM + SiLU beats cuBLAS + a SiLU pass there);
# the first band with M <= bound applies, None = unbounded. H200, b3b4862 (bf16, K = 1024, N = 2048; ms ours /
# cuBLAS + SiLU)
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


# --- top-K + logsumexp (kernels/topk_lse_fused.py) ------------------------------------------------------------


class TopKLaunch(NamedTuple):
    """How the split kernel streams the logits (sweep: `python -m benchmarks kernel-sweeps topk-lse`).
    H200 sweeps, 0f1922e and b16a836: block, num_warps, programs_per_sm, maxnreg."""

    block: int = 1024  # logits per tile (a power of two >= 16): 32 per thread of one warp = four 16-byte loads
    num_warps: int = 1  # one warp: every reduction is in-warp (shuffles, no barriers)
    programs_per_sm: int = 16  # the split grid aims at one wave of these per SM
    maxnreg: int | None = 128  # per thread (no spills on sm_90): 16 one-warp programs fit an SM's registers
    # logits per sub-tile, 128 bytes of bf16 (the chunk's end re-ranks the K best sub-tiles' K * group logits)
    group: int = 64
    collect_tiles: int = 8  # tiles at a chunk's start whose sub-tile maxima are ranked at once (a power of two)
    few_rows_tiles: int = 4  # the shortest run of tiles per split at N <= TOPK_FEW_ROWS (H100, 844aa57: 38 splits of
    # 4 tiles at the paper vocabulary, 17.6-17.9 us against 18.9-19.0 for 19)
    # bf16 logits: rank on int32 keys (H100, a195fbb: -1.5 us paper bs 1, -3.7 to -4.7 at bs >= 4)
    narrow_keys: bool = True


TOPK_MIN_TILES_PER_SPLIT = 8  # small N: fewer, longer splits keep the merge's input small (H200 sweep, e18033d) ...
TOPK_FEW_ROWS = 16  # ... but N <= 16 (one request's slots) takes runs of TopKLaunch.few_rows_tiles


# --- lattice cosine scores + walk (kernels/head_scores.py) ----------------------------------------------------


class CosineLaunch(NamedTuple):
    """H200 sweep, 0f1922e (`python -m benchmarks kernel-sweeps lattice-cosine --sweep`)."""

    block_d: int = 128  # D columns per step (a power of two)
    num_warps: int = 4
    num_stages: int = 3  # steps in flight (sm_90, bf16, 128 columns: 104 registers, 14 KiB shared)
    f32_dot: bool = False  # 16-bit operands converted to fp32 (TF32 dots) before tl.dot: not pipelined

    def step(self, d: int) -> int:
        """Columns per step of a factor with D columns: block_d, or D rounded up to a power of two (>= 16) if less."""
        return max(16, min(1 << max(d - 1, 0).bit_length(), self.block_d))


# --- confidence features + up projection (kernels/head_nodes.py) ---------------------------------------------


class ConfidenceLaunch(NamedTuple):
    """The kernel's first launch (aa070e5), not measured against others."""

    block_h: int = 256  # the most columns per program (a power of two)
    num_warps: int = 4


# --- lattice attention (kernels/lattice_attention.py) ---------------------------------------------------------

ATTENTION_BLOCK_M = 64  # query rows per program (one warpgroup: Hopper's wgmma tile is 64 rows per warpgroup) ...
ATTENTION_SMALL_BATCH, ATTENTION_SMALL_BATCH_BLOCK_M = 4, 32  # ... b <= 4: more, smaller programs (H200, c89afbe:
# 4.3 vs 5.2 us at b = 1) ...
ATTENTION_ONE_REQUEST_BLOCK_M = 16  # ... and b = 1: 16 rows (H100, 42cbb7f, against 32, 9 interleaved rounds: paper
# head -0.54 us, testbed -1.34; H200 -1.12 / -1.54; the same bits)


# --- head tables: head width -> Measured (fast_path/plan.py resolves them per batch size) -----------------------

# Programmatic dependent launch (kernels/pdl.py). H100, 6214b6b: the testbed head loses 4-5 us with it from bs 16.
PDL = {256: Measured(4, True, "H100", "6214b6b"), 1024: Measured(None, True, "H100", "6214b6b")}
# The folded route (fast_path/plan.py): every GEMM in Triton, the lattice's RMSNorms folded into the GEMMs that read
# them (five norm launches fewer), under PDL. H100, 0a138f1, post-logits folded / not, ms: paper bs 1 0.123 / 0.128,
# bs 4 0.185 / 0.157; testbed bs 1 0.070 / 0.077, bs 4 0.090 / 0.092, bs 16 0.160 / 0.128.
FOLD_NORMS = {256: Measured(4, True, "H100", "0a138f1"), 1024: Measured(1, True, "H100", "0a138f1")}
