"""Compile census of the select path: the Triton kernels a server's draft-graph capture compiles, on a CPU.

Each distinct specialization key of a kernel is one compile on a cold Triton cache. Triton's key (runtime/jit.py):
the constexpr values, the launch options (num_warps, num_stages, maxnreg, launch_pdl, ...) and, per other argument,
its type with, unless do_not_specialize names it, whether an int is 1 (then a constexpr) or divisible by 16 and
whether a pointer is 16-byte aligned; `launch_key` computes it with Triton's own native_specialize_impl.

`census` runs `FastLiLiCorrSelect.select_from_logits` (what the draft graph captures, serving/proposer.py `propose`,
after the LM head's F.linear, whose output is given here as rows of one [b_max * S, V] buffer: the same shape,
dtype and alignment) at every batch size, on a head of random weights, under Triton's CPU interpreter with every
launch recorded and not run: the select's host side is static-shaped and reads no values (CUDA-graph safe), so its
launches do not depend on them. The device facts the plan and the launches read are an H100's (PDL, 132 SMs,
sm_90, one row per program). What stays the CPU's is the same at every batch size: the exact-fp32 dot constexprs,
and no side stream (on CUDA the first launch after each of its two joins is a launch_pdl=False twin).

  python -m sglang_lilicorr.benchmarks.compile_census [--geometry testbed|small] [--max-batch 32]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import os
from collections import defaultdict
from unittest import mock

if __name__ == "__main__":  # before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

H100_SMS = 132


@dataclasses.dataclass(frozen=True)
class Geometry:
    """A head and the target around it: LiLiCorrConfig fields, the target's hidden size and vocabulary."""

    config: dict
    model_hidden: int  # Hm
    vocab: int  # V


GEOMETRIES = {  # testbed: checkpoints/smollm2-lilicorr/config.json; small: tests/test_fast_head.py's SMALL head
    "testbed": Geometry(
        dict(block_size=16, candidate_topk=8, factor_dim=256, hidden_size=256, num_heads=4, num_layers=2), 576, 49152
    ),
    "small": Geometry(
        dict(block_size=6, candidate_topk=4, factor_dim=16, hidden_size=32, num_heads=4, num_layers=2), 24, 64
    ),
}


def launch_key(fn, args: tuple, kwargs: dict) -> tuple:
    """The specialization key of an interpreted kernel's launch fn[grid](*args, **kwargs): per parameter (name,
    Triton's type, its specialization: the constexpr value, 'D' for divisible by 16 / 16-byte aligned, '' or None),
    then the launch options as given."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    params = inspect.signature(fn.fn).parameters
    bound = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
    exempt = set(fn.kwargs.get("do_not_specialize") or ())
    key = []
    for i, (name, p) in enumerate(params.items()):
        value = bound.get(name, p.default)
        if "constexpr" in str(p.annotation):
            key.append((name, "constexpr", getattr(value, "value", value)))
        else:
            specialize = name not in exempt and i not in exempt
            key.append((name, *native_specialize_impl(BaseBackend, value, False, specialize, True)))
    return (*key, *sorted((k, repr(v)) for k, v in kwargs.items() if k not in params))


@contextlib.contextmanager
def recorded_launches():
    """Every interpreted kernel launch inside: recorded as (kernel name, launch_key) into the yielded list, not run."""
    from triton.runtime.interpreter import InterpretedFunction

    launches = []

    def record(self, *args, grid, warmup, **kwargs):
        if not warmup:
            launches.append((self.fn.__name__, launch_key(self, args, kwargs)))

    with mock.patch.object(InterpretedFunction, "run", record):
        yield launches


@contextlib.contextmanager
def as_h100():
    """The device facts the plan (fast_path/plan.py) and the kernels' launches read, set to an H100's."""
    from ..fast_path import plan
    from ..kernels import gemm_epilogue, head_nodes, head_norm, pdl, topk_lse_fused

    facts = [
        (plan, "pdl_supported", lambda t: True),
        (pdl, "pdl_supported", lambda t: True),
        (topk_lse_fused, "sm_count", lambda d: H100_SMS),
        (gemm_epilogue, "sm_count", lambda d: H100_SMS),
        (gemm_epilogue, "sm_major", lambda d: 9),
        (head_norm, "rows_per_program", lambda t: 1),
        (head_nodes, "rows_per_program", lambda t: 1),
    ]
    with contextlib.ExitStack() as stack:
        for module, name, fact in facts:
            stack.enter_context(mock.patch.object(module, name, fact))
        yield


def _select(geometry: Geometry, dtype: torch.dtype):
    """FastLiLiCorrSelect of a random head of this geometry, with a random token table."""
    from ..config import LiLiCorrConfig
    from ..fast_path.select import FastLiLiCorrSelect
    from ..head import LiLiCorrHead

    torch.manual_seed(0)
    head = LiLiCorrHead(LiLiCorrConfig(**geometry.config), model_hidden_size=geometry.model_hidden).to(dtype).eval()
    return FastLiLiCorrSelect(head, token_table=torch.randn(geometry.vocab, head.width, dtype=dtype))


def census(geometry: Geometry, batch_sizes, dtype: torch.dtype = torch.bfloat16) -> dict:
    """-> {kernel name: {specialization key: the first batch size that launched it}} over `batch_sizes`, as an
    H100 (as_h100) would compile them."""
    from triton.runtime.interpreter import InterpretedFunction

    from ..kernels import gemm_epilogue

    if not isinstance(gemm_epilogue._gemm_kernel, InterpretedFunction):
        raise RuntimeError(
            "compile_census: needs Triton's CPU interpreter (TRITON_INTERPRET=1 before triton is imported)"
        )
    keys: dict = defaultdict(dict)
    with as_h100(), mock.patch.dict(os.environ, TRITON_INTERPRET="1"):  # the select takes its Triton path on the CPU
        select = _select(geometry, dtype)
        s, hm = select.num_slots, geometry.model_hidden
        top = max(batch_sizes)
        logits = torch.empty((top * s, geometry.vocab), dtype=dtype)  # the LM head's output rows
        hidden, anchor = torch.randn(top, s, hm, dtype=dtype), torch.randn(top, hm, dtype=dtype)
        for b in batch_sizes:
            with recorded_launches() as launches:
                select.select_from_logits(logits[: b * s], hidden[:b], anchor[:b])
            for name, key in launches:
                keys[name].setdefault(key, b)
    return dict(keys)


def summary(keys: dict) -> dict:
    """census -> {kernel name: distinct keys}, with "total"."""
    counts = {name: len(k) for name, k in sorted(keys.items())}
    return counts | {"total": sum(counts.values())}


def first_seen(keys: dict, name: str) -> list:
    """The batch sizes at which kernel `name` met a key not seen at a smaller one."""
    return sorted(set(keys[name].values()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description="distinct Triton compiles of the select path over the captured batch sizes"
    )
    ap.add_argument("--geometry", choices=sorted(GEOMETRIES), default="testbed")
    ap.add_argument("--max-batch", type=int, default=32, help="batch sizes 1..this (SGLang's draft graphs: up to 32)")
    args = ap.parse_args(argv)
    keys = census(GEOMETRIES[args.geometry], range(1, args.max_batch + 1))
    for name, count in summary(keys).items():
        detail = "" if name == "total" else f"  new keys at bs {first_seen(keys, name)}"
        print(f"{name:32s} {count:3d}{detail}")


if __name__ == "__main__":
    main()
