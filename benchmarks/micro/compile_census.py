"""Compile census of the select path: the Triton kernels a server's draft-graph capture compiles, on a CPU.

Each distinct specialization key of a kernel is one compile on a cold Triton cache. Triton's key (runtime/jit.py):
the constexpr values, the launch options (num_warps, num_stages, maxnreg, launch_pdl, ...) and, per other argument,
its type with, unless do_not_specialize names it, whether an int is 1 (then a constexpr) or divisible by 16 and
whether a pointer is 16-byte aligned; `launch_key` computes it with Triton's own native_specialize_impl.

`census` runs `FastLiLiCorrSelect.propose` (what the draft graph captures, serving/proposer.py `propose`,
after the LM head's F.linear, whose output is given here as rows of one [b_max * S, V] buffer: the same shape,
dtype and alignment) at every batch size, on a head of random weights, under Triton's CPU interpreter with every
launch recorded and not run: the select's host side is static-shaped and reads no values (CUDA-graph safe), so its
launches do not depend on them. The device facts the plan and the launches read are an H100's (PDL, 132 SMs,
sm_90, one row per program). What stays the CPU's is the same at every batch size: the exact-fp32 dot constexprs,
and no side stream (on CUDA the first launch after each of its two joins is a launch_pdl=False twin).

`--compile-threads N` then compiles those keys for sm_90 on this machine (no GPU needed; the keys as a CUDA launch
makes them: `cuda_key`), each pass in a fresh process on a cold Triton cache, serially and on N threads, in a few
alternated rounds (a shared machine's load moves single runs), and prints the best of each: what
fast_path/precompile.py's concurrent pass gains at a server's start-up on N cores.
PYTHONPATH=<venv>/device-triton times the GPU image's Triton.

  python -m benchmarks compile-census [--geometry testbed|small] [--max-batch 32]
      [--compile-threads N [--compile-rounds 3]]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from unittest import mock

import torch

from .. import lab_env

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
    from sglang_lilicorr.fast_path import plan
    from sglang_lilicorr.kernels import gemm_epilogue, head_nodes, head_norm, pdl, topk_lse_fused

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
    from sglang_lilicorr.config import LiLiCorrConfig
    from sglang_lilicorr.fast_path.select import FastLiLiCorrSelect
    from sglang_lilicorr.head import LiLiCorrHead

    torch.manual_seed(0)
    head = LiLiCorrHead(LiLiCorrConfig(**geometry.config), model_hidden_size=geometry.model_hidden).to(dtype).eval()
    return FastLiLiCorrSelect(head, token_table=torch.randn(geometry.vocab, head.width, dtype=dtype))


def census(geometry: Geometry, batch_sizes, dtype: torch.dtype = torch.bfloat16) -> dict:
    """-> {kernel name: {specialization key: the first batch size that launched it}} over `batch_sizes`, as an
    H100 (as_h100) would compile them."""
    from triton.runtime.interpreter import InterpretedFunction

    from sglang_lilicorr.kernels import gemm_epilogue

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
                select.propose(logits[: b * s], hidden[:b], anchor[:b])
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


def cuda_key(name: str, key: tuple) -> tuple:
    """A census key as a CUDA launch of the same 16-bit select makes it: the CPU's exact-fp32 dot choices (the GEMM's
    IEEE_F32, the attention's IEEE and F32_DOT, the cosine kernel's F32_DOT, PRECISION and its unpipelined num_stages)
    set to what the kernels' hosts pick on a GPU."""
    from sglang_lilicorr.kernels.tuning import CosineLaunch

    params = {f[0]: f for f in key if len(f) == 3}
    gpu = {}
    if name == "_gemm_kernel" and params["x_ptr"][1] != "*fp32":
        gpu = {"IEEE_F32": False}
    elif name == "_lattice_attention_kernel" and params["qkv_ptr"][1] != "*fp32":
        gpu = {"IEEE": False, "F32_DOT": False}
    elif name == "_lattice_cosine_kernel" and params["edge_ptr"][1] != "*fp32":
        gpu = {"F32_DOT": False, "PRECISION": "tf32", "num_stages": repr(CosineLaunch().num_stages)}
    return tuple(
        (f[0], f[1], gpu[f[0]]) if len(f) == 3 and f[0] in gpu else (f[0], gpu[f[0]]) if f[0] in gpu else f for f in key
    )


def _jit_kernels() -> dict:
    """Every @triton.jit kernel of the select path's kernel modules by its function's name."""
    from sglang_lilicorr.kernels import (
        gemm_epilogue,
        head_nodes,
        head_norm,
        head_scores,
        lattice_attention,
        topk_lse_fused,
        walk,
    )

    found = {}
    for module in (gemm_epilogue, head_nodes, head_norm, head_scores, lattice_attention, topk_lse_fused, walk):
        for value in vars(module).values():
            fn = getattr(value, "fn", None)
            if callable(fn) and hasattr(value, "arg_names"):
                found.setdefault(fn.__name__, value)
    return found


def compile_sm90(entries: list, threads: int) -> float:
    """Compiles the census keys `entries` ([kernel name, key] each) for sm_90 with Triton (in compiled mode) ->
    wall seconds: one after another, or on a pool of `threads`."""
    from concurrent.futures import ThreadPoolExecutor

    import triton
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    target, fns, jobs = GPUTarget("cuda", 90, 32), _jit_kernels(), []
    for name, key in entries:
        fields = [f for f in key if len(f) == 3]
        signature = {f[0]: f[1] for f in fields}
        constexprs = {(i,): f[2] for i, f in enumerate(fields) if f[1] == "constexpr"}
        attrs = {(i,): BaseBackend.parse_attr(f[2]) for i, f in enumerate(fields) if f[1] != "constexpr" and f[2]}
        options = {f[0]: ast.literal_eval(f[1]) for f in key if len(f) == 2}
        jobs.append((ASTSource(fns[name], signature, constexprs, attrs), options))
    start = time.perf_counter()
    if threads <= 1:
        for source, options in jobs:
            triton.compile(source, target=target, options=options)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(lambda job: triton.compile(job[0], target=target, options=job[1]), jobs))
    return time.perf_counter() - start


def compile_timing(keys: dict, threads: int, rounds: int = 3) -> dict:
    """census -> {"kernels", "triton", "threads", "serial_s", "threaded_s"}: the wall seconds of compile_sm90 of every
    key (cuda_key), serially and on `threads`, each pass in a fresh process (no TRITON_INTERPRET) on its own cold
    Triton cache; `rounds` rounds alternating the two, each time the list of every round's seconds."""
    entries = [[name, cuda_key(name, key)] for name, by_key in keys.items() for key in by_key]
    env = lab_env({k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    out = {"kernels": len(entries), "threads": threads, "serial_s": [], "threaded_s": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "keys.json")
        with open(path, "w") as f:
            json.dump(entries, f)
        for _ in range(rounds):
            for label, n in (("serial_s", 1), ("threaded_s", threads)):
                script = (
                    "import json, triton\n"
                    "from benchmarks.micro.compile_census import compile_sm90\n"
                    f"entries = [[n, tuple(tuple(f) for f in k)] for n, k in json.load(open({path!r}))]\n"
                    f"print(json.dumps([triton.__version__, compile_sm90(entries, {n})]))\n"
                )
                cache = tempfile.mkdtemp(dir=tmp)
                run = subprocess.run(
                    [sys.executable, "-c", script],
                    env=env | {"TRITON_CACHE_DIR": cache},
                    capture_output=True,
                    text=True,
                )
                if run.returncode:
                    raise RuntimeError(f"compile_census: the sm_90 compile failed:\n{run.stderr[-3000:]}")
                out["triton"], seconds = json.loads(run.stdout.strip().splitlines()[-1])
                out[label].append(seconds)
    return out


def main(argv=None) -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before a kernel module is imported: the census's CPU interpreter
    ap = argparse.ArgumentParser(
        description="distinct Triton compiles of the select path over the captured batch sizes",
    )
    ap.add_argument("--geometry", choices=sorted(GEOMETRIES), default="testbed")
    ap.add_argument("--max-batch", type=int, default=32, help="batch sizes 1..this (SGLang's draft graphs: up to 32)")
    ap.add_argument(
        "--compile-threads",
        type=int,
        default=0,
        help="then compile the keys for sm_90 serially and on this many threads, and print both times",
    )
    ap.add_argument("--compile-rounds", type=int, default=3, help="rounds of the two compile passes, alternated")
    args = ap.parse_args(argv)
    keys = census(GEOMETRIES[args.geometry], range(1, args.max_batch + 1))
    for name, count in summary(keys).items():
        detail = "" if name == "total" else f"  new keys at bs {first_seen(keys, name)}"
        print(f"{name:32s} {count:3d}{detail}")
    if args.compile_threads:
        t = compile_timing(keys, args.compile_threads, args.compile_rounds)
        serial, threaded = min(t["serial_s"]), min(t["threaded_s"])
        print(
            f"sm_90 compile of {t['kernels']} kernels (Triton {t['triton']}, cold cache, {os.cpu_count()} CPUs), best "
            f"of {len(t['serial_s'])}: serial {serial:.1f} s, {t['threads']} threads {threaded:.1f} s "
            f"({serial / threaded:.2f}x); every round: serial {' '.join(f'{x:.1f}' for x in t['serial_s'])}, "
            f"threaded {' '.join(f'{x:.1f}' for x in t['threaded_s'])}"
        )
