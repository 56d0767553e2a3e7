"""Programmatic dependent launch (PDL, sm_90+): a kernel launched with `launch_pdl=True` may start while its predecessor
runs; its programs call `grid_dependency_wait(PDL)` first, reading only constants before. PDL=False: no-ops."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .device import pdl_supported


@triton.jit
def grid_dependency_wait(PDL: tl.constexpr):
    """Wait for the previous kernel on the stream, then release the next one (no-op without PDL)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def check_pdl(pdl: bool, t: torch.Tensor, name: str) -> None:
    """A clear error for pdl=True where the device cannot launch that way."""
    if pdl and not pdl_supported(t):
        raise ValueError(
            f"{name}: pdl=True needs a CUDA device of compute capability 9.0+ (Hopper), got {t.device}; pass pdl=False"
        )


def pdl_launch(pdl: bool, launch_pdl: bool | None = None) -> dict:
    """A kernel's PDL constexpr and launch option: with pdl it waits and releases its successor; launch_pdl=False
    launches it in full stream order all the same (None: launch_pdl = pdl)."""
    return {"PDL": pdl, "launch_pdl": pdl if launch_pdl is None else pdl and launch_pdl}
