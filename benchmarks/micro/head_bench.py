"""Serving select path, ours (`FastLiLiCorrSelect`) against SGLang 0.5.23's built-in LiLiCorr head,
side by side in one process on one GPU, with the same weights and inputs.

  python3 -m benchmarks head-bench --out $OUT/head_bench.json
  python3 -m benchmarks head-bench --plot results/X.json    (any machine: X.png beside it)

`--geometry testbed` times the shipped SmolLM2 draft's head instead (width 256, 4 heads, d_e 256,
hidden 576, vocabulary 49152; the targets are the paper config's). Paper config: block 16 (S = 15 slots), K = 8,
head width 1024, 2 layers, 8 heads, FFN 2048, d_e 1024, target hidden 4096, vocabulary 151936, bf16; random weights.
Per block, at each bs, ms per call (median of triton.testing.do_bench over CUDA-graph replay):

  topk_lse     [bs*S, V] logits -> top-K + logsumexp: ours (Triton), built-in, torch (topk + logsumexp)
  head_walk    candidates -> draft ids: ours (table gather + head + walk, the candidates handed over as its plan's
               merge) per variant; built-in
               select_with_proposal (greedy) on pre-gathered token embeddings
  post_logits  logits -> draft ids (top-K/LSE + head + walk): the issue's target
  select       hidden -> draft ids, LM-head matmul included
  floor_dense_chain  the head's GEMMs + SDPA alone (dense_chain): the floor of one launch per GEMM
  floor_dense_chain_pdl  the critical path's GEMMs + attention alone, Triton with PDL (dense_chain_pdl)
  floor_launches     as many empty kernels as post_logits_fused launches, back to back (launch_chain)

Per-stage split (variant fused, each stage captured and replayed alone): lm_head, topk_lse,
projections (pass + anchor GEMMs), nodes (features + node assembly), lattice (2 layers),
factors (fusion + out|in GEMMs + cosines with the walk). Kernel launches per call (torch.profiler, CUDA
activity, one eager call) for post_logits of each variant and the built-in and for each stage,
with the fused variant's and the built-in's kernels by GPU time (the SDPA backend shows up here).

Our variants (VARIANTS: each builds the select's plans, sglang_lilicorr/fast_path/plan.py, from the served ones):
torch (the head's PyTorch forward on the precomputed buffers), fused (the unfolded route: Triton kernels around cuBLAS
GEMMs, no side stream, no PDL), fused_overlap (+ the side stream for the pass / anchor projections),
fused_overlap_pdl (+ PDL at every bs), served (the plans of kernels/tuning.py: what the server runs; its plan per bs
is written to the JSON), served_unfolded / served_folded (served on the unfolded / folded route at every bs), and with
--compile, compiled (torch.compile of the PyTorch variant). Checks in the same run: each variant's select
against the reference (the select on the PyTorch plan: LiLiCorrHead.forward + walk.greedy_walk): candidate ids
equal, log-probs close, score error, draft ids equal wherever the reference has no near-tie; graph replay equals
eager; agreement with the built-in's draft ids (information). Every section is try/except-printed.
Writes JSON (card, date, git commit, rows, checks) to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
import traceback

import torch
import torch.nn.functional as F

from sglang_lilicorr.fast_path.pipeline import walk
from sglang_lilicorr.fast_path.plan import PYTORCH, Device, HeadGeometry, plans_for

from . import head_bench_floors as floors
from .head_bench_report import TARGET_BS1_MS, TARGET_RATIO, failed_checks, log, plot, report


@dataclasses.dataclass(frozen=True)
class Geometry:
    S: int = 15  # drafted slots (block 16)
    K: int = 8
    HM: int = 4096  # target / drafter hidden
    H: int = 1024  # head width
    V: int = 151936
    layers: int = 2
    heads: int = 8
    d: int = 1024  # factor width d_e


PAPER = Geometry()
TESTBED = Geometry(HM=576, H=256, V=49152, heads=4, d=256)  # the shipped SmolLM2-135M draft's head (checkpoints/)
GEOMETRIES = {"paper": PAPER, "testbed": TESTBED}
SMOKE = Geometry(S=5, K=4, HM=64, H=32, V=512, layers=2, heads=4, d=16)  # --smoke: a CPU dry run of this script


def _every(**changes):
    """A variant: the served plans with `changes` at every batch size."""
    return lambda geo, device: plans_for(geo, device).map(lambda plan, bound: dataclasses.replace(plan, **changes))


def _on(**device):
    """A variant: the plans of kernels/tuning.py for a device with these capabilities."""
    return lambda geo, _: plans_for(geo, Device(**device))


VARIANTS = {  # ours: name -> (HeadGeometry, Device) -> SelectPlans
    "torch": _every(route="torch", pdl=False, overlap=False),  # the head's forward; top-K and walk as served
    "fused": _on(triton=True, cuda=False, pdl=False),
    "fused_overlap": _on(triton=True, cuda=True, pdl=False),
    "fused_overlap_pdl": _every(route="unfolded", pdl=True),
    "served": plans_for,  # what the server runs
    "served_unfolded": _every(route="unfolded"),
    "served_folded": _every(route="folded"),
}


def plan_json(plan) -> dict:
    """A SelectPlan as JSON values."""
    return dataclasses.asdict(plan)


def build_variant(name: str, head, table):
    """FastLiLiCorrSelect with the plans of VARIANTS[name] for this head on its device."""
    from sglang_lilicorr.fast_path.select import FastLiLiCorrSelect

    plans = VARIANTS[name](HeadGeometry.of(head), Device.of(head.pass_hidden_proj.weight))
    return FastLiLiCorrSelect(head, token_table=table, plans=plans)


def attempt(errors: dict, name: str, fn):
    """Run one section; on failure print and record the traceback and return None."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (one failing section must not lose the others)
        log(f"!! {name} failed: {type(e).__name__}: {e}")
        traceback.print_exc()
        errors[name] = f"{type(e).__name__}: {e}"
        return None


# --- setup -----------------------------------------------------------------------------------


def git_commit() -> str | None:
    """HEAD of the checkout this runs from (or the working directory), else $GIT_COMMIT."""
    for where in (os.path.dirname(os.path.abspath(__file__)), os.getcwd()):
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return os.environ.get("GIT_COMMIT")


def build_ours(geo, device, dtype, seed=0):
    from sglang_lilicorr.config import LiLiCorrConfig
    from sglang_lilicorr.head import LiLiCorrHead

    torch.manual_seed(seed)
    cfg = LiLiCorrConfig(
        block_size=geo.S + 1,
        candidate_topk=geo.K,
        factor_dim=geo.d,
        hidden_size=geo.H,
        num_heads=geo.heads,
        num_layers=geo.layers,
    )
    head = LiLiCorrHead(cfg, model_hidden_size=geo.HM)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # trained-like scales: unit-variance activations, non-trivial norms and biases
        for name, p in head.named_parameters():
            if p.dim() >= 2 and "embedding" not in name:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=g)
            elif name.endswith("norm.weight"):
                p.normal_(1.0, 0.1, generator=g)
            elif "slot_bias" in name:
                p.normal_(0.0, 0.5, generator=g)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return head.to(device=device, dtype=dtype).eval()


def build_builtin(ours, device, dtype):
    """SGLang's LiLiCorrHead with our head's weights (the checkpoint names are the same)."""
    from sglang.srt.models.lilicorr import LiLiCorrHead as BuiltinHead
    from sglang.srt.speculative.lilicorr_utils import LiLiCorrConfig as BuiltinConfig

    cfg = ours.config
    theirs = BuiltinHead(
        model_hidden_size=ours.model_hidden_size,
        block_size=cfg.block_size,
        rms_norm_eps=cfg.rms_norm_eps,
        config=BuiltinConfig(**{name: getattr(cfg, name) for name in cfg.SERIALISED}),
    )
    theirs.load_state_dict({k: v.float().cpu() for k, v in ours.state_dict().items()}, strict=True)
    theirs = theirs.to(device=device, dtype=dtype).eval()
    theirs.materialize_inference_buffers(torch.device(device), dtype)
    return theirs


def make_inputs(geo, bs, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(1000 + bs + seed)
    hidden = torch.randn(bs, geo.S, geo.HM, generator=g).to(device, dtype)
    anchor = torch.randn(bs, geo.HM, generator=g).to(device, dtype)
    return hidden, anchor


# --- timing ----------------------------------------------------------------------------------


def time_graph(fn, rep_ms):
    """(median ms of CUDA-graph replay, the captured outputs); on CPU (--smoke) one eager call."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1e3, out
    from benchmarks.micro.graph_timing import graph_ms

    return graph_ms(fn, rep_ms)


def kernel_profile(fn, reps=3):
    """Kernels of one eager call (torch.profiler, CUDA activity, averaged over reps):
    (launches per call, [(kernel name, launches per call, GPU us per call)] by time); None on CPU."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n, us = kernels.get(e.name, (0, 0.0))
            kernels[e.name] = (n + 1, us + e.time_range.elapsed_us())
    table = sorted(((name[:90], n / reps, us / reps) for name, (n, us) in kernels.items()), key=lambda r: -r[2])
    return sum(n for _, n, _ in table), table


# --- the run: set up once, then per batch size the named sections below ---------------------------------------------


@dataclasses.dataclass
class Bench:
    """What every section of a run shares: the geometry, the device, our head with its token table and LM head, our
    variants and the built-in head (None where it failed to build), and the result being written."""

    args: argparse.Namespace
    geo: Geometry
    dev: str
    dtype: torch.dtype
    head: torch.nn.Module
    table: torch.Tensor
    lm_head: torch.Tensor
    variants: dict
    head_walks: dict  # each variant's twin whose plans take the bs's candidates as their merge: head + walk alone
    reference: object  # the select on the PyTorch plan
    given: dict  # the bs's candidates, handed to the twins
    builtin: object
    res: dict


@dataclasses.dataclass
class Batch:
    """One batch size's inputs and row: its logits and top-K candidates, the reference select's outputs, and how a
    section times a call (`time`: median ms of graph replay, recorded under its name) or counts its kernels."""

    bench: Bench
    bs: int
    row: dict
    launches: dict
    hidden: torch.Tensor
    anchor: torch.Tensor
    logits: torch.Tensor
    candidates: tuple  # (vals, ids, lse) of our top-K, [bs, S, K] and [bs, S]
    ref: tuple | None

    def time(self, name: str, fn, key: str | None = None):
        """(ms, outputs) of fn, its ms in the row under `key` (default: name); None where it failed."""
        out = attempt(self.bench.res["errors"], f"bs{self.bs}_{name}", lambda: time_graph(fn, self.bench.args.rep_ms))
        self.row[key or name] = out and out[0]
        return out

    def count(self, name: str, fn, keep_kernels: bool = False) -> None:
        prof = attempt(self.bench.res["errors"], f"bs{self.bs}_launches_{name}", lambda: kernel_profile(fn))
        if prof is not None:
            self.launches[name] = prof[0]
            if keep_kernels:
                self.bench.res["kernels"][f"bs{self.bs}_{name}"] = prof[1]


def setup(args) -> Bench:
    """The run's metadata, our head (random trained-like weights), its variants and the built-in head."""
    import triton

    from sglang_lilicorr.fast_path.select import FastLiLiCorrSelect

    geo = SMOKE if args.smoke else GEOMETRIES[args.geometry]
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    res = {
        "meta": dict(
            gpu=torch.cuda.get_device_name(0) if cuda else "cpu (--smoke dry run)",
            sms=torch.cuda.get_device_properties(0).multi_processor_count if cuda else None,
            torch=torch.__version__,
            triton=triton.__version__,
            cuda=torch.version.cuda,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            git_commit=git_commit(),
            geometry="smoke" if args.smoke else args.geometry,
            config=dict(dataclasses.asdict(geo), ffn=2 * geo.H, dtype=str(dtype)),
            bs=args.bs,
            rep_ms=args.rep_ms,
        ),
        "rows": [],
        "checks": {},
        "errors": {},
        "launches": {},
        "kernels": {},
    }
    errors = res["errors"]
    log("meta:", json.dumps(res["meta"]))
    head = build_ours(geo, dev, dtype)
    g = torch.Generator(device="cpu").manual_seed(7)
    embed = torch.randn(geo.V, geo.HM, generator=g).to(dev, dtype)
    table = head.token_table(embed)
    del embed
    lm_head = (torch.randn(geo.V, geo.HM, generator=g) * 0.02).to(dev, dtype)

    variants = {}
    for name in VARIANTS:
        if name in args.variants:
            variants[name] = attempt(errors, f"build_{name}", lambda name=name: build_variant(name, head, table))
    if "served" in variants and variants["served"] is not None:  # the plan the server runs at each bs
        res["plans"] = {f"bs{bs}": plan_json(variants["served"].plan(bs)) for bs in args.bs}
    if args.compile:

        def compiled():
            fast = build_variant("torch", head, table)
            fast._head_forward = torch.compile(fast._head_forward, dynamic=False)
            return fast

        variants["compiled"] = attempt(errors, "build_compiled", compiled)
    variants = {k: v for k, v in variants.items() if v is not None}
    given = {}

    def handed_over(fast):
        merge = dict(merge=lambda _: given["candidates"])
        twin = FastLiLiCorrSelect(
            head, token_table=table, plans=fast.plans.map(lambda p, _: dataclasses.replace(p, **merge))
        )
        twin._head_forward = fast._head_forward  # the same torch route (compiled where fast's is)
        return twin

    head_walks = {name: handed_over(fast) for name, fast in variants.items()}
    reference = FastLiLiCorrSelect(head, token_table=table, plans=plans_for(HeadGeometry.of(head), PYTORCH))
    builtin = attempt(errors, "build_builtin", lambda: build_builtin(head, dev, dtype))
    return Bench(args, geo, dev, dtype, head, table, lm_head, variants, head_walks, reference, given, builtin, res)


def batch(bench: Bench, bs: int) -> Batch:
    """bs requests' inputs, their logits and our top-K candidates, and the reference select on them."""
    from sglang_lilicorr.kernels import topk_lse as topk_lse_ours

    geo = bench.geo
    row = {"bs": bs}
    bench.res["rows"].append(row)
    hidden, anchor = make_inputs(geo, bs, bench.dev, bench.dtype)
    logits = F.linear(hidden.reshape(bs * geo.S, geo.HM), bench.lm_head)  # [bs*S, V]
    vals, ids, lse = topk_lse_ours(logits, geo.K)
    candidates = (vals.view(bs, geo.S, geo.K), ids.view(bs, geo.S, geo.K), lse.view(bs, geo.S))
    bench.given["candidates"] = candidates
    ref = attempt(bench.res["errors"], f"bs{bs}_reference", lambda: bench.reference.propose(logits, hidden, anchor))
    launches = bench.res["launches"].setdefault(f"bs{bs}", {})
    return Batch(bench, bs, row, launches, hidden, anchor, logits, candidates, ref)


def time_topk(b: Batch) -> None:
    """Top-K + logsumexp of the logits: ours, torch's, the built-in kernel's; on CUDA, the planned split of the rows
    against half, twice and four times as many chunks (information)."""
    from sglang_lilicorr.kernels import topk_lse as topk_lse_ours

    K = b.bench.geo.K
    b.time("topk_lse_ours", lambda: topk_lse_ours(b.logits, K))
    b.time("topk_lse_torch", lambda: (torch.topk(b.logits, K, dim=-1), torch.logsumexp(b.logits.float(), dim=-1)))
    if b.bench.builtin is not None:
        from sglang.kernels.ops.speculative.lilicorr import lilicorr_topk_lse

        b.time("topk_lse_builtin", lambda: lilicorr_topk_lse(b.logits, K))
    if torch.cuda.is_available():
        from sglang_lilicorr.kernels.topk_lse_fused import split_plan, topk_lse_triton

        plan = split_plan(b.logits.shape[0], b.bench.geo.V, b.logits.device)[0]
        for sp in sorted({max(1, plan // 2), plan, 2 * plan, 4 * plan}):
            key = f"topk_splits_{sp}" + ("_plan" if sp == plan else "")
            b.time(f"topk_splits_{sp}", lambda sp=sp: topk_lse_triton(b.logits, K, splits=sp), key)


def greedy_margin(start: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
    """[b] fp32: the smallest best-minus-second-best score gap along the greedy path of (start, pair). Two score sets
    that differ by less than half of it everywhere walk the same path."""
    rows = torch.arange(start.shape[0], device=start.device)
    if start.shape[-1] < 2:
        return torch.full((start.shape[0],), float("inf"), device=start.device)
    top2 = start.float().topk(2, dim=-1).values
    gap = top2[:, 0] - top2[:, 1]
    cur = start.argmax(-1)
    for s in range(pair.shape[1]):
        row = pair[rows, s, cur].float()
        top2 = row.topk(2, dim=-1).values
        gap = torch.minimum(gap, top2[:, 0] - top2[:, 1])
        cur = row.argmax(-1)
    return gap


def time_ours(b: Batch) -> None:
    """Each variant: head + walk from the candidates, logits -> ids, the whole select; its kernels; its outputs
    against the reference."""
    errors, checks, geo = b.bench.res["errors"], b.bench.res["checks"], b.bench.geo
    for vname, fast in b.bench.variants.items():
        b.time(f"head_walk_{vname}", lambda: b.bench.head_walks[vname].propose(b.logits, b.hidden, b.anchor))

        def post_logits(fast=fast):
            return fast.propose(b.logits, b.hidden, b.anchor)

        b.time(f"post_logits_{vname}", post_logits)
        logits_of = lambda: F.linear(b.hidden.reshape(b.bs * geo.S, geo.HM), b.bench.lm_head)  # noqa: E731
        out = b.time(f"select_{vname}", lambda: fast.propose(logits_of(), b.hidden, b.anchor))
        with torch.no_grad():  # head_walk = post_logits minus top-K's 1-2; select = post_logits + 1
            b.count(f"post_logits_{vname}", post_logits, keep_kernels=vname in ("fused", "served"))
        if out is not None and b.ref is not None:
            args = (fast, out[1], b.ref, b.logits, b.hidden, b.anchor, greedy_margin)
            attempt(errors, f"bs{b.bs}_check_{vname}", lambda: check(checks, f"bs{b.bs}_{vname}", *args))


def fused_stages(fast, vals, ids, lse, pass_hidden, anchor_hidden) -> dict:
    """The fused head step of `fast` (a FastLiLiCorrSelect; no side stream) cut into stages, name -> zero-argument call
    on the previous stage's outputs, for per-stage timing; `lattice` updates x in place."""
    b = fast._check(pass_hidden, anchor_hidden)[0]
    plan = fast.plan(b)
    if not plan.fused:
        raise ValueError("fused_stages: the plan at this batch size runs the torch route; give a fused plan.")

    def lattice(x, xn):
        if plan.route == "folded":
            return fast._layers_folded(x, xn, b, t, plan)
        return fast._layers_fused(x, xn, b, t, plan), None

    with torch.no_grad():
        pass_proj, (t, anchor) = fast._pass_projection(pass_hidden), fast._anchor_projection(anchor_hidden, plan)
        lp, x, xn = fast._nodes_fused(vals, ids, lse, pass_proj, plan)
        cat, sumsq = lattice(x.clone(), xn)

    def factors():  # with the commit, as served
        start, pair, draft = fast._factors_fused(cat, sumsq, anchor, ids, plan)
        return start, pair, walk(start, pair, ids, plan) if draft is None else draft

    stages = {
        "projections": lambda: (fast._pass_projection(pass_hidden), fast._anchor_projection(anchor_hidden, plan)),
        "nodes": lambda: fast._nodes_fused(vals, ids, lse, pass_proj, plan),
        "lattice": lambda: lattice(x, xn),
        "factors": factors,
    }
    return {name: torch.no_grad()(fn) for name, fn in stages.items()}


def time_stages(b: Batch) -> None:
    """The fused variant's stages, each captured and replayed alone; their launch counts at the first bs."""
    from sglang_lilicorr.kernels import topk_lse

    fast = b.bench.variants.get("fused")
    if fast is None:
        return
    geo = b.bench.geo
    stages = {
        "lm_head": lambda: F.linear(b.hidden.reshape(b.bs * geo.S, geo.HM), b.bench.lm_head),
        "topk_lse": lambda: topk_lse(b.logits, geo.K),
    }
    more = attempt(
        b.bench.res["errors"], f"bs{b.bs}_stages", lambda: fused_stages(fast, *b.candidates, b.hidden, b.anchor)
    )
    for name, fn in {**stages, **(more or {})}.items():
        b.time(f"stage_{name}", fn)
        if b.bs == b.bench.args.bs[0]:  # launch counts do not depend on bs (top-K: 1 kernel from N >= 4224)
            b.count(f"stage_{name}", fn)


def time_floors(b: Batch) -> None:
    """The floors (head_bench_floors): the dense work alone, with PDL where the card has it, and as many empty
    launches as the fused variant's select."""
    fast = b.bench.variants.get("fused")
    if fast is not None:
        b.time("floor_dense_chain", floors.dense_chain(fast, b.bench.geo, b.bs, b.bench.dev, b.bench.dtype))
        if Device.of(b.bench.table).pdl:
            b.time("floor_dense_chain_pdl", floors.dense_chain_pdl(fast, b.bench.geo, b.bs, b.bench.dev, b.bench.dtype))
    n_launches = b.launches.get("post_logits_fused")
    if torch.cuda.is_available() and n_launches:
        b.time("floor_launches", floors.launch_chain(int(n_launches), b.bench.dev))


def time_builtin(b: Batch) -> None:
    """SGLang's built-in head: select_with_proposal on pre-gathered token embeddings, logits -> ids, the whole select;
    its agreement with the reference's draft ids (information: bf16 near-ties)."""
    builtin, geo, table = b.bench.builtin, b.bench.geo, b.bench.table
    if builtin is None:
        return
    from sglang.kernels.ops.speculative.lilicorr import lilicorr_topk_lse

    bs, S, K = b.bs, geo.S, geo.K
    vals, ids, lse = b.candidates
    ones = torch.ones(bs, dtype=torch.bool, device=b.bench.dev)
    walk_args = dict(
        anchor_valid=ones,
        uniforms=torch.rand(bs, S, device=b.bench.dev),
        temperatures=torch.ones(bs, device=b.bench.dev),
        greedy_mask=ones,
        already_projected=True,
    )
    sel = lambda e, i, l: builtin.select_with_proposal(  # noqa: E731
        token_embeddings=e,
        candidate_tokens=i,
        candidate_log_probs=l,
        pass_hidden=b.hidden,
        anchor_hidden=b.anchor,
        **walk_args,
    )

    def from_logits(lg):
        v, i, l = lilicorr_topk_lse(lg, K)
        i = i.view(bs, S, K)
        return sel(table[i], i, (v - l.unsqueeze(-1)).view(bs, S, K))

    with torch.no_grad():
        out = b.time("head_walk_builtin", lambda: sel(table[ids], ids, vals - lse.unsqueeze(-1)))
        if out is not None and b.ref is not None:
            same = (out[1][0] == b.ref[0]).all(dim=-1).float().mean().item()
            b.bench.res["checks"][f"bs{bs}_builtin_draft_agreement_with_reference"] = same
        b.time("post_logits_builtin", lambda: from_logits(b.logits))
        b.time("select_builtin", lambda: from_logits(F.linear(b.hidden.reshape(bs * S, geo.HM), b.bench.lm_head)))
        b.count("post_logits_builtin", lambda: from_logits(b.logits), keep_kernels=True)


SECTIONS = (time_topk, time_ours, time_stages, time_floors, time_builtin)  # in this order: floors read ours' launches


def run(args) -> dict:
    bench = setup(args)
    for bs in args.bs:
        b = batch(bench, bs)
        for section in SECTIONS:
            section(b)
        log(json.dumps(b.row))
        log(f"launches bs={bs}: " + json.dumps(b.launches))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return bench.res


def check(checks, key, fast, graph_out, ref, logits, hidden, anchor, greedy_margin):
    """Our select (eager and graph replay) against the reference (the PyTorch plan's proposal) on the same inputs."""
    r_tokens, r_ids, r_lp, r_start, r_pair = ref
    tokens, ids, lp, start, pair = fast.propose(logits, hidden, anchor)  # the select's own scores
    checks[f"{key}_graph_equals_eager"] = all(torch.equal(x, y) for x, y in zip(graph_out, (tokens, ids, lp)))
    checks[f"{key}_candidate_ids_equal"] = bool(torch.equal(ids, r_ids))
    checks[f"{key}_logprob_max_err"] = float((lp - r_lp).abs().max())
    err = torch.maximum(
        (start - r_start.float()).abs().amax(-1), (pair - r_pair.float()).abs().flatten(1).amax(-1)
    )  # [b]
    checks[f"{key}_score_max_err"] = float(err.max())  # sigma-scaled cosines, |score| <= sigma = 8
    clear = greedy_margin(r_start, r_pair) > 2 * err  # a request whose path no score error can flip
    checks[f"{key}_clear_requests"] = int(clear.sum())
    checks[f"{key}_draft_ids_equal_where_clear"] = bool(torch.equal(tokens[clear], r_tokens[clear]))
    checks[f"{key}_draft_ids_equal_all"] = float((tokens == r_tokens).all(dim=-1).float().mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="FastLiLiCorrSelect vs SGLang's built-in LiLiCorr head (one GPU, graph replay)"
    )
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16, 32], help="batch sizes (default 1 4 16 32)")
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["torch", "fused", "fused_overlap", "fused_overlap_pdl", "served"],
        choices=list(VARIANTS),
        help="our implementations to time (VARIANTS)",
    )
    ap.add_argument(
        "--geometry",
        choices=list(GEOMETRIES),
        default="paper",
        help="head shapes: the paper's (the issue's targets) or the testbed draft's (information)",
    )
    ap.add_argument(
        "--compile", action="store_true", help="also time torch.compile of the PyTorch variant (slow to compile)"
    )
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition time per measurement (ms)")
    ap.add_argument("--smoke", action="store_true", help="tiny config, runs on CPU too: a dry run of this script")
    ap.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "head_bench.json"), help="JSON output file"
    )
    ap.add_argument("--plot", nargs="+", metavar="JSON", help="draw earlier results (no GPU): each X.json -> X.png")
    args = ap.parse_args(argv)
    if args.plot:
        for path in args.plot:
            res = json.loads(Path(path).read_text())
            card = next((c for c in TARGET_BS1_MS if c in res.get("meta", {}).get("gpu", "")), None)
            log(f"wrote {plot(res, Path(path).with_suffix('.png'), TARGET_RATIO, TARGET_BS1_MS.get(card))}")
        return 0
    if not torch.cuda.is_available() and not args.smoke:
        log(
            "head_bench needs a CUDA GPU (run it on the device machine; see benchmarks/PERF_NOTES.md); "
            "--smoke runs a CPU dry run."
        )
        return 2
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # --smoke on CPU: our Triton kernels under the interpreter
    t0 = time.time()
    res = {"meta": {}, "rows": [], "checks": {}, "errors": {}}
    try:
        res = run(args)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        res["errors"]["run"] = f"{type(e).__name__}: {e}"
    res["wall_s"] = round(time.time() - t0, 1)
    missed = attempt(res["errors"], "report", lambda: report(res)) if res["rows"] else []
    res["targets_missed"] = missed
    bad = failed_checks(res["checks"])
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    log(f"\nchecks: {len(res['checks']) - len(bad)}/{len(res['checks'])} passed" + (f"; FAILED: {bad}" if bad else ""))
    log(f"targets missed: {missed or 'none'}; errors: {list(res['errors']) or 'none'}")
    log(f"wrote {args.out} ({res['wall_s']} s)")
    return 1 if bad or res["errors"] else 0
