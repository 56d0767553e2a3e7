"""The paper's cost table at production scale: a Qwen3-8B-shaped target with random weights on one GPU,
served by LILICORR (this plugin), DFLASH, SGLang's built-in LiLiCorr (DFLASH serving a LiLiCorrDraftModel
draft: SGLang's own head), Domino (DFLASH serving a draft with projector_type "domino") and DSpark (DSPARK).

A block's cost does not depend on the weights, so random ones serve. The target is SGLang's
`--load-format dummy` over a config.json with Qwen3-8B's shapes (no tokenizer: `--skip-tokenizer-init`,
requests as token ids, `bench run --api ids`). The drafts are written here by our own writers: a random
DFlash drafter (DrafterConfig / DFlashDrafter / save_checkpoint, the target's layer shape, block 16,
target_layer_ids = SGLang's build_target_layer_ids(36, 5)) and the same drafter with a random
paper-config head (served/random_head.add_random_head), and the same drafter with a random Domino or DSpark head
(scale_drafts: the heads' configuration and serving settings). Its depth: DRAFT_LAYERS, see benchmarks/README.md.

Random weights accept nothing, so the speculative servers run with SGLang's own benchmark knob
SGLANG_SIMULATE_ACC_LEN = FORCED_COMMIT: after verification every block commits 7 tokens (6 drafts +
the bonus), whatever the target said; the KV append, the next positions and the scheduler then do the
work of a block that accepted 6. The stage timer records the setting (`forced_commit_len`). Domino runs in
SGLang's DFlash worker (the same forced accept); the DSPARK worker reads the knob itself and forces the same
7 of its gamma + 1 = 16 verified tokens.

  python -m benchmarks scale build --work W
  python -m benchmarks scale run --work W --phases graph --out $OUT --deadline EPOCH
  python -m benchmarks scale-report BUNDLE_OR_DIR ... \
      --out benchmarks/results/scale-qwen3-8b/CARD_COMMIT   (CPU)

Phases (PHASES); each starts its servers one after another (side by side on GPU 0), measures, stops them
and packs WORK/<phase> into $OUT/scale_<phase>.tar.gz (written whole or not at all):
  graph       LILICORR, DFLASH and the built-in, CUDA graphs at the measured batch sizes, stage timer on:
              paired alternating rounds (benchmarks/paired.py) at c = 1, 4, 16, 32
  correctors  Domino, DSpark and DFLASH (each phase's paired reference), as in graph
  base        the target without speculation, stage timer on (the plain decode step): the same rounds
  eager       the five speculative servers without decode CUDA graphs: one round per c (the eager stages)
  tput   LILICORR and the built-in alone, graph-captured, 1,024-token outputs, no stage timer (the tok/s a user gets):
         the same paired rounds, four times the decode per run, so rare prefill stalls weigh a quarter as much
  widths2, widths7   LILICORR's adaptive verify width beside the same server pinned at each width (lilicorr_wN:
         LILICORR_VERIFY_WIDTH=N), blocks forced to commit 2 / 7 tokens, uninstrumented paired rounds: does the
         adaptive choice come within 3 % of the best pinned width? Six 8B servers: an H200.
A phase the deadline leaves no time for is skipped (exit 4: run it in the next call); inside a phase the
rounds stop before one that would not finish. A phase an earlier call on the same machine measured whole
is not run again (its bundle is packed again); one cut short resumes its runs (benchmarks/paired.py).
benchmarks/device/scale_gpu.sh runs this on the lent GPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from sglang_lilicorr.bench import prompt_file
from benchmarks import save_json

from .. import lab_env
from . import paired, scale_drafts, stages

# Qwen3-8B's config.json (the public one), all a dummy-weight target needs.
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "torch_dtype": "bfloat16",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "max_window_layers": 36,
    "sliding_window": None,
    "use_sliding_window": False,
    "use_cache": True,
}
QWEN3_MASK_TOKEN_ID = (
    151669  # the id Qwen3 DFlash drafters use for <|MASK|> (no tokenizer is loaded: the id alone serves)
)
DRAFT_LAYERS = 5  # z-lab's DFlash drafters for 8B-class Qwen targets (benchmarks/README.md, "Scale")
CONTEXT_FEATURES = 5  # target layers the drafter reads: build_target_layer_ids(36, 5) = [1, 9, 17, 25, 33]
BLOCK_SIZE = 16
PAPER_HEAD = {
    "candidate_topk": 8,
    "hidden_size": 1024,
    "num_layers": 2,
    "num_heads": 8,
    "factor_dim": 1024,
}  # FFN 2 x 1024
FORCED_COMMIT = 7  # tokens a block commits under SGLANG_SIMULATE_ACC_LEN: 6 accepted drafts + the bonus
SYSTEMS = ("lilicorr", "dflash", "builtin", "domino", "dspark")
SERVED = {  # system -> (--speculative-algorithm, the draft under WORK/drafts)
    "lilicorr": ("LILICORR", "lilicorr"),
    "dflash": ("DFLASH", "dflash"),
    "builtin": ("DFLASH", "lilicorr"),  # SGLang's own head on our LiLiCorr draft
    "domino": ("DFLASH", "domino"),
    "dspark": ("DSPARK", "dspark"),
    **{f"lilicorr_w{w}": ("LILICORR", "lilicorr") for w in (1, 2, 4, 8, 16)},  # LILICORR pinned at width w
}
DRAFTS = ("dflash", "lilicorr", *scale_drafts.CORRECTORS)
CONCURRENCY = (1, 4, 16, 32)
PROMPT_TOKENS = 256
MAX_TOKENS = 256
KV_TOKENS = 24576
PORT0 = 33000
RESERVE_S = 45.0  # kept after the last round: stopping servers, packing the bundle


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    systems: tuple[str, ...]
    eager: bool
    rounds: int
    prompts: Mapping[int, int]  # c -> prompts per run
    budget_s: float  # the longest it may take, server start-up included (H100, warm JIT cache after the first server)
    max_tokens: int = MAX_TOKENS  # new tokens per request
    kv_tokens: int = KV_TOKENS  # each server's KV pool (--max-total-tokens): c = 32 requests of prompt + max_tokens fit
    stage_timer: bool = True  # off: throughput only, uninstrumented
    forced_commit: int = FORCED_COMMIT  # SGLANG_SIMULATE_ACC_LEN of its speculative servers


RUN_PROMPTS = {1: 3, 4: 8, 16: 16, 32: 32}
PHASES = {
    "graph": Phase(
        "graph", ("lilicorr", "dflash", "builtin"), eager=False, rounds=8, prompts=RUN_PROMPTS, budget_s=430
    ),
    "correctors": Phase(
        "correctors", ("domino", "dspark", "dflash"), eager=False, rounds=8, prompts=RUN_PROMPTS, budget_s=450
    ),
    "base": Phase("base", ("base",), eager=False, rounds=8, prompts=RUN_PROMPTS, budget_s=180),
    "eager": Phase("eager", SYSTEMS, eager=True, rounds=1, prompts={1: 2, 4: 4, 16: 16, 32: 32}, budget_s=330),
    "tput": Phase(
        "tput",
        ("lilicorr", "builtin"),
        eager=False,
        rounds=8,
        prompts=RUN_PROMPTS,
        budget_s=450,
        max_tokens=1024,
        kv_tokens=49152,
        stage_timer=False,
    ),
    **{
        f"widths{n}": Phase(
            f"widths{n}",
            ("lilicorr", *(f"lilicorr_w{w}" for w in (1, 2, 4, 8, 16))),
            eager=False,
            rounds=3,
            prompts=RUN_PROMPTS,
            budget_s=570,
            kv_tokens=20480,
            stage_timer=False,
            forced_commit=n,
        )
        for n in (2, 7)
    },
}


# --- the inputs ------------------------------------------------------------------------------


def drafter_config(target: Mapping, *, layers: int, mask_token_id: int):
    """A DFlash drafter with the target's layer shape, reading CONTEXT_FEATURES of its layers."""
    from sglang_lilicorr.drafter import DrafterConfig, default_target_layer_ids

    n = int(target["num_hidden_layers"])
    return DrafterConfig(
        hidden_size=int(target["hidden_size"]),
        vocab_size=int(target["vocab_size"]),
        num_target_layers=n,
        target_layer_ids=tuple(default_target_layer_ids(n, CONTEXT_FEATURES)),
        mask_token_id=mask_token_id,
        num_hidden_layers=layers,
        num_attention_heads=int(target["num_attention_heads"]),
        num_key_value_heads=int(target["num_key_value_heads"]),
        head_dim=int(target["head_dim"]),
        intermediate_size=int(target["intermediate_size"]),
        block_size=BLOCK_SIZE,
        rope_theta=float(target["rope_theta"]),
        rms_norm_eps=float(target["rms_norm_eps"]),
        max_position_embeddings=int(target["max_position_embeddings"]),
    )


def build(
    work: Path,
    *,
    target: Mapping = QWEN3_8B,
    layers: int = DRAFT_LAYERS,
    mask_token_id: int = QWEN3_MASK_TOKEN_ID,
    head: Mapping = PAPER_HEAD,
    seed: int = 0,
    device: Optional[str] = None,
    log=print,
) -> dict:
    """WORK/target/config.json, WORK/drafts/dflash (a random DFlashDraftModel), WORK/drafts/lilicorr (the same
    drafter with a random head) and WORK/drafts/{domino,dspark} (with a random corrector, scale_drafts); nothing is
    rebuilt when WORK/build.json says it is there."""
    import torch

    from benchmarks.served.random_head import add_random_head
    from sglang_lilicorr.checkpoint import save_checkpoint
    from sglang_lilicorr.drafter import DFlashDrafter, drafter_tensors

    work = Path(work)
    config = drafter_config(target, layers=layers, mask_token_id=mask_token_id)
    stamp = {
        "target": dict(target),
        "drafter": config.to_hf_config(),
        "head": dict(head),
        "correctors": {
            s: scale_drafts.corrector_config(s, config.hidden_size).to_keys() for s in scale_drafts.CORRECTORS
        },
        "seed": seed,
    }
    done = work / "build.json"
    if (
        done.is_file()
        and json.loads(done.read_text()) == stamp
        and all((work / "drafts" / d / "model.safetensors").is_file() for d in DRAFTS)
    ):
        log(f"[build] {work}: built already")
        return stamp
    t0 = time.time()
    save_json(work / "target" / "config.json", dict(target))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    with torch.device(device):
        drafter = DFlashDrafter(config)
    tensors = {k: v.to(torch.bfloat16) for k, v in drafter_tensors(drafter).items()}
    del drafter
    save_checkpoint(work / "drafts" / "dflash", config.to_hf_config(), tensors)
    del tensors
    add_random_head(work / "drafts" / "dflash", work / "drafts" / "lilicorr", seed=seed, **head)
    for system in scale_drafts.CORRECTORS:
        scale_drafts.add_random_corrector(
            work / "drafts" / "dflash", work / "drafts" / system, system, seed=seed, device=device
        )
    save_json(done, stamp)
    log(f"[build] target config, random {layers}-layer drafter and heads in {work} ({time.time() - t0:.0f} s)")
    return stamp


def prompts(count: int) -> list[dict]:
    """`count` single-turn prompts of PROMPT_TOKENS ASCII characters (= token ids under --api ids), each distinct."""
    filler = "the quick brown fox jumps over the lazy dog "
    return [
        {"id": f"p{i}", "set": "scale", "text": (f"{i:04d} " + filler * PROMPT_TOKENS)[:PROMPT_TOKENS]}
        for i in range(count)
    ]


# --- servers -------------------------------------------------------------------------------


SERVE = (
    "--load-format",
    "dummy",
    "--skip-tokenizer-init",
    "--attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--grammar-backend",
    "none",
    "--context-length",
    "4096",
    "--max-running-requests",
    str(max(CONCURRENCY)),
    "--cuda-graph-bs-decode",
    *map(str, CONCURRENCY),
    "--cuda-graph-backend-prefill",
    "disabled",
    "--mem-fraction-static",
    "0.9",
)


def server_args(system: str, work: Path, *, eager: bool, kv_tokens: int = KV_TOKENS) -> tuple[str, ...]:
    # side by side: each server's KV pool capped at kv_tokens (the phase's c = 32 requests fit), the rest is headroom
    args = (
        list(SERVE)
        + ["--max-total-tokens", str(kv_tokens)]
        + (["--cuda-graph-backend-decode", "disabled"] if eager else [])
    )
    if system != "base":
        algorithm, draft = SERVED[system]
        args += [
            "--speculative-algorithm",
            algorithm,
            "--speculative-draft-model-path",
            str(Path(work) / "drafts" / draft),
            "--speculative-draft-load-format",
            "safetensors",
            "--speculative-draft-attention-backend",
            "triton",
        ]
    if system == "domino":
        args += ["--speculative-domino-candidate-pool-size", str(scale_drafts.DOMINO_CANDIDATE_POOL)]
    return tuple(args)


def server_env(
    system: str, root: Path, *, stage_timer: bool = True, forced_commit: int = FORCED_COMMIT
) -> dict[str, str]:
    env = {}
    if stage_timer:
        env["LILICORR_STAGE_TIMING"] = str(root / "stages" / system)
        env["LILICORR_STAGE_TIMING_BS"] = ",".join(map(str, CONCURRENCY))
    if system != "base":
        env["SGLANG_SIMULATE_ACC_LEN"] = str(forced_commit)
    if system.startswith("lilicorr_w"):
        env["LILICORR_VERIFY_WIDTH"] = system.removeprefix("lilicorr_w")
    if system == "dspark":
        env.update(scale_drafts.DSPARK_ENV)
    return env


def first_traceback(log_dir: Path, lines: int = 30) -> str:
    """The first traceback of the servers' logs (what a failed start-up says), else their last lines."""
    for log in sorted(Path(log_dir).glob("server-*.log")):
        text = log.read_text(errors="replace").splitlines()
        start = next((i for i, line in enumerate(text) if line.startswith("Traceback")), None)
        if start is not None:
            return f"--- {log.name}\n" + "\n".join(text[start : start + lines])
    return "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-10:])
        for p in sorted(Path(log_dir).glob("server-*.log"))
    )


def brief(root: Path, systems: Sequence[str]) -> list[str]:
    """One line per (system, batch size, graph flag) the stage timer recorded: median wall per step."""
    lines = []
    for system in systems:
        folder = Path(root) / "stages" / system
        if not list(folder.glob("stages-*.json")):
            lines.append(f"{system}: no stage timings")
            continue
        for row in stages.load_timings(folder)["stages"]:
            wall = row["step_interval_ms"]["median"]
            lines.append(
                f"{system} bs={row['bs']} {'graph' if row['graph'] else 'eager'}: "
                f"{'--' if wall is None else f'{wall:.2f}'} ms per step over {row['n_blocks']} steps"
            )
    return lines


def card_name() -> str | None:
    """GPU 0's name as nvidia-smi gives it (the card of an uninstrumented phase, which has no stage timings)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"], capture_output=True, text=True
        )
    except OSError:
        return None
    name = out.stdout.strip() if out.returncode == 0 else ""
    return name or None


def pack(folder: Path, bundle: Path) -> Path:
    """folder -> bundle (tar.gz), written beside and renamed into place: whole or absent."""
    bundle.parent.mkdir(parents=True, exist_ok=True)
    tmp = bundle.with_name(f".{bundle.name}.tmp")
    with tarfile.open(tmp, "w:gz") as t:
        t.add(folder, arcname=folder.name)
    os.replace(tmp, bundle)
    return bundle


def run_phase(
    work: Path, phase: Phase, out: Path, deadline: paired.Deadline, *, launcher: Sequence[str] = (), log=print
) -> list[str]:
    """One phase (module docstring); returns its failures (empty: all of it measured)."""
    from sglang_lilicorr.train.engine import EngineError, SGLangServers, ServerSpec

    root = Path(work) / phase.name
    (root / "runs").mkdir(parents=True, exist_ok=True)
    os.environ.update(lab_env(os.environ))  # the servers inherit it: they load the lab's stage timer
    rows = prompts(max(phase.prompts.values()))
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    every = prompt_file.load(root / "prompts.jsonl")
    todo = {c: every[:n] for c, n in phase.prompts.items()}
    specs = [
        ServerSpec(
            str(Path(work) / "target"),
            PORT0 + i,
            "0",
            server_args(s, work, eager=phase.eager, kv_tokens=phase.kv_tokens),
            server_env(s, root, stage_timer=phase.stage_timer, forced_commit=phase.forced_commit),
            s,
        )
        for i, s in enumerate(phase.systems)
    ]
    for s in phase.systems if phase.stage_timer else ():
        (root / "stages" / s).mkdir(parents=True, exist_ok=True)
    t0, failures = time.time(), []
    try:
        with contextlib.ExitStack() as stack:
            for spec in specs:  # one at a time: each sizes its KV pool on what the earlier ones left
                timeout = max(60.0, min(900.0, deadline.left() - RESERVE_S))
                stack.enter_context(
                    SGLangServers.start([spec], root / "logs", startup_timeout=timeout, launcher=launcher)
                )
                log(f"[{phase.name}] {spec.name} up at t+{time.time() - t0:.0f} s")
            urls = {s: f"http://127.0.0.1:{spec.port}" for s, spec in zip(phase.systems, specs)}
            plan = paired.RoundPlan(
                "scale",
                phase.max_tokens,
                rounds=phase.rounds,
                api="ids",
                ignore_eos=True,
                request_timeout=120.0,
                reserve_s=RESERVE_S,
            )
            failures += paired.play_rounds(urls, todo, plan, root, deadline=deadline, log=log)
            if phase.stage_timer:
                failures += flush_stage_timers(urls)
    except EngineError as e:
        failures.append(f"servers: {e}")
        log(first_traceback(root / "logs"))
    rounds = paired.merge_rounds(root, phase.systems, todo, phase.rounds)
    for line in brief(root, phase.systems) if phase.stage_timer else ():
        log(f"[{phase.name}] {line}")
    save_json(
        root / "phase.json",
        {
            "phase": dataclasses.asdict(phase),
            "rounds_written": [p.name for p in rounds],
            "failures": failures,
            "seconds": round(time.time() - t0, 1),
            "gpu": card_name(),
            "forced_commit_len": phase.forced_commit,
            "prompt_tokens": PROMPT_TOKENS,
            "max_tokens": phase.max_tokens,
            "command": f"{sys.argv[0]} {shlex.join(sys.argv[1:])}",
            "server_args": {s: shlex.join(spec.args) for s, spec in zip(phase.systems, specs)},
            "server_env": {s: spec.env for s, spec in zip(phase.systems, specs)},
        },
    )
    bundle = pack(root, Path(out) / f"scale_{phase.name}.tar.gz")
    log(f"[{phase.name}] {len(rounds)} round file(s), {len(failures)} failure(s), {time.time() - t0:.0f} s -> {bundle}")
    return failures


def flush_stage_timers(urls: Mapping[str, str]) -> list[str]:
    """After the rounds: one prefill-only request per server, past the stage timer's idle time, so each writes the
    decode steps since its last dump (the servers are then killed, which skips their exit dump). The failures."""
    from benchmarks.instrumentation.stage_timer import IDLE_DUMP_S
    from benchmarks.served.gpu_client import post_json

    time.sleep(IDLE_DUMP_S + 0.5)
    failed = []
    for system, url in urls.items():
        try:
            # greedy: LILICORR refuses temperature > 0 where only the greedy verification is available
            request = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
            post_json(url, "/generate", request, timeout=60.0)
        except Exception as e:  # noqa: BLE001 -- reported with the phase's failures
            failed.append(f"{system}: the stage-timer flush failed: {type(e).__name__}: {e}"[:300])
    return failed


def measured(work: Path, phase: Phase) -> bool:
    """Whether an earlier call on this machine measured the whole phase (its phase.json: every round, no failure)."""
    done = Path(work) / phase.name / "phase.json"
    if not done.is_file():
        return False
    record = json.loads(done.read_text())
    return not record["failures"] and len(record["rounds_written"]) == phase.rounds


# --- command line --------------------------------------------------------------------------


def cmd_build(args) -> int:
    build(Path(args.work), layers=args.draft_layers, seed=args.seed)
    return 0


def cmd_run(args) -> int:
    deadline = paired.Deadline(args.deadline)
    launcher = shlex.split(os.environ.get("SCALE_LAUNCH", ""))  # tests: stand-ins that serve $PORT
    if not (Path(args.work) / "build.json").is_file():
        raise SystemExit(f"{args.work}: no build.json; run `build` first.")
    skipped, failed = [], False
    for name in args.phases:
        phase = PHASES[name]
        if measured(Path(args.work), phase):
            print(
                f"[{name}] measured in an earlier call: "
                f"{pack(Path(args.work) / name, Path(args.out) / f'scale_{name}.tar.gz')}"
            )
            continue
        if not deadline.allows(phase.budget_s):
            print(
                f"[{name}] {deadline.left():.0f} s left, the phase needs up to {phase.budget_s:.0f} s: "
                "run it in the next call."
            )
            skipped.append(name)
            continue
        failures = run_phase(Path(args.work), phase, Path(args.out), deadline, launcher=launcher)
        for line in failures:
            print(f"  {line}")
        failed |= bool(failures)
    if skipped:
        return 4
    return 1 if failed else 0


def phase_list(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in PHASES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"phases are a comma-separated list of {list(PHASES)}, got {text!r}")
    return names


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="the target's config.json and the random drafts")
    b.add_argument("--work", default="/tmp/scale")
    b.add_argument("--draft-layers", type=int, default=DRAFT_LAYERS)
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(func=cmd_build)
    r = sub.add_parser("run", help="measure phases on the GPU; each packs $OUT/scale_<phase>.tar.gz")
    r.add_argument("--work", default="/tmp/scale")
    r.add_argument("--phases", type=phase_list, required=True, help=f"comma-separated, from {list(PHASES)}")
    r.add_argument("--out", default=os.environ.get("OUT", "/tmp/scale_out"))
    r.add_argument(
        "--deadline",
        type=float,
        help="epoch seconds the call must end by (phases and rounds that would not fit are left out)",
    )
    r.set_defaults(func=cmd_run)
    args = p.parse_args(argv)
    return args.func(args)
