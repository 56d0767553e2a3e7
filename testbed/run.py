"""The LiLiCorr testbed on SmolLM2-135M-Instruct: data -> train (4 variants) -> export -> eval -> tables.

  python testbed/run.py prompts                      CPU machine: held-out eval prompts -> testbed/eval_prompts.jsonl
  python testbed/run.py data                         training prompts (self-written + stdlib code/prose) + target's greedy replies
  python testbed/run.py train all --minutes 6        train every variant (resumes; stops cleanly at the time budget)
  python testbed/run.py export                       latest checkpoints -> WORK/drafts/<variant> (+ tars to $OUT)
  python testbed/run.py eval --minutes 6             tau with the reference decoder: all sets, T=0 and T=1 x 3 seeds
  python testbed/run.py tables                       markdown tables + JSON + plot (+ results tar to $OUT)

On the GPU machine run them through `bash testbed/gpu.sh STEP ...` (environment of the device kit).
Every step is resumable; `train` and `eval` stop at --minutes or at $TESTBED_DEADLINE (epoch
seconds, the end of the device call), whichever comes first. WORK defaults to /tmp/testbed, the target to /tmp/smol/model, $OUT receives
small copies of the results. See variants.py for sizes and the variants, checkpoints/README.md for the card.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tarfile
import time
from pathlib import Path

import eval_sets
from variants import SCALE, SCHEDULE, SYSTEMS, VARIANTS, check_variants


class TimeBudget(BaseException):
    """Raised by SIGALRM when a step's --minutes run out (BaseException: nothing swallows it)."""


def _alarm(_signum, _frame):
    raise TimeBudget()


def deadline(minutes: float) -> float:
    """Epoch seconds at which a step stops taking work: --minutes from now, or the whole device
    call's end, $TESTBED_DEADLINE (epoch seconds; set it at the start of a call), if earlier."""
    end = time.time() + 60 * minutes
    call_end = os.environ.get("TESTBED_DEADLINE")
    return min(end, float(call_end)) if call_end else end


def save_json(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1, default=str) + "\n")
    return path


def to_out(args, *paths: Path) -> None:
    """Copy small files into $OUT (the device call brings them back)."""
    if not args.out or not paths:
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for p in paths:
        shutil.copy(p, Path(args.out) / p.name)
        print(f"-> {Path(args.out) / p.name} ({p.stat().st_size / 2**20:.2f} MiB)")


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


# --- prompts (CPU machine) -------------------------------------------------------------------------


def cmd_prompts(args) -> int:
    rows = eval_sets.sample_sets(args.per_set, args.seed, args.max_chars)
    eval_sets.write(rows, Path(args.file))
    counts = {s: sum(r["set"] == s for r in rows) for s in eval_sets.SETS}
    print(f"{len(rows)} evaluation prompts -> {args.file}: {counts}")
    return 0


# --- data ------------------------------------------------------------------------------------------


def load_target(path: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if cuda else torch.float32)
    return model.to("cuda" if cuda else "cpu").eval(), AutoTokenizer.from_pretrained(path)


def cmd_data(args) -> int:
    from sglang_lilicorr.train.regenerate import regenerate, transformers_generator
    from training_prompts import disjoint, self_prompts, snippet_prompts

    work = Path(args.work) / "data"
    work.mkdir(parents=True, exist_ok=True)
    evaluation = eval_sets.read(Path(args.eval_prompts))
    held = work / "eval_prompts_chat.jsonl"
    held.write_text("".join(json.dumps({"id": r["id"], "messages": [{"role": "user", "content": r["text"]}]}) + "\n" for r in evaluation))
    prompts, summary_path = work / "prompts.jsonl", work / "data_summary.json"
    t0 = time.time()
    model, tokenizer = load_target(args.target)
    if not prompts.is_file():  # synthesis is seeded; the file is reused on resume
        own = self_prompts(model, tokenizer, args.self_prompts, args.prompt_tokens, args.gen_batch, args.seed)
        code, prose = snippet_prompts(args.code_prompts, args.prose_prompts, args.seed, args.stdlib_files, args.snippet_chars)
        rows, dropped = [], {}
        for source, texts in (("self", own), ("code", code), ("prose", prose)):
            kept, dropped[source] = disjoint(texts, [r["text"] for r in evaluation])
            rows += [{"id": f"{source}-{i}", "source": source, "messages": [{"role": "user", "content": t}]} for i, t in enumerate(kept)]
        rows.sort(key=lambda r: len(r["messages"][0]["content"]))  # similar lengths batch together
        save_json(summary_path, {"prompts": {s: sum(r["source"] == s for r in rows) for s in ("self", "code", "prose")},
                                 "dropped_overlapping_eval": dropped, "synthesis_s": time.time() - t0,
                                 "examples": {s: next((r["messages"][0]["content"][:300] for r in rows if r["source"] == s), None)
                                              for s in ("self", "code", "prose")}})
        staged = prompts.with_suffix(".tmp")  # the prompts file appears whole or not at all
        staged.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        os.replace(staged, prompts)
    summary = json.loads(summary_path.read_text())
    t1 = time.time()
    generate = transformers_generator(model, tokenizer, args.max_new_tokens)
    counts = regenerate(prompts, work / "train.jsonl", tokenizer, generate, exclude=held, batch_size=args.gen_batch, chat_kwargs={})
    replies = [json.loads(line) for line in (work / "train.jsonl").read_text().splitlines()]
    summary.update({
        "regenerate": counts, "regenerate_s": time.time() - t1, "conversations": len(replies),
        "finish_reasons": {k: sum(r["finish_reason"] == k for r in replies) for k in {r["finish_reason"] for r in replies}},
        "reply_tokens": sum(len(tokenizer(r["messages"][-1]["content"])["input_ids"]) for r in replies),
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "device": device_name(), "target": args.target,
    })
    save_json(summary_path, summary)
    print(json.dumps({k: summary[k] for k in ("prompts", "dropped_overlapping_eval", "conversations", "reply_tokens", "regenerate_s")}))
    to_out(args, summary_path)
    return 0


# --- train -----------------------------------------------------------------------------------------


def train_kwargs(args) -> dict:
    """SCALE + SCHEDULE + --override, frozen in WORK/train_config.json by the first train call so
    that every variant (and every resumed call) trains with identical settings."""
    kw = {**SCALE, **SCHEDULE}
    for item in args.override or []:
        key, _, value = item.partition("=")
        if key not in kw:
            raise SystemExit(f"--override {item!r}: unknown key; choose from {sorted(kw)}.")
        kw[key] = json.loads(value)
    frozen = Path(args.work) / "train_config.json"
    if frozen.is_file():
        saved = json.loads(frozen.read_text())
        if saved != kw:
            diff = sorted(k for k in set(saved) | set(kw) if saved.get(k) != kw.get(k))
            raise SystemExit(f"{frozen}: these runs used other settings ({diff}); variants must share them. "
                             f"Pass the same --override values, or use a new --work.")
    else:
        save_json(frozen, kw)
    return kw


def run_status(run_dir: Path, total: int) -> dict:
    from sglang_lilicorr.train.state import latest_checkpoint

    latest = latest_checkpoint(run_dir) if (run_dir / "latest").is_file() else None
    step = int(json.loads((latest / "train_state.json").read_text())["step"]) if latest else 0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] if (run_dir / "metrics.jsonl").is_file() else []
    return {"step": step, "total": total, "done": step >= total, "last_metrics": metrics[-1] if metrics else None}


def prune(run_dir: Path) -> None:
    """Keep only the latest complete checkpoint (and no half-written temporaries)."""
    root = run_dir / "checkpoints"
    if not (run_dir / "latest").is_file() or not root.is_dir():
        return
    keep = (run_dir / "latest").read_text().strip()
    for p in root.iterdir():
        if p.name != keep:
            shutil.rmtree(p, ignore_errors=True)


def cmd_train(args) -> int:
    from sglang_lilicorr.train.trainer import TrainConfig, train

    names = list(VARIANTS) if args.variants == ["all"] else check_variants(args.variants)
    kw = train_kwargs(args)
    data = Path(args.work) / "data" / "train.jsonl"
    if not data.is_file():
        raise SystemExit(f"{data}: no training data; run the `data` step first.")
    end = deadline(args.minutes)
    signal.signal(signal.SIGALRM, _alarm)
    summary_path = Path(args.work) / "train_summary.json"
    before = json.loads(summary_path.read_text())["variants"] if summary_path.is_file() else {}
    report = {}
    for name in names:
        run_dir = Path(args.work) / "runs" / name
        status = run_status(run_dir, kw["max_steps"])
        left = end - time.time()
        if not status["done"] and left > 5:
            cfg = TrainConfig(target=args.target, data=str(data), output_dir=str(run_dir), bf16=args.bf16, **kw, **VARIANTS[name])
            t0 = time.time()
            signal.alarm(max(1, int(left)))
            try:
                train(cfg)
                stopped = "finished"
            except TimeBudget:
                stopped = "time budget reached (rerun to resume)"
            finally:
                signal.alarm(0)
            prune(run_dir)
            status = run_status(run_dir, kw["max_steps"]) | {"seconds_this_call": time.time() - t0, "this_call": stopped}
        status["train_seconds"] = before.get(name, {}).get("train_seconds", 0.0) + status.get("seconds_this_call", 0.0)
        report[name] = status
        print(f"[train] {name}: step {status['step']}/{status['total']}" + (f" ({status.get('this_call')})" if "this_call" in status else ""))
    path = save_json(summary_path, {"device": device_name(), "config": kw, "variants": report})
    to_out(args, path)
    return 0 if all(v["done"] for v in report.values()) else 4


# --- export ----------------------------------------------------------------------------------------


def cmd_export(args) -> int:
    from sglang_lilicorr.drafter import load_draft
    from sglang_lilicorr.train.export import export_checkpoint

    names = list(VARIANTS) if args.variants == ["all"] else check_variants(args.variants)
    total = json.loads((Path(args.work) / "train_config.json").read_text())["max_steps"]
    tars = []
    for name in names:
        run_dir = Path(args.work) / "runs" / name
        status = run_status(run_dir, total)
        if status["step"] == 0:
            print(f"[export] {name}: no checkpoint yet, skipped")
            continue
        stamp = Path(args.work) / "drafts" / name / "testbed.json"
        if stamp.is_file() and json.loads(stamp.read_text())["step"] == status["step"]:
            print(f"[export] {name}: step {status['step']} already exported")
            continue
        draft = export_checkpoint(run_dir, Path(args.work) / "drafts" / name, "bfloat16")
        load_draft(draft)
        save_json(draft / "testbed.json", {"variant": name, "objective": VARIANTS[name], **{k: status[k] for k in ("step", "total", "done")}})
        tar = Path(args.work) / "drafts" / f"draft_{name}.tar"
        with tarfile.open(tar, "w") as t:
            t.add(draft, arcname=f"draft_{name}")
        print(f"[export] {name}: step {status['step']}/{total} -> {draft} ({tar.stat().st_size / 2**20:.1f} MiB tar)")
        tars.append(tar)
    if args.with_drafts:
        to_out(args, *tars)
    return 0


# --- eval ------------------------------------------------------------------------------------------


def eval_prompt_subset(rows: list[dict], per_set: int) -> list[dict]:
    """The first `per_set` prompts of each set, interleaved (set 1 #0, set 2 #0, ..., set 1 #1, ...),
    so that an evaluation stopped at its deadline still covers every set evenly."""
    by_set: dict[str, list[dict]] = {}
    for r in rows:
        by_set.setdefault(r["set"], []).append(r)
    return [group[i] for i in range(per_set) for group in by_set.values() if i < len(group)]


def cmd_eval(args) -> int:
    from tau_eval import evaluate, plan

    systems = list(SYSTEMS) if args.systems == ["all"] else args.systems
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}: choose from {sorted(SYSTEMS)} or 'all'.")
    drafts = Path(args.work) / "drafts"
    missing = sorted({SYSTEMS[s].variant for s in systems if not (drafts / SYSTEMS[s].variant / "config.json").is_file()})
    if missing:
        print(f"[eval] no exported draft for {missing}: their systems are skipped (run train + export).")
        systems = [s for s in systems if SYSTEMS[s].variant not in missing]
    prompts = eval_prompt_subset(eval_sets.read(Path(args.eval_prompts)), args.per_set)
    jobs = plan(systems, prompts, tuple(args.seeds))
    opts = {"target": args.target, "drafts": str(drafts), "result_dir": str(Path(args.work) / "eval"),
            "prompts": prompts, "jobs": [j.__dict__ for j in jobs], "max_new_tokens": args.max_new_tokens,
            "deadline": deadline(args.minutes)}
    t0 = time.time()
    counts = evaluate(opts, args.workers)
    print(f"[eval] {counts['done']}/{counts['planned']} jobs done ({counts['finished_now']} this call, {time.time() - t0:.0f} s)")
    save_json(Path(args.work) / "eval" / "eval_settings.json", {k: v for k, v in opts.items() if k not in ("jobs", "prompts", "deadline")}
              | {"per_set": args.per_set, "seeds": args.seeds, "systems": systems, "counts": counts, "device": device_name()})
    return 0 if counts["done"] == counts["planned"] else 4


# --- tables ----------------------------------------------------------------------------------------


def cmd_tables(args) -> int:
    from report import write_tables
    from tau_eval import read_rows

    work = Path(args.work)
    rows = read_rows(work / "eval")
    if not rows:
        raise SystemExit(f"{work / 'eval'}: no evaluation rows; run `eval` first.")
    devices = sorted({r.get("device", "?") for r in rows})
    settings = json.loads((work / "eval" / "eval_settings.json").read_text()) if (work / "eval" / "eval_settings.json").is_file() else {}
    provenance = (f"measured by the PyTorch reference decoder (sglang_lilicorr.reference, batch 1) on {', '.join(devices)}; "
                  f"{settings.get('max_new_tokens', '?')} new tokens, up to {settings.get('per_set', '?')} prompts per set; "
                  "each cell counts only the prompts every system finished (n_prompts in tables.json).")
    info = write_tables(rows, work / "report", provenance)
    print((work / "report" / "tables.md").read_text())
    tar = work / "testbed_results.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        for p in [work / "report", work / "eval", work / "train_config.json", work / "train_summary.json", work / "data" / "data_summary.json"]:
            if p.exists():
                t.add(p, arcname=str(p.relative_to(work)))
        for m in sorted((work / "runs").glob("*/metrics.jsonl")):
            t.add(m, arcname=str(m.relative_to(work)))
    print(json.dumps(info))
    to_out(args, tar, work / "report" / "tables.md")
    return 0


# --- CLI -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.environ.get("TESTBED_WORK", "/tmp/testbed"), help="work directory (default /tmp/testbed)")
    p.add_argument("--target", default=os.environ.get("TESTBED_TARGET", "/tmp/smol/model"), help="HF folder of the target")
    p.add_argument("--out", default=os.environ.get("OUT"), help="copy small results here (default $OUT)")
    p.add_argument("--eval-prompts", default=str(eval_sets.DEFAULT_FILE))
    sub = p.add_subparsers(dest="step", required=True)

    s = sub.add_parser("prompts", help="CPU machine: sample the evaluation sets into testbed/eval_prompts.jsonl")
    s.add_argument("--per-set", type=int, default=24)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-chars", type=int, default=3000, help="skip longer prompts")
    s.add_argument("--file", default=str(eval_sets.DEFAULT_FILE))
    s.set_defaults(func=cmd_prompts)

    s = sub.add_parser("data", help="training prompts + the target's greedy replies (resumable)")
    s.add_argument("--self-prompts", type=int, default=768, help="T=1 samples of the user-turn prefix")
    s.add_argument("--code-prompts", type=int, default=256)
    s.add_argument("--prose-prompts", type=int, default=128)
    s.add_argument("--stdlib-files", type=int, default=400, help="standard-library modules sampled for code/prose")
    s.add_argument("--snippet-chars", type=int, default=1500, help="longest code/prose snippet")
    s.add_argument("--prompt-tokens", type=int, default=64, help="max tokens of a self-written prompt")
    s.add_argument("--max-new-tokens", type=int, default=256, help="reply length cap")
    s.add_argument("--gen-batch", type=int, default=256)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_data)

    s = sub.add_parser("train", help="train variants (resumes from the last checkpoint)")
    s.add_argument("variants", nargs="+", help=f"{sorted(VARIANTS)} or all")
    s.add_argument("--minutes", type=float, default=8.0, help="stop (resumably) after this long")
    s.add_argument("--override", action="append", help="KEY=JSON over variants.SCALE/SCHEDULE (same for every variant)")
    s.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True, help="bf16 autocast (CUDA)")
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("export", help="latest checkpoints -> WORK/drafts/<variant> (SGLang draft dirs)")
    s.add_argument("variants", nargs="*", default=["all"])
    s.add_argument("--with-drafts", action=argparse.BooleanOptionalAction, default=True, help="copy draft tars to $OUT")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("eval", help="tau of every system with the reference decoder (resumable)")
    s.add_argument("--systems", nargs="+", default=["all"], help=f"{sorted(SYSTEMS)} or all")
    s.add_argument("--per-set", type=int, default=20)
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="T=1 seeds")
    s.add_argument("--workers", type=int, default=8, help="decoder processes sharing the GPU")
    s.add_argument("--minutes", type=float, default=7.0, help="workers take no new job after this long")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("tables", help="markdown tables + JSON + plot; results tar to $OUT")
    s.set_defaults(func=cmd_tables)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
