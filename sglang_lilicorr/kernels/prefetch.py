"""Weights into L2 ahead of their GEMM, in a kernel launched under PDL (kernels/pdl.py): a weight is constant, so its
programs fetch their slice before `griddepcontrol.wait` and the K loop reads L2. `prefetch_l2` (a hint changing no
value), `prefetch_rows_l2` (every line of some rows of a row-major weight). CUDA only (inline PTX)."""

from __future__ import annotations

import triton
import triton.language as tl

LINE_BYTES = tl.constexpr(128)


@triton.jit
def prefetch_l2(ptrs):
    """L2 prefetch of the line holding each pointer of `ptrs` (any shape), kept ahead of other lines."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def prefetch_rows_l2(w_ptr, rows, K, stride_w, LINES: tl.constexpr):
    """Prefetch rows `rows` [R] (in range) of a [N, K] weight with unit stride along K: R x LINES lines
    per step (R * LINES about one per thread), the last line of a row repeated past K."""
    line: tl.constexpr = LINE_BYTES * 8 // w_ptr.dtype.element_ty.primitive_bitwidth  # elements per line
    base = w_ptr + rows.to(tl.int64)[:, None] * stride_w  # [R, 1]
    cols = tl.arange(0, LINES)[None, :] * line  # [1, LINES]
    for k in range(0, K, LINES * line):
        prefetch_l2(base + tl.minimum(k + cols, K - 1))


def lines_per_row(block_n: int, num_warps: int) -> int:
    """LINES for prefetch_rows_l2 over block_n rows: about one line per thread of num_warps warps."""
    return triton.next_power_of_2(max(1, 32 * num_warps // block_n))
