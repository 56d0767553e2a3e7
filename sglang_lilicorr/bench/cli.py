"""`lilicorr bench` subcommands: run, report, compare.

  lilicorr bench run --url http://127.0.0.1:30000 --system lilicorr --dataset gsm8k SPEED/qualitative.jsonl \
      --concurrency 1 2 4 8 16 32 --temperature 0 1 --seeds 0 1 2 --results runs/lilicorr.jsonl
  lilicorr bench report runs/ar.jsonl runs/dflash.jsonl runs/lilicorr.jsonl \
      --baseline ar --block-ref dflash --out report/
  lilicorr bench compare runs/ar.jsonl runs/lilicorr.jsonl

Every leaf parser sets `func`; `args.func(args)` returns the exit code."""

from __future__ import annotations

import json
import socket
import sys
import urllib.parse
from pathlib import Path
from typing import List

from . import datasets, metrics, plots, runner, tables
from .client import Sampling, ServerError
from .metrics import ResultsError
from .. import ownership
from ..cli_args import add_command, bounded, json_object_arg, path_arg, url_arg, with_help
from ..errors import LiLiCorrError, UsageError
from ..jsonl import loads

SUMMARY_CELL_FIELDS = metrics.CELL_KEY + ("tps",)


def load_cells(path: Path) -> List[dict]:
    """Cells of a results .jsonl or a `bench report` summary .json (missing: UsageError; empty: ResultsError)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(
            f"{path} is not a file",
            where=str(path),
            fix="pass results .jsonl files written by `lilicorr bench run` "
            "or a summary.json written by `lilicorr bench report`",
        )
    if path.suffix == ".jsonl":
        records = runner.read_results(path)
        if not records:
            raise ResultsError(
                "the results file holds no results", where=str(path), fix="run `lilicorr bench run` into it first"
            )
        return metrics.aggregate(records)
    try:
        doc = loads(path.read_bytes().decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON, too deep
        raise ResultsError(
            f"not valid JSON ({e})", where=str(path), fix="pass a summary.json written by `lilicorr bench report`"
        ) from e
    cells = doc.get("cells") if isinstance(doc, dict) else None
    whole = isinstance(cells, list) and all(isinstance(c, dict) and c.keys() >= set(SUMMARY_CELL_FIELDS) for c in cells)
    if not whole or not cells:
        raise ResultsError(
            f"neither a results .jsonl nor a summary .json with `cells` (each with {list(SUMMARY_CELL_FIELDS)})",
            where=str(path),
            fix="pass what `lilicorr bench run` or `lilicorr bench report` wrote",
        )
    return cells


def refuse_overwriting_inputs(inputs: List[Path], outputs: List[Path]) -> None:
    """A report never writes over the files it reads."""
    written = {p.resolve() for p in outputs}
    clash = [str(p) for p in inputs if Path(p).resolve() in written]
    if clash:
        raise UsageError(
            f"{clash[0]} is an input and would be overwritten", where="--out", fix="write the report to another --out"
        )


def check_listening(url: str) -> None:
    """Something accepts connections at `url`, else a ServerError (exit 1) before anything is written or sent."""
    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)), 10).close()
    except OSError as e:
        raise ServerError(
            f"nothing answers there ({e.strerror or e})", where=url, fix="start the server, or check --url"
        ) from e


def cmd_run(args) -> int:
    runner.check_results_file(args.results)  # before any server is asked or a byte written: a results file, or new
    try:
        loaded = [datasets.load_prompts(d, limit=args.limit, categories=args.category) for d in args.dataset]
    except LiLiCorrError:  # bad content of a prompt file: exit 1
        raise
    except (ValueError, OSError, ImportError) as e:  # a missing file, an unknown name: an argument that cannot work
        raise UsageError(
            " ".join(str(e).split()).rstrip("."), where="--dataset", fix="see `lilicorr bench run --help`"
        ) from e
    names = [n for n, _ in loaded]  # a run's records name the dataset by it: two files of one name would mix
    if len(set(names)) < len(names):
        raise UsageError(f"two prompt files named {max(names, key=names.count)!r}", where="--dataset", fix="rename one")
    multi_turn = [p.prompt_id for _, ps in loaded for p in ps if len(p.turns) > 1] if args.api == "ids" else []
    if multi_turn:
        raise UsageError(
            f"--api ids plays single-turn prompts only; {multi_turn[0]!r} has several turns",
            fix="pass single-turn prompts, or use --api chat / generate against a server with a tokenizer",
        )
    check_listening(args.url)
    with ownership.sole_writer(args.results, "--results", "results file"):
        failed = sweep(args, loaded)
    if failed:
        raise runner.RunFailed(
            f"{failed} prompt(s) failed and were not recorded",
            where=args.url,
            fix="check the server; rerun the same command to retry them",
        )
    print(f"results in {args.results}")
    return 0


def sweep(args, loaded) -> int:
    """The runs of `bench run` one after another, into --results -> the prompts that failed."""
    prompts, failed = dict(loaded), 0
    sampling_kwargs = dict(
        max_tokens=args.max_tokens, ignore_eos=args.ignore_eos, chat_template_kwargs=args.chat_template_kwargs
    )
    options = dict(api=args.api, model=args.model, warmup=args.warmup, request_timeout=args.request_timeout)
    for cfg in runner.sweep_configs(
        args.system, [n for n, _ in loaded], args.concurrency, args.temperature, args.seeds, args.max_tokens
    ):
        sampling = Sampling(temperature=cfg.temperature, seed=cfg.seed, **sampling_kwargs)
        outcome = runner.run(
            prompts[cfg.dataset], cfg, args.url, args.results, sampling, show_progress=not args.no_progress, **options
        )
        for prompt_id, error in outcome.failures[:3]:
            print(f"  failed {prompt_id}: {error}", file=sys.stderr)
        failed += len(outcome.failures)
        if len(outcome.failures) >= runner.MAX_FAILURES:
            print(
                f"stopping the sweep: {len(outcome.failures)} failures in one run; check the server at {args.url}.",
                file=sys.stderr,
            )
            break
    return failed


def is_compare_rows(path: Path) -> bool:
    """A file `bench compare --out` wrote: a JSON list of rows with a speedup."""
    try:
        rows = loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(rows, list) and all(isinstance(r, dict) and "speedup" in r for r in rows)


def cmd_report(args) -> int:
    out = Path(args.out)
    refuse_overwriting_inputs(args.results, [out / "summary.json", out / "report.md"])
    ownership.claim_report_folder(out, create=False)
    cells = metrics.pool_runs([load_cells(path) for path in args.results])  # a cell in several files: repeated runs
    if args.baseline and args.baseline not in {c["system"] for c in cells}:
        raise UsageError(
            f"--baseline {args.baseline!r} is not a system in the results",
            fix=f"pick one of {sorted({c['system'] for c in cells})}",
        )
    if args.block_ref:
        speculative = sorted({c["system"] for c in cells if c.get("block_ms") is not None})
        if args.block_ref not in speculative:
            raise UsageError(
                f"--block-ref {args.block_ref!r} is not a speculative system (one with spec stats) in the results",
                fix=f"pick one of {speculative}",
            )
        metrics.add_block_ratio(cells, args.block_ref)
        metrics.add_paired_ratios(cells, args.block_ref)  # repeated runs: each run's ratio, then mean and 95 % CI
    metrics.add_speedup(cells, args.baseline)
    if args.baseline:
        metrics.add_paired_ratios(cells, args.baseline, key="paired_speedup")  # each run's speedup, mean and 95 % CI
    markdown = tables.report(cells, args.baseline, args.block_ref)
    ownership.claim_report_folder(out)
    summary = {"baseline": args.baseline, "block_ref": args.block_ref, "cells": cells}
    ownership.write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    ownership.write_atomic(out / "report.md", markdown)
    pngs = [] if args.no_plots else plots.plot_all(cells, args.baseline, out)
    print(markdown)
    print(f"wrote {out / 'summary.json'}, {out / 'report.md'} and {len(pngs)} plot(s)")
    return 0


def cmd_compare(args) -> int:
    if args.out:
        refuse_overwriting_inputs([args.base, args.spec], [args.out])
        ownership.claim_file(args.out, is_compare_rows, "rows written by `bench compare --out`", "--out")
    rows = metrics.compare(load_cells(args.base), load_cells(args.spec))
    lines = [
        "| dataset | group | c | T | τ | ms / block | base TPS | TPS | speedup |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tau = "--" if r["tau"] is None else f"{r['tau']:.2f}"
        block = "--" if r.get("block_ms") is None else f"{r['block_ms']:.2f}"
        lines.append(
            f"| {r['dataset']} | {r['group']} | {r['concurrency']} | {r['temperature']:g} | {tau} | {block} "
            f"| {r['base_tps']:.0f} | {r['tps']:.0f} | {r['speedup']:.2f}x |"
        )
    print("\n".join(lines))
    if args.out:
        ownership.write_atomic(args.out, json.dumps(rows, indent=1))
    return 0


# the --help texts of `bench run`, `bench report` and `bench compare`, by option
RUN_HELP = {
    "url": "the server's base URL, e.g. http://127.0.0.1:30000",
    "system": "label of what the server runs, recorded with each result: ar, dflash, ...",
    "api": "chat: the server applies the chat template; generate: raw text to /generate; ids: the prompt's bytes as "
    "token ids to /generate (--skip-tokenizer-init servers)",
    "model": "the `model` field of chat requests",
    "request_timeout": "seconds per response (> 0)",
    "dataset": f"prompt sets: {', '.join(datasets.names())}, SPEED-Bench split files (.parquet / .jsonl) or prompt "
    "files (.jsonl, see benchmarks/README.md)",
    "limit": "a seeded sample of this many prompts per dataset (>= 1; default: all)",
    "category": "SPEED-Bench categories / entropy tiers (or prompt-file sets) to keep",
    "concurrency": "requests in flight, a run each (>= 1)",
    "temperature": "sampling temperatures; one run per value (each >= 0; 0 = greedy)",
    "seeds": "sampling seeds for T > 0, one run each (each >= 0; T = 0 runs the first only)",
    "max_tokens": "tokens per response, at most (>= 1)",
    "ignore_eos": "always generate --max-tokens tokens",
    "chat_template_kwargs": "JSON object for the chat template, e.g. '{\"enable_thinking\": false}'",
    "warmup": "unrecorded warm-up requests before each (c, T, seed) run: max(N, c) of them, rounded up to waves of c "
    "concurrent requests, so every batch size 1..c is met before timing (>= 0; 0 sends none)",
    "results": "results .jsonl, appended to (a rerun skips what it holds)",
    "no_progress": "no progress bar",
}
REPORT_HELP = {
    "results": "results .jsonl or summary .json files; a cell in several of them is a repeated run: the report shows "
    "the mean over runs (summary.json keeps the std and the count)",
    "baseline": "the system served without speculation; speedups are over it",
    "block_ref": "a speculative system (e.g. dflash) the per-block table divides the others' ms/block by",
    "out": "report folder (new, empty, or a report's)",
    "no_plots": "write the tables only, no plots",
}
COMPARE_HELP = {
    "base": "baseline results (.jsonl or summary .json)",
    "spec": "speculative results (.jsonl or summary .json)",
    "out": "also write the rows as JSON to this file",
}


def register(subparsers) -> None:
    """Adds `bench` with subcommands run / report / compare."""
    summary = "benchmark an SGLang server (SPEED-Bench, GSM8K, ...) and report tau / TPS / speedup"
    sub = add_command(subparsers, "bench", summary, __doc__).add_subparsers(dest="bench_command", required=True)

    run = add_command(sub, "run", "run prompts against a server; appends to a resumable results .jsonl")
    server = run.add_argument_group("server")
    server.add_argument("--url", type=url_arg, required=True)
    server.add_argument("--system", required=True)
    server.add_argument("--api", choices=["chat", "generate", "ids"], default="chat")
    server.add_argument("--model", default="default")
    server.add_argument("--request-timeout", type=bounded(float, 0, above=True), default=3600.0)
    data = run.add_argument_group("data")
    data.add_argument("--dataset", nargs="+", required=True)
    data.add_argument("--limit", type=bounded(int, 1))
    data.add_argument("--category", nargs="+")
    sweep = run.add_argument_group("sweep")
    sweep.add_argument("--concurrency", type=bounded(int, 1), nargs="+", default=[1])
    sweep.add_argument("--temperature", type=bounded(float, 0), nargs="+", default=[0.0])
    sweep.add_argument("--seeds", type=bounded(int, 0), nargs="+", default=[0])
    sweep.add_argument("--max-tokens", type=bounded(int, 1), default=1024)
    sweep.add_argument("--ignore-eos", action="store_true")
    sweep.add_argument("--chat-template-kwargs", type=json_object_arg, default={})
    sweep.add_argument("--warmup", type=bounded(int, 0), default=2, metavar="N")
    output = run.add_argument_group("output")
    output.add_argument("--results", type=path_arg, required=True)
    output.add_argument("--no-progress", action="store_true")
    with_help(run, RUN_HELP)
    run.set_defaults(func=cmd_run)

    rep = add_command(sub, "report", "markdown tables, summary.json and plots from results files")
    rep.add_argument("results", nargs="+", type=path_arg)
    systems = rep.add_argument_group("systems")
    systems.add_argument("--baseline")
    systems.add_argument("--block-ref")
    output = rep.add_argument_group("output")
    output.add_argument("--out", type=path_arg, default=Path("bench_report"))
    output.add_argument("--no-plots", action="store_true")
    with_help(rep, REPORT_HELP)
    rep.set_defaults(func=cmd_report)

    cmp_ = add_command(
        sub, "compare", "speedup (and ms per verification block) of a speculative run over a baseline run"
    )
    cmp_.add_argument("base", type=path_arg)
    cmp_.add_argument("spec", type=path_arg)
    cmp_.add_argument_group("output").add_argument("--out", type=path_arg)
    with_help(cmp_, COMPARE_HELP)
    cmp_.set_defaults(func=cmd_compare)
