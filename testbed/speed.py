"""Served throughput of LILICORR, DFLASH and the target without speculation on one GPU, in paired,
alternating rounds (the `speed` step of run.py; sglang_lilicorr.benchmarks.paired).

The three servers start once, side by side on GPU 0 (KV pools of KV_TOKENS each), the speculative
ones with the plugin's stage timer. For each concurrency c and round r every system plays the same
long-form prompts (greedy, --max-tokens new tokens), the order rotating every round, so no system is
always first or last; round r of every c goes to WORK/speed/round<r>.jsonl with all three systems, and
`lilicorr bench report` pairs them within each round: throughput ratios (to no speculation and to
DFLASH) with 95 % t intervals over the rounds. Each (server, c) gets a warm-up before its first round.
With --tau-check every evaluation prompt is then served once at c = 8 by the speculative servers (tau
through the server, beside the replay's). Stage tables per c come from the stage timer's files. Last, each
server is profiled for --profile-steps forward passes at c = 1 (benchmarks/step_profile.py: where a block's
time goes, LILICORR beside DFLASH and a plain decode step) -> WORK/speed/profile/{summary.json, profile.md}.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

SYSTEMS = ("base", "dflash", "lilicorr")
PORT0 = 32000
SPEED_SETS = ("writingbench",)  # long-form prompts; MT-Bench's writing questions fill up to SPEED_PROMPTS
SPEED_PROMPTS = 32
KV_TOKENS = 65536  # per server: 32 requests of <= 2k tokens; a fixed size, so servers starting together do not race for memory


def speed_prompts(eval_rows: list[dict]) -> list[dict]:
    """The long-form prompt file: every single-turn writing prompt, then MT-Bench writing first turns."""
    rows = [{"id": r["id"], "set": "speed", "text": r["text"]} for r in eval_rows if r["set"] in SPEED_SETS]
    writing = [r for r in eval_rows if r["set"] == "mtbench" and 81 <= int(r["id"].split("/")[1]) <= 90]
    rows += [{"id": r["id"] + "/1", "set": "speed", "text": r["messages"][0]["content"]} for r in writing]
    return rows[:SPEED_PROMPTS]


def prompts_for(c: int) -> int:
    """Prompts per run at concurrency c: a few waves at low c, the whole file from c = 8."""
    return min(SPEED_PROMPTS, max(8, 4 * c))


def server_args(base_args: str, system: str, drafts: Path) -> tuple[str, ...]:
    from common import set_flags, speculation_args

    args = set_flags(shlex.split(base_args), {"--mem-fraction-static": "0.9", "--cuda-graph-max-bs-decode": "32"})
    return (*args, "--max-running-requests", "32", "--max-total-tokens", str(KV_TOKENS), *speculation_args(system, drafts))


def profile_systems(urls: dict, root: Path, steps: int, prompt: str) -> list[str]:
    """One c = 1 torch-profiler window of `steps` forward passes per server -> root/summary.json, root/profile.md
    (LILICORR first, so the report's Python-frame differences read LILICORR - DFLASH); the failures."""
    from sglang_lilicorr.benchmarks import step_profile
    from sglang_lilicorr.jsonl import save_json

    summaries, failed = {}, []
    for system in ("lilicorr", "dflash", "base"):
        try:
            trace = step_profile.record(urls[system], root / system, steps, prompt)
            if trace is None:
                raise ValueError("the server wrote no trace")
            summaries[system] = step_profile.summarize(trace, steps)
        except (OSError, ValueError) as e:
            failed.append(f"{system} profile: {e}")
    if summaries:
        save_json(root / "summary.json", summaries)
        (root / "profile.md").write_text(step_profile.compare(summaries))
    return failed


def bench(*argv: str, cwd: Path) -> int:
    """`lilicorr bench ...` run from `cwd`, never the checkout (its plain sglang_lilicorr/ lacks the installed kernels/)."""
    return subprocess.call([sys.executable, "-m", "sglang_lilicorr.cli", "bench", *argv], cwd=cwd)


def run(args, base_server_args: str) -> int:
    import eval_sets
    from common import to_out

    from sglang_lilicorr.benchmarks import paired, prompt_file
    from sglang_lilicorr.jsonl import save_json
    from sglang_lilicorr.train.engine import SGLangServers, ServerSpec

    work = Path(args.work) / "speed"
    drafts = Path(args.work) / "drafts"
    missing = [s for s in SYSTEMS[1:] if not (drafts / s / "config.json").is_file()]
    if missing:
        raise SystemExit(f"{drafts}: no exported draft for {missing}; run `export` first.")
    rows = speed_prompts(eval_sets.read(Path(args.eval_prompts)))
    work.mkdir(parents=True, exist_ok=True)
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    every = prompt_file.load(work / "prompts.jsonl")
    prompts = {c: every[: prompts_for(c)] for c in args.concurrency}
    bs = ",".join(map(str, sorted(set(args.concurrency) | {8})))
    specs = [ServerSpec(args.target, PORT0 + i, "0", server_args(base_server_args, s, drafts),
                        {} if s == "base" else {"LILICORR_STAGE_TIMING": str(work / "stages" / s), "LILICORR_STAGE_TIMING_BS": bs}, s)
             for i, s in enumerate(SYSTEMS)]
    for s in SYSTEMS[1:]:
        (work / "stages" / s).mkdir(parents=True, exist_ok=True)
    url = {s: f"http://127.0.0.1:{PORT0 + i}" for i, s in enumerate(SYSTEMS)}
    failed = []
    launcher = shlex.split(os.environ.get("TESTBED_SERVER_LAUNCH", ""))  # tests: stand-ins that serve $PORT
    with contextlib.ExitStack() as stack:
        stack.enter_context(SGLangServers.start(specs, work / "logs", launcher=launcher, warm_first=True))
        failed += paired.play_rounds(url, prompts, paired.RoundPlan("speed", args.max_tokens, rounds=args.rounds), work,
                                     log=lambda line: print(line, flush=True))
        if args.tau_check:
            for system in SYSTEMS[1:]:
                if bench("run", "--url", url[system], "--system", system, "--dataset", str(args.eval_prompts),
                         "--results", str(work / "tau_check.jsonl"), "--concurrency", "8", "--temperature", "0",
                         "--max-tokens", str(args.max_tokens), "--warmup", "0", "--request-timeout", "300", "--no-progress", cwd=work):
                    failed.append(f"{system} tau check")
        if args.profile_steps:
            failed += profile_systems(url, work / "profile", args.profile_steps, rows[0]["text"])
    rounds = [str(p) for p in paired.merge_rounds(work, SYSTEMS, prompts, args.rounds)]
    rc = bench("report", *rounds, "--baseline", "base", "--block-ref", "dflash", "--out", str(work / "report"), cwd=work)
    if args.tau_check and (work / "tau_check.jsonl").is_file():
        rc |= bench("report", str(work / "tau_check.jsonl"), "--block-ref", "dflash", "--no-plots", "--out", str(work / "tau_check"), cwd=work)
    for c in args.concurrency if all(list((work / "stages" / s).glob("*.json")) for s in SYSTEMS[1:]) else []:
        rc |= bench("stages", "--timings", f"lilicorr={work / 'stages' / 'lilicorr'}", f"dflash={work / 'stages' / 'dflash'}",
                    "--bs", str(c), "--out", str(work / "stages" / f"c{c}"), cwd=work)
    save_json(work / "speed_run.json", {"concurrency": args.concurrency, "rounds": args.rounds, "max_tokens": args.max_tokens,
                                        "failed": failed, "server_args": {s: " ".join(spec.args) for s, spec in zip(SYSTEMS, specs)}})
    bundle = work / "speed_results.tar.gz"
    with tarfile.open(bundle, "w:gz") as t:
        for p in [*work.glob("round*.jsonl"), work / "tau_check.jsonl", work / "report", work / "tau_check", work / "stages",
                  work / "speed_run.json", work / "logs", work / "profile"]:
            if p.exists():
                t.add(p, arcname=str(p.relative_to(work)))
    to_out(args.out, bundle)
    print("\n".join(failed) or "[speed] every run finished")
    return 1 if failed or rc else 0
