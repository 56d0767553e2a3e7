"""`lilicorr train` at Qwen3-8B shapes on one GPU: memory, tokens/s and where a step's time goes, with the drafter
trained jointly with the head (`--train joint`, the paper) and frozen (`--train head`).

  python -m benchmarks train-8b --out DIR [--modes head joint] [--card NAME] [--commit C]
  python -m benchmarks train-8b --tiny --out DIR      # the same logic at tiny shapes, on a CPU in seconds
  torchrun --nproc-per-node N -m benchmarks train-8b --dp-steps S --out DIR/train_gpuN [--micro-batch M]
      # data parallel on N GPUs (NCCL; gloo on CPUs): S steps of one mode (--modes, joint by default)

The target is a random-weight Qwen3-8B (served/scale.py's config, bf16, built on the GPU: no weights on disk, no
tokenizer); the drafter a random one in z-lab's layout (zlab_draft.py: Qwen3-8B-DFlash-b16's geometry) written to
WORK and read back as `lilicorr train --init-from` reads a user's (trainer.init_drafter_config,
state.load_draft_weights); the head the paper's; each sequence 3,072 random tokens, its first eighth a prompt, 64
anchors; the trainer's own parts (trainer.build_models: the drafter frozen with --train head, AdamW over what trains;
bf16 autocast over fp32 masters; gradient clip). For each mode:
  search      micro-batches 1, 2, 4, ... up to the global batch, one micro-step and one optimizer step each, and
              each one's peak memory: the largest that fits (a CUDA out-of-memory error ends the search) is the one
              the timed passes run (the next smaller where they run out of memory: a fragmented pool)
  throughput  at that micro-batch, no timer: the median micro-step (forward and backward) and optimizer step;
              tokens/s = the global batch's tokens / (accumulation x micro-step + optimizer step), accumulating
              64 / micro-batch micro-steps into the paper's global batch of 64 sequences
  phases      a pass of its own with CUDA events (train/timing.PhaseTimer, as the trainer logs them): ms per
              micro-step of the target's forward, the drafter's forward, the head's forward and the objective, the
              backward; ms of the optimizer step; and their shares of a global step
  kernels     one more micro-step under torch.profiler: its largest kernels by GPU time (name, calls, ms, share of
              the micro-step's kernel time; CPU ops off a GPU), the roofline's "largest kernels"
The target's forward runs under no_grad (frozen_target.FrozenTarget) and keeps no activations, so checkpointing its
activations would save nothing: what grows with the micro-batch is the drafter's and the head's.
MFU counts roofline.py's model FLOPs per token against the card's dense bf16 peak; the hours project the measured
tokens/s to an epoch of --epoch-tokens (the named data size) and the recipe's 6 epochs on 1 GPU and on 4 (the
measured 4-GPU scaling of multi-gpu/). OUT/summary.json holds {"head": {...}, "joint": {...}} (each: peak_gib,
tok_s, mfu, hours_per_epoch_1gpu, ...), the card, the commit and the data size; the table goes to stdout.

--dp-steps S: the same models trained over the ranks torchrun starts (trainer.Distributed: NCCL on GPUs, gloo on
CPUs; DistributedDataParallel as the trainer wraps it), S optimizer steps of the global batch, each rank taking
micro-batches of --micro-batch sequences and accumulating global batch / (micro-batch x ranks) of them: rank r's
m-th micro-batch of a step is its global micro-batch r + ranks x m (trainer.accumulate_gradients' order), its tokens
and anchors seeded by that index, so 1 and N ranks train on the same sequences from the same seeded weights.
Rank 0 writes OUT/metrics.jsonl in `lilicorr train`'s row format, a row per step: loss/total (the mean over the
step's micro-batches), tokens_per_s (the global batch's tokens over the step's wall time), time/wall_ms, and
peak_gib_per_gpu (each rank's peak memory, null on CPUs). Runs named train_gpu1 and train_gpuN are what
`python -m benchmarks tp-compare train --key train_scaling_8b` compares (benchmarks/multi_gpu/tp_compare.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from benchmarks import save_json

from . import roofline
from .zlab_draft import QWEN3_8B_DRAFT, write_zlab_draft, zlab_config

GIB = 2**30
TINY = {  # CPU-sized shapes of the same step: a 6-layer target, a 2-layer drafter, a small head
    "target": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
    "draft": dict(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=2,
        num_target_layers=6,
        target_layer_ids=[1, 3],
        vocab_size=128,
        mask_token_id=120,
        block_size=4,
        max_position_embeddings=512,
    ),
    "head": dict(head_hidden_size=16, head_heads=2, head_layers=1, candidate_topk=4, factor_dim=16, bf16=False),
    "seq": 32,
    "anchors": 4,
    "global_batch": 4,
}


def full_shapes() -> dict:
    from ..served.scale import QWEN3_8B

    recipe = roofline.PAPER_RECIPE
    return {
        "target": QWEN3_8B,
        "draft": QWEN3_8B_DRAFT,
        "head": {},
        "seq": recipe["seq"],
        "anchors": 64,
        "global_batch": recipe["global_batch"],
    }


def largest_micro_batch(
    try_step: Callable[[int], float | None], limit: int
) -> tuple[dict[int, float | None], int | None]:
    """Micro-batches 1, 2, 4, ... up to `limit` through `try_step` (-> its peak GiB, None off a GPU) until one runs out
    of memory -> (the peak of each that fit, the first that did not or None)."""
    fits: dict[int, float | None] = {}
    size = 1
    while size <= limit:
        try:
            fits[size] = try_step(size)
        except torch.cuda.OutOfMemoryError:
            return fits, size
        size *= 2
    return fits, None


class Bench:
    """One mode's models over the shared target, and its steps on random sequences."""

    def __init__(self, model, shapes: dict, mode: str, work: Path, device: torch.device) -> None:
        from sglang_lilicorr.frozen_target import FrozenTarget
        from sglang_lilicorr.train.config import TrainConfig
        from sglang_lilicorr.train.state import load_draft_weights
        from sglang_lilicorr.train.trainer import build_models, init_drafter_config

        self.cfg = TrainConfig(
            target=str(work / "target"),
            data=str(work / "unused.jsonl"),
            output_dir=str(work / "unused"),
            init_from=str(work / "draft"),
            train=mode,
            max_length=shapes["seq"],
            num_anchors=shapes["anchors"],
            **shapes["head"],
        )
        lm_head = model.get_output_embeddings().weight
        self.drafter_cfg = init_drafter_config(self.cfg, model.config.num_hidden_layers, lm_head.shape)
        self.head_cfg = self.cfg.head_config(
            self.drafter_cfg.block_size, self.drafter_cfg.rms_norm_eps, self.drafter_cfg.hidden_size
        )
        target = FrozenTarget(model, self.drafter_cfg.target_layer_ids)
        self.drafter, self.head, self.joint, self.optimizer = build_models(
            self.cfg, self.drafter_cfg, self.head_cfg, target, device
        )
        load_draft_weights(self.cfg.init_from, self.drafter, self.head, self.drafter_cfg, self.head_cfg)
        self.device, self.seq, self.vocab = device, shapes["seq"], int(lm_head.shape[0])
        self.global_batch, self.weights = shapes["global_batch"], self.cfg.objective()
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16)
        self.seed, self.trainable = 0, self.joint  # (data_parallel wraps the joint model in DDP)

    def batch(self, sequences: int, index: int) -> dict[str, torch.Tensor]:
        """Random tokens seeded by `index`; the first eighth of each sequence a prompt, the rest supervised."""
        ids = torch.randint(0, self.vocab, (sequences, self.seq), generator=torch.Generator().manual_seed(index))
        loss_mask = torch.zeros_like(ids, dtype=torch.bool)
        loss_mask[:, self.seq // 8 :] = True
        return {
            k: v.to(self.device)
            for k, v in {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}.items()
        }

    def micro_step(self, sequences: int, accumulation: int, index: int | None = None, sync: bool = True):
        """Forward and backward of micro-batch `index` (the next one by default) -> its loss; `sync` False: a DDP
        wrapper keeps the gradient for a later micro-step's all-reduce."""
        from sglang_lilicorr.train.trainer import forward_at_anchors

        self.seed = self.seed + 1 if index is None else index
        batch = self.batch(sequences, self.seed)
        with contextlib.nullcontext() if sync else self.trainable.no_sync(), self.autocast:
            out = forward_at_anchors(self.trainable, batch, self.cfg.num_anchors, self.seed, self.weights, self.device)
        (out.terms.total / accumulation).backward()
        return out.terms.total.detach()

    def optimizer_step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.joint.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def peak_after(self, run: Callable[[], None]) -> float | None:
        if self.device.type != "cuda":
            run()
            return None
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / GIB

    def try_micro_batch(self, size: int) -> float | None:
        return self.peak_after(lambda: (self.micro_step(size, 1), self.optimizer_step()))

    def timed(self, run: Callable[[], None]) -> float:
        self.sync()
        start = time.perf_counter()
        run()
        self.sync()
        return 1e3 * (time.perf_counter() - start)

    def throughput(self, size: int, steps: int) -> dict:
        """The median micro-step and optimizer step at micro-batch `size` (no timer) -> tokens/s of a global batch."""
        accumulation = self.global_batch // size
        self.micro_step(size, accumulation)  # warm-up
        self.optimizer_step()
        micro, optim = [], []
        for _ in range(2):
            micro += [self.timed(lambda: self.micro_step(size, accumulation)) for _ in range(steps)]
            optim.append(self.timed(self.optimizer_step))
        micro_ms, optim_ms = statistics.median(micro), statistics.median(optim)
        step_s = (accumulation * micro_ms + optim_ms) / 1e3
        return {
            "micro_batch": size,
            "grad_accum": accumulation,
            "micro_step_ms": micro_ms,
            "optimizer_step_ms": optim_ms,
            "step_s": step_s,
            "tok_s": self.global_batch * self.seq / step_s,
        }

    def phases(self, size: int, steps: int) -> dict:
        """ms per micro-step of each phase (PhaseTimer's events), the optimizer step's, and their shares of a step."""
        from sglang_lilicorr.train.timing import PhaseTimer

        accumulation = self.global_batch // size
        timer = PhaseTimer(self.device)
        self.joint.timer = timer
        for _ in range(steps):
            timer.start_step()
            self.micro_step(size, accumulation)
            timer.mark("backward")
        micro = timer.window()
        timer.start_step()
        self.optimizer_step()
        timer.mark("optimizer")
        optimizer_ms = timer.window()["time/optimizer_ms"]
        self.joint.timer = None
        per_micro = {k[len("time/") : -len("_ms")]: v for k, v in micro.items() if k != "time/step_ms"}
        per_step = {k: accumulation * v for k, v in per_micro.items()} | {"optimizer": optimizer_ms}
        total = sum(per_step.values())
        return {
            "phases_ms_per_micro_step": per_micro,
            "optimizer_ms": optimizer_ms,
            "shares": {k: v / total for k, v in per_step.items()},
        }


def largest_kernels(bench: Bench, size: int, top: int = 12) -> list[dict]:
    """The `top` kernels of one micro-step at micro-batch `size` by self time (module docstring, kernels)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = bench.device.type == "cuda"
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        bench.micro_step(size, 1)
        bench.sync()
    bench.optimizer.zero_grad(set_to_none=True)
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    total = sum(getattr(e, key) for e in events) or 1.0
    return [
        {"name": e.key[:160], "calls": e.count, "ms": getattr(e, key) / 1e3, "share": getattr(e, key) / total}
        for e in sorted(events, key=lambda e: -getattr(e, key))[:top]
    ]


def measure(bench: Bench, limit: int, steps: int) -> dict:
    fits, oom = largest_micro_batch(bench.try_micro_batch, limit)
    if not fits:
        raise RuntimeError(f"micro-batch 1 does not fit ({bench.cfg.train}): nothing to measure")
    for size in sorted(fits, reverse=True):  # the largest that fitted, or, where its timed passes run out of memory
        free_memory(bench)  # (a fragmented pool), the next smaller
        try:
            timed = bench.throughput(size, steps) | bench.phases(size, steps)
            timed["largest_kernels"] = largest_kernels(bench, size)
        except torch.cuda.OutOfMemoryError:
            continue
        return {"peak_gib": fits[size], "peak_gib_by_micro_batch": fits, "out_of_memory_at": oom, **timed}
    raise RuntimeError(f"no micro-batch runs its timed passes ({bench.cfg.train}): nothing to measure")


def free_memory(bench: Bench) -> None:
    """What an out-of-memory error left (gradients, cached blocks) goes back."""
    bench.optimizer.zero_grad(set_to_none=True)
    bench.joint.timer = None
    gc.collect()
    if bench.device.type == "cuda":
        torch.cuda.empty_cache()


def data_parallel(bench: Bench, env, micro: int, steps: int, out: Path) -> list[dict]:
    """`steps` optimizer steps of the global batch over env's ranks, micro-batches of `micro` sequences (the module
    docstring, --dp-steps) -> the metrics rows (rank 0 writes them to out/metrics.jsonl as each step ends)."""
    from torch.nn.parallel import DistributedDataParallel

    from sglang_lilicorr.train.trainer import log_row

    per_step = bench.global_batch // micro  # micro-batches of a global step, over every rank
    accumulation = per_step // env.world
    if accumulation < 1 or accumulation * env.world * micro != bench.global_batch:
        raise SystemExit(
            f"--micro-batch {micro} x {env.world} ranks does not divide the global batch of {bench.global_batch}"
        )
    if env.world > 1:
        bench.trainable = DistributedDataParallel(
            bench.joint, device_ids=[env.device.index] if env.device.type == "cuda" else None
        )
    if env.main:  # a fresh log: a run again into the same folder replaces it
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    rows = []
    for step in range(steps):
        if env.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = 0
        for m in range(accumulation):  # DDP reduces the gradients on the last micro-step only
            sync = m == accumulation - 1 or env.world == 1
            loss = loss + bench.micro_step(micro, accumulation, step * per_step + env.rank + env.world * m, sync)
        bench.optimizer_step()
        peak = torch.cuda.max_memory_allocated() / GIB if env.device.type == "cuda" else float("nan")
        pooled = torch.zeros(1 + env.world, dtype=torch.float64, device=env.device)  # the loss sum, each rank's peak
        pooled[0], pooled[1 + env.rank] = loss.double(), peak
        if env.world > 1:
            dist.all_reduce(pooled)
        pooled = pooled.tolist()  # (waits for the step on every rank)
        elapsed = time.perf_counter() - start
        rows.append(
            {
                "step": step + 1,
                "loss/total": pooled[0] / per_step,
                "tokens_per_s": bench.global_batch * bench.seq / elapsed,
                "time/wall_ms": 1e3 * elapsed,
                "micro_batch": micro,
                "grad_accum": accumulation,
                "world": env.world,
                "peak_gib_per_gpu": [None if p != p else round(p, 2) for p in pooled[1:]],
            }
        )
        if env.main:
            log_row(out / "metrics.jsonl", rows[-1])
            print(f"step {step + 1}: loss {rows[-1]['loss/total']:.4f}, {rows[-1]['tokens_per_s']:,.0f} tok/s")
    return rows


def summarise(
    mode: str, measured: dict, shapes: roofline.Shapes, peak: float | None, scaling: float, epoch_tokens: float
) -> dict:
    """One mode's figures with its FLOPs, MFU and the wall times its tokens/s projects."""
    flops = roofline.flops_per_token(shapes, mode)
    tok_s = measured["tok_s"]
    epoch_h = epoch_tokens / tok_s / 3600
    epochs = roofline.PAPER_RECIPE["epochs"]
    return {
        **measured,
        "mfu": flops["total"] * tok_s / peak if peak else None,
        "flops_per_token": flops,
        "hours_per_epoch_1gpu": epoch_h,
        "hours_per_epoch_4gpu": epoch_h / scaling,
        "recipe_hours_1gpu": epochs * epoch_h,
        "recipe_hours_4gpu": epochs * epoch_h / scaling,
        **roofline.wall_time(tok_s, scaling, epochs),
    }


def compare(head: dict, joint: dict, global_batch: int) -> dict:
    """Head-only's peak memory over joint's, and joint's step by part: ms per sequence of the target's forward, the
    drafter (forward, and the backward joint spends beyond head-only's: the drafter's own, derived) and the head
    (forward and head-only's backward), the optimizer's per sequence; with their shares."""
    per_seq = {
        m: {k: v / r["micro_batch"] for k, v in r["phases_ms_per_micro_step"].items()}
        for m, r in (("head", head), ("joint", joint))
    }
    parts = {
        "target": per_seq["joint"]["target"],
        "drafter": per_seq["joint"]["drafter"] + per_seq["joint"]["backward"] - per_seq["head"]["backward"],
        "head": per_seq["joint"]["head"] + per_seq["head"]["backward"],
        "optimizer": joint["optimizer_ms"] / global_batch,
    }
    total = sum(parts.values())
    return {
        "head_over_joint_peak": head["peak_gib"] / joint["peak_gib"] if joint["peak_gib"] else None,
        "joint_ms_per_sequence_by_part": parts,
        "joint_shares_by_part": {k: v / total for k, v in parts.items()},
    }


def build_target(config: dict, device: torch.device):
    """A random-weight causal LM of this HF config, bf16 on a GPU (float32 on a CPU), frozen."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype, attn_implementation="sdpa")
    return model.eval().requires_grad_(False)


def git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=roofline.SCALING.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return None


def table(summary: dict) -> str:
    modes = [m for m in roofline.MODES if m in summary]
    rows = [
        ("peak GiB", "peak_gib", "{:.1f}"),
        ("micro-batch x accumulation", None, None),
        ("tokens/s", "tok_s", "{:,.0f}"),
        ("MFU", "mfu", "{:.1%}"),
        ("GFLOP per token", None, None),
        (f"hours per epoch of {summary['data']['tokens'] / 1e6:g}M tokens, 1 GPU", "hours_per_epoch_1gpu", "{:.2f}"),
        ("recipe (6 epochs) hours, 1 GPU / 4 GPUs", None, None),
    ]
    lines = [f"| {summary['card']} | {' | '.join(modes)} |", "|---|" + "---|" * len(modes)]
    for label, key, form in rows:
        cells = []
        for m in modes:
            r = summary[m]
            if label.startswith("micro"):
                cells.append(f"{r['micro_batch']} x {r['grad_accum']}")
            elif label.startswith("GFLOP"):
                cells.append(f"{r['flops_per_token']['total'] / 1e9:.2f}")
            elif label.startswith("recipe"):
                cells.append(f"{r['recipe_hours_1gpu']:.1f} / {r['recipe_hours_4gpu']:.1f}")
            else:
                cells.append("-" if r[key] is None else form.format(r[key]))
        lines.append(f"| {label} | {' | '.join(cells)} |")
    for m in modes:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in summary[m]["shares"].items())
        lines.append(f"\n{m}: share of a step: {shares}")
    for m in modes:
        kernels = ", ".join(f"{k['name'][:48]} {k['share']:.0%}" for k in summary[m].get("largest_kernels", [])[:5])
        lines.append(f"{m}: largest kernels of a micro-step: {kernels}")
    if "joint_shares_by_part" in summary:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in summary["joint_shares_by_part"].items())
        lines.append(f"joint by part (its drafter backward: joint's backward less head-only's): {shares}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for summary.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/train-8b"), help="folder for the target config and draft")
    p.add_argument(
        "--modes", nargs="+", choices=roofline.MODES, help="--train values (default: both; joint with --dp-steps)"
    )
    p.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU run of the same logic)")
    p.add_argument("--steps", type=int, default=3, help="micro-steps per timing round")
    p.add_argument("--max-micro-batch", type=int, default=0, help="the largest tried (0: the global batch)")
    p.add_argument("--epoch-tokens", type=float, default=1e8, help="the named data size: training tokens an epoch")
    p.add_argument("--card", help="the card's name (default: torch's)")
    p.add_argument("--commit", help="the measured commit (default: git's; the GPU machine's copy has none)")
    p.add_argument("--dp-steps", type=int, default=0, help="data parallel over torchrun's ranks: this many steps")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-step of each rank (--dp-steps)")
    a = p.parse_args(argv)
    a.modes = a.modes or (["joint"] if a.dp_steps else list(roofline.MODES))
    if a.dp_steps and len(a.modes) != 1:
        p.error("--dp-steps trains one mode: --modes joint or --modes head")
    shapes = TINY if a.tiny else full_shapes()
    from sglang_lilicorr.train.trainer import Distributed

    env = Distributed()  # torchrun's rank and its GPU; one process without torchrun
    if env.world > 1 and not a.dp_steps:
        p.error("under torchrun the step trains data parallel: pass --dp-steps")
    device = env.device
    card = a.card or (torch.cuda.get_device_name() if device.type == "cuda" else "cpu")
    peak, scaling = roofline.card_peak(card), roofline.four_gpu_scaling()

    draft, draft_config = a.work / "draft", zlab_config(**shapes["draft"])
    if env.main and (
        not (draft / "model.safetensors").is_file() or json.loads((draft / "config.json").read_text()) != draft_config
    ):
        write_zlab_draft(draft, draft_config)  # once per machine: an earlier call's is kept
    if env.main:
        (a.work / "target").mkdir(parents=True, exist_ok=True)
        (a.work / "target" / "config.json").write_text(json.dumps(shapes["target"], indent=1) + "\n")
    env.barrier()  # rank 0 wrote the draft and the target's config
    torch.manual_seed(0)  # the same random target and head in every process: 1 and N ranks start alike
    model = build_target(shapes["target"], device)
    if a.dp_steps:
        bench = Bench(model, shapes, a.modes[0], a.work, device)
        data_parallel(bench, env, a.micro_batch, a.dp_steps, a.out)
        if env.world > 1:
            dist.destroy_process_group()
        return 0

    summary = {
        "card": card,
        "commit": a.commit or git_commit(),
        "data": {"tokens": a.epoch_tokens, "what": f"an epoch of {a.epoch_tokens / 1e6:g}M training tokens"},
        "shapes": {k: shapes[k] for k in ("seq", "anchors", "global_batch")} | {"tiny": a.tiny},
        "peak_flops": peak,
        "scaling_4gpu": scaling,
        "target_activation_checkpointing": "not used: the frozen target's forward runs under no_grad and keeps no "
        "activations",
    }
    for mode in a.modes:
        bench = Bench(model, shapes, mode, a.work, device)
        measured = measure(bench, a.max_micro_batch or shapes["global_batch"], a.steps)
        rl = roofline.Shapes(shapes["target"], bench.drafter_cfg, bench.head_cfg, shapes["seq"], shapes["anchors"])
        summary[mode] = summarise(mode, measured, rl, peak, scaling, a.epoch_tokens)
        del bench
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if "head" in summary and "joint" in summary:
            summary.update(compare(summary["head"], summary["joint"], shapes["global_batch"]))
        save_json(a.out / "summary.json", summary)  # after each mode: a call cut short keeps what it measured
        print(f"{mode}: {summary[mode]['tok_s']:,.0f} tok/s at micro-batch {summary[mode]['micro_batch']}", flush=True)
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
