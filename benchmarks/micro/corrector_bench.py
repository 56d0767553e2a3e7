"""Per-block head cost of every system at Qwen3-8B shapes (the paper's cost table, head column), in one process on
one GPU, random weights, bf16, at each bs: Domino's and DSpark's draft-time correctors through SGLang 0.5.23's own
functions and modules, and our select with the greedy walk beside the Viterbi walk (LILICORR_WALK).

  python3 -m benchmarks corrector-bench --out $OUT/corrector_bench.json [--commit C]

Shapes: block 16 (S = 15 drafted slots), drafter hidden Hm = 4096, vocabulary 151936; Domino's GRU and MLP and
DSpark's Markov rank at Hm (benchmarks/scale_drafts.py: the paper's configuration as SGLang serves it); our head
head_bench's paper config. Each figure is the median ms of one call's CUDA-graph replay (head_bench.time_graph), inputs
random drafter states `hidden` [bs, S, Hm] (Domino: [bs, 16, Hm], slot 0 first) and their logits:

  lm_head            the [bs*S, Hm] x [Hm, V] GEMM alone (what every system's draft pays before or inside its head)
  domino_select      SGLang's domino_greedy_rollout (graph mode): the LM-head GEMM, the top-2048 candidate pool, the
                     GRU over the anchor and each pick, 14 correction steps; modules nn.GRU + nn.Sequential as SGLang's
                     DFlashDraftModel builds them (baselines.DominoHead's: the same classes and tensor names)
  domino_head        domino_select - lm_head (the rollout computes its logits itself)
  dspark_markov      SGLang's draft_markov_block (greedy draft, vanilla head from its build_markov_head) on the logits;
                     at bs 1 SGLang takes its fused route (_draft_step: one row, no logits kept -> MarkovGreedyStep,
                     one Triton GEMV + add + argmax per step), at bs > 1 the markov_w2 GEMM + MarkovSampleStep
  dspark_markov_gemm (bs 1 only) the same block with the fused route turned off, i.e. SGLang's bs > 1 route at bs 1:
                     sets the fused kernel beside the GEMM route on the same bytes (each step reads all of markov_w2)
  dspark_confidence  SGLang's DSparkConfidenceHead.predict on the block's picks (run only in ragged verification)
  dspark_head        dspark_markov + dspark_confidence
  lilicorr_greedy    our select's propose (top-K/LSE + head + greedy walk: head_bench's post_logits, served plans)
  lilicorr_viterbi   the same with walk="viterbi" (the cosine kernel's scores, then the Viterbi kernel)
`--smoke` runs every row once, eagerly, at toy shapes on the CPU (a dry run of the script).

Modules are built as SGLang's model loader builds them (`served_construction`: the dtype as the default and the device
as the context, then weights copied into those parameters). Domino's prefix_gru is therefore bf16 in two separate
tensors, as served: torch's flatten_parameters packs only dtypes cuDNN's Python check accepts (fp16 / fp32 / fp64,
torch.backends.cudnn.CUDNN_TENSOR_DTYPES), SGLang never calls it, and its weight loader copies into the existing
parameters. cuDNN then copies both GRU weights into one chunk at every call of the rollout's prefix GRU (once per
block; its 13 later GRU steps run aten's gru_cell, which skips cuDNN), and SGLang's served rollout pays that copy
too, so it stays in domino_select. `meta.domino_gru_weights_in_one_storage` records the state timed; torch's
"not part of single contiguous chunk of memory" warning for it is silenced and named once in the log.

`meta.git_commit`: --commit, else `git rev-parse HEAD` where the checkout has a .git, else $GIT_COMMIT. The GPU
machine's copy of the checkout has no .git: benchmarks/device/scale_gpu.sh passes $GIT_COMMIT (set on the call) as
--commit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import types
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from . import head_bench
from benchmarks.served.scale_drafts import DOMINO_CANDIDATE_POOL

BATCH_SIZES = (1, 4, 16, 32)
GRU_COMPACTION_WARNING = "RNN module weights are not part of single contiguous chunk of memory"


@contextlib.contextmanager
def served_construction(device, dtype):
    """Build modules as SGLang's model loader does (model_loader/loader.py: `set_default_torch_dtype(model dtype)`
    and `with torch.device(device)` around the model's constructor), not on the CPU and then moved."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def gru_weights_in_one_storage(gru: torch.nn.GRU) -> bool:
    """Whether the GRU's weights share one storage (what flatten_parameters makes: views into cuDNN's flat buffer).
    False: cuDNN copies them into one chunk at every call (torch's "not part of single contiguous chunk" warning)."""
    storages = {w.untyped_storage().data_ptr() for w in gru._flat_weights if w is not None}
    return len(storages) == 1


def domino_modules(geo: head_bench.Geometry, device, dtype):
    """A random Domino head of width Hm: its prefix_gru and embed_proj (the modules domino_greedy_rollout reads),
    built as SGLang builds DFlashDraftModel's (module docstring: the GRU's weights stay in two tensors)."""
    from sglang_lilicorr.baselines import DominoConfig, DominoHead

    with served_construction(device, dtype):
        return DominoHead(DominoConfig(gru_hidden_dim=geo.HM, emb_dim=geo.HM), geo.HM, geo.V).eval()


def dspark_modules(geo: head_bench.Geometry, device, dtype):
    """SGLang's vanilla Markov head and confidence head at rank Hm, random, built as SGLang builds them (the
    confidence head in its own fp32, DSparkConfidenceHead's default dtype)."""
    from sglang.srt.models.dspark import DSparkConfidenceHead, build_markov_head

    config = types.SimpleNamespace(markov_rank=geo.HM, markov_head_type="vanilla", vocab_size=geo.V, hidden_size=geo.HM)
    with served_construction(device, dtype):
        markov = build_markov_head(config).eval()
        confidence = DSparkConfidenceHead(hidden_size=geo.HM, markov_rank=geo.HM).eval()
    return markov, confidence


class GemmRouteMarkov:
    """SGLang's Markov head with its fused greedy route off (greedy_w2_weight None): _draft_step then takes the
    markov_w2 GEMM + MarkovSampleStep route it takes at bs > 1. Everything else is the wrapped head's."""

    def __init__(self, head) -> None:
        self._head = head

    def greedy_w2_weight(self):
        return None

    def __getattr__(self, name):
        return getattr(self._head, name)


def row_fns(geo, bs, parts, device, dtype) -> dict:
    """{row name: closure} at bs over random inputs (module docstring)."""
    from sglang.srt.speculative.domino_utils import domino_greedy_rollout
    from sglang.srt.speculative.dspark_components.dspark_draft import DraftNoise, draft_markov_block

    lm_head_w, embed, domino, (markov, confidence), selects = parts
    g = torch.Generator(device="cpu").manual_seed(2000 + bs)
    block = torch.randn(bs, geo.S + 1, geo.HM, generator=g).to(device, dtype)  # slot 0, then the drafted slots
    hidden, anchor_hidden = block[:, 1:].contiguous(), block[:, 0].contiguous()
    anchor = torch.randint(0, geo.V, (bs,), generator=g).to(device)
    logits = F.linear(hidden.reshape(bs * geo.S, geo.HM), lm_head_w)
    noise = DraftNoise(key=0, offset=torch.zeros(1, dtype=torch.int64, device=device))

    class NoTensorParallel:
        def sync(self, site, values):
            return values

    def markov_block(head=markov):
        return draft_markov_block(
            markov_head=head,
            base_logits=logits.view(bs, geo.S, -1),
            anchor_tokens=anchor,
            draft_hidden=hidden,
            step_temperatures=torch.zeros(bs, device=device),
            noise=noise,
            tp_sync=NoTensorParallel(),
            greedy_draft=True,
        )[0]

    picks = markov_block()
    fns = {
        "lm_head": lambda: F.linear(hidden.reshape(bs * geo.S, geo.HM), lm_head_w),
        "domino_select": lambda: domino_greedy_rollout(
            draft_hidden=block,
            bonus_tokens=anchor,
            target_embedding=embed,
            lm_head_weight=lm_head_w,
            prefix_gru=domino.prefix_gru,
            embed_proj=domino.embed_proj,
            vocab_size=geo.V,
            shift_label=False,
            candidate_pool_size=DOMINO_CANDIDATE_POOL,
            in_cuda_graph=True,
        ),
        "dspark_markov": markov_block,
        **({"dspark_markov_gemm": lambda: markov_block(GemmRouteMarkov(markov))} if bs == 1 else {}),
        "dspark_confidence": lambda: confidence.predict(
            hidden.reshape(bs * geo.S, -1), anchor_tokens=anchor, draft_tokens=picks, markov_head=markov
        ),
    }
    for walk, fast in selects.items():
        fns[f"lilicorr_{walk}"] = lambda fast=fast: fast.propose(logits, hidden, anchor_hidden)
    return fns


def derived(row: dict) -> None:
    """Adds domino_head, dspark_head and viterbi_over_greedy where their parts were timed."""
    get = row.get
    if get("domino_select") is not None and get("lm_head") is not None:
        row["domino_head"] = row["domino_select"] - row["lm_head"]
    if get("dspark_markov") is not None and get("dspark_confidence") is not None:
        row["dspark_head"] = row["dspark_markov"] + row["dspark_confidence"]
    if get("lilicorr_greedy") and get("lilicorr_viterbi") is not None:
        row["viterbi_over_greedy"] = row["lilicorr_viterbi"] / row["lilicorr_greedy"]


def run(geo: head_bench.Geometry, batch_sizes, rep_ms: int, commit: Optional[str] = None) -> dict:
    from sglang_lilicorr.fast_path.plan import Device, HeadGeometry, plans_for
    from sglang_lilicorr.fast_path.select import FastLiLiCorrSelect

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    errors: dict = {}
    g = torch.Generator(device="cpu").manual_seed(7)
    lm_head_w = (torch.randn(geo.V, geo.HM, generator=g) * 0.02).to(device, dtype)
    embed = torch.nn.Embedding(geo.V, geo.HM).to(device=device, dtype=dtype)
    ours = head_bench.build_ours(geo, device, dtype)
    table = ours.token_table(embed.weight)
    served = (HeadGeometry.of(ours), Device.of(table))
    selects = {
        w: FastLiLiCorrSelect(ours, token_table=table, plans=plans_for(*served, walk=w)) for w in ("greedy", "viterbi")
    }
    with torch.inference_mode(), warnings.catch_warnings():
        domino = domino_modules(geo, device, dtype)
        gru_packed = gru_weights_in_one_storage(domino.prefix_gru)
        if not gru_packed:
            warnings.filterwarnings("ignore", message=GRU_COMPACTION_WARNING, category=UserWarning)
            head_bench.log(
                f"domino: prefix_gru's {dtype} weights are in separate tensors, as SGLang serves them: cuDNN copies"
                " them into one chunk at each prefix-GRU call (once per block, SGLang's served rollout too);"
                " torch's warning for it is silenced"
            )
        parts = (lm_head_w, embed, domino, dspark_modules(geo, device, dtype), selects)
        rows = []
        for bs in batch_sizes:
            row: dict = {"bs": bs}
            fns = head_bench.attempt(errors, f"bs{bs}_inputs", lambda: row_fns(geo, bs, parts, device, dtype)) or {}
            for name, fn in fns.items():
                timed = head_bench.attempt(errors, f"bs{bs}_{name}", lambda fn=fn: head_bench.time_graph(fn, rep_ms))
                row[name] = None if timed is None else timed[0]
            derived(row)
            rows.append(row)
            head_bench.log(json.dumps(row))
    return {
        "meta": {
            "gpu": torch.cuda.get_device_name(0) if cuda else "cpu (--smoke dry run)",
            "git_commit": commit or head_bench.git_commit(),
            "geometry": dataclasses.asdict(geo),
            "dtype": str(dtype),
            "domino_candidate_pool": DOMINO_CANDIDATE_POOL,
            "domino_gru_weights_in_one_storage": gru_packed,
            "rep_ms": rep_ms,
        },
        "rows": rows,
        "errors": errors,
    }


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the JSON to write (meta, rows per bs, errors)")
    p.add_argument("--bs", type=int, nargs="+", default=list(BATCH_SIZES))
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench's repetition time per row")
    p.add_argument("--smoke", action="store_true", help="toy shapes, eager, on the CPU: a dry run")
    p.add_argument(
        "--commit",
        help="the commit measured, for meta.git_commit (default: git rev-parse HEAD, else $GIT_COMMIT; the GPU"
        " machine's copy has no .git: benchmarks/device/scale_gpu.sh passes $GIT_COMMIT)",
    )
    args = p.parse_args(argv)
    bad = [b for b in args.bs if b < 1]
    if bad:
        p.error(f"--bs {bad[0]} is not a batch size: pass integers >= 1")
    if not args.smoke and not torch.cuda.is_available():
        p.error("no CUDA device: run this on the GPU machine, or pass --smoke for the CPU dry run")
    result = run(head_bench.SMOKE if args.smoke else head_bench.PAPER, args.bs, args.rep_ms, args.commit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, error in result["errors"].items():
        print(f"!! {name}: {error}", file=sys.stderr)
    return 1 if result["errors"] else 0
