"""The kernel launches of the served select path, traced on a CPU: does a change keep every kernel, in the same
order, with the same launch parameters?

  python -m benchmarks launch-trace --out trace.json [--geometry paper testbed] [--bs 1 2 4 5 8 9 16 32]

Builds head_bench's heads (paper: width 1024; testbed: width 256) in bf16 on the CPU and calls at each batch size
`select` (the LM head's GEMM, then `propose`: what the draft graph captures), `propose` (on given logits) and
`propose_given_candidates` (the candidates handed over as the plans' merge: the tensor-parallel path's head and walk;
on a tree from before `propose`, select_from_logits and select_from_candidates), with every Triton launch
recorded instead of run (kernel, grid, each argument: a tensor as its shape, dtype and strides, anything else as its
value), every F.linear (cuBLAS on a GPU) recorded by shapes, and the side stream's fork / join. Mode `h100` makes the
CPU look like an sm_90 card with 132 SMs to the select and the kernels' host code (PDL, side stream, TMA, one row per
program), so the trace is that of the served GPU path; mode `cpu` is the select as constructed on this machine (Triton
under the interpreter); mode `torch` its torch route (the head's own forward; top-K and walk the device's Triton
kernels). Nothing is computed: the outputs are garbage (integer ones zeros) and the run takes seconds. Two traces
from two commits must be equal. It also runs the select as it was before its plans (c745522: keyword flags,
`_SideStream`), the commit the plans were checked against: from a copy of that tree on PYTHONPATH (with kernels/ and
benchmarks/ linked under sglang_lilicorr/).
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import replace
import importlib
import json
import os
import pkgutil

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: kernels become InterpretedFunction

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

EVENTS: list = []


def summary(value):
    """A launch argument as JSON: tensors by shape, dtype and strides; named tuples as dicts."""
    if isinstance(value, torch.Tensor):
        return ["tensor", list(value.shape), str(value.dtype).removeprefix("torch."), list(value.stride())]
    if hasattr(value, "_asdict"):
        return {k: summary(v) for k, v in value._asdict().items()}
    if isinstance(value, (tuple, list)):
        return [summary(v) for v in value]
    if isinstance(value, dict):
        return {str(k): summary(v) for k, v in value.items()}
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, (int, bool, str)) or value is None:
        return value
    if hasattr(value, "value"):  # tl.constexpr
        return summary(value.value)
    return type(value).__name__


def record_launch(self, *args, grid, warmup, **kwargs):
    if warmup:
        return None
    named = dict(zip(self.arg_names, args))
    named.update(kwargs)
    EVENTS.append(["triton", self.fn.__name__, summary(grid), {k: summary(v) for k, v in sorted(named.items())}])
    for value in named.values():  # ids the kernel would write: zeros, so that what indexes by them runs on
        if isinstance(value, torch.Tensor) and not value.is_floating_point():
            value.zero_()
    return None


def fake_linear(x, weight, bias=None):
    EVENTS.append(["linear", summary(x), summary(weight), summary(bias)])
    return torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype, device=x.device)


class FakeSideStream:
    """The select's side stream, as events: fork, enter / exit, record, join."""

    def __init__(self, stream) -> None:
        EVENTS.append(["side", "fork"])
        self.events = 0

    def __enter__(self):
        EVENTS.append(["side", "enter"])
        return self

    def __exit__(self, *exc) -> None:
        EVENTS.append(["side", "exit"])

    def record(self):
        self.events += 1
        EVENTS.append(["side", "record", self.events])
        return self.events

    def join(self, event, *tensors) -> None:
        EVENTS.append(["side", "join", event, [summary(t) for t in tensors]])


def kernel_modules():
    import sglang_lilicorr.kernels as kernels

    return [importlib.import_module(f"{kernels.__name__}.{m.name}") for m in pkgutil.iter_modules(kernels.__path__)]


@contextlib.contextmanager
def patched(mode: str):
    """Launches and F.linear recorded; in mode h100 the kernels' device facts those of an sm_90 card."""
    saved = []
    kernels, selects = kernel_modules(), select_modules()  # imported before any patch: their imported names stay real

    def patch(owner, name, value):
        if hasattr(owner, name):
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

    patch(InterpretedFunction, "run", record_launch)
    patch(F, "linear", fake_linear)
    if mode == "h100":
        for module in kernels:
            patch(module, "sm_count", lambda device: 132)
            patch(module, "sm_major", lambda device: 9)
            patch(module, "check_pdl", lambda pdl, t, name: None)
            patch(module, "pdl_supported", lambda t: True)
            patch(module, "rows_per_program", lambda t: 1)
            patch(
                module,
                "_launch_tma",
                lambda name, x, weight, out, common: EVENTS.append(
                    ["tma", name, summary(x), summary(weight), summary(out), summary(common)]
                ),
            )
        patch(torch.cuda, "Stream", lambda device=None: "side stream")
        for owner in selects:
            patch(owner, "_SideStream", FakeSideStream)
            patch(owner, "SideStream", FakeSideStream)
            if hasattr(owner, "Device"):
                patch(owner.Device, "of", classmethod(lambda cls, t: cls(triton=True, cuda=True, pdl=True)))
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def select_modules():
    names = (
        "sglang_lilicorr.fast_path.select",
        "sglang_lilicorr.fast_path.plan",  # and the flat modules of older trees
        "sglang_lilicorr.fast_head",
        "sglang_lilicorr.select_plan",
    )
    found = []
    for name in names:
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            pass
    return found


def build(geometry: str, mode: str):
    from benchmarks.micro.head_bench import GEOMETRIES, build_ours

    try:
        from sglang_lilicorr.fast_path.select import FastLiLiCorrSelect
    except ImportError:  # an older tree (the reference commit)
        from sglang_lilicorr.fast_head import FastLiLiCorrSelect

    geo = GEOMETRIES[geometry]
    head = build_ours(geo, "cpu", torch.bfloat16)
    table = torch.zeros(geo.V, geo.H, dtype=torch.bfloat16)
    if mode == "torch":
        fast = FastLiLiCorrSelect(head, token_table=table, **pytorch_path(head))
    else:
        fast = FastLiLiCorrSelect(head, token_table=table)
    if mode == "h100" and hasattr(fast, "_can_pdl"):  # the select of the flags (before the plan): the device by hand
        fast._can_pdl, fast.overlap, fast._side = True, True, "side stream"
    return geo, fast


def attempt(call) -> None:
    """call(); an error is an event of the trace (the CPU cannot run every path: TMA needs CUDA)."""
    try:
        call()
    except (ValueError, RuntimeError) as e:
        EVENTS.append(["error", type(e).__name__, str(e)])


def pytorch_path(head) -> dict:
    """FastLiLiCorrSelect's arguments for the torch route with the device's top-K and walk kernels: plans of that
    route (in a plan of its own since the plan names those kernels), or (before the plans) fused=False."""
    try:
        from sglang_lilicorr.fast_path.plan import PYTORCH, HeadGeometry, SelectPlan, SelectPlans, plans_for
    except ImportError:
        return dict(fused=False)
    if "kernels" in SelectPlan.__dataclass_fields__:
        return dict(plans=SelectPlans.every(SelectPlan(route="torch")))
    return dict(plans=plans_for(HeadGeometry.of(head), PYTORCH))


def entry_points(fast, given: dict):
    """(propose, propose with the candidates given["candidates"] handed over) of this tree's select."""
    if not hasattr(fast, "propose"):  # a tree from before the one entry point
        return fast.select_from_logits, lambda logits, h, a: fast.select_from_candidates(*given["candidates"], h, a)
    merge = dict(merge=lambda _: given["candidates"])
    twin = type(fast)(fast.head, token_table=fast.token_table, plans=fast.plans.map(lambda p, _: replace(p, **merge)))
    return fast.propose, twin.propose


def trace(geometry: str, mode: str, bs_list) -> dict:
    out = {}
    with patched(mode):
        geo, fast = build(geometry, mode)
        given = {}
        propose, propose_given = entry_points(fast, given)
        lm_head = torch.zeros(1, 1, dtype=torch.bfloat16).expand(geo.V, geo.HM)
        for bs in bs_list:
            g = torch.Generator().manual_seed(bs)
            hidden = torch.randn(bs, geo.S, geo.HM, generator=g).to(torch.bfloat16)
            anchor = torch.randn(bs, geo.HM, generator=g).to(torch.bfloat16)
            EVENTS.clear()
            attempt(lambda: propose(F.linear(hidden.reshape(bs * geo.S, geo.HM), lm_head), hidden, anchor))
            out[f"{geometry} {mode} bs {bs} select"] = list(EVENTS)
            vals = torch.randn(bs, geo.S, geo.K).sort(-1, descending=True).values
            ids = torch.randint(0, geo.V, (bs, geo.S, geo.K))
            lse = vals[..., 0] + 1.0
            given["candidates"] = vals, ids, lse
            logits = torch.zeros(1, 1, dtype=torch.bfloat16).expand(bs * geo.S, geo.V)
            calls = {
                "propose_given_candidates": lambda: propose_given(logits, hidden, anchor),
                "propose": lambda: propose(logits, hidden, anchor),
            }
            for name, call in calls.items():
                EVENTS.clear()
                attempt(call)
                out[f"{geometry} {mode} bs {bs} {name}"] = list(EVENTS)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--geometry", nargs="+", default=["paper", "testbed"])
    ap.add_argument("--mode", nargs="+", default=["h100", "cpu", "torch"], choices=("h100", "cpu", "torch"))
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 2, 4, 5, 8, 9, 16, 32])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = {}
    for geometry in args.geometry:
        for mode in args.mode:
            result.update(trace(geometry, mode, args.bs))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=0)
    print(f"wrote {args.out}: {len(result)} traces, {sum(len(v) for v in result.values())} events")
    return 0
