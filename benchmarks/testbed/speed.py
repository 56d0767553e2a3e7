"""Served speed as a user gets it (the `speed` step): no speculation, SGLang's DFLASH (the shipped DFlash draft),
SGLang's built-in LiLiCorr head (DFLASH serving our LiLiCorr draft) and LILICORR (the same draft), and beside them the
two verify-attention variants (serve_speed.VERIFY_SYSTEMS: DFLASH on SGLang's split-KV verify kernel, LILICORR on
SGLang's prefill kernel) and, where named, LILICORR committing each block by the exact Viterbi path
(serve_speed.WALK_SYSTEMS: lilicorr_viterbi), in paired, rotated rounds on one GPU (benchmarks.served.paired,
serve_speed). --systems picks some of them (default: the six, SYSTEMS; always in CHOICES' order): base and lilicorr must
be among them (REQUIRED: serve_speed.summarize keeps only the cells where both ran, and the report's baseline is base),
so `--systems base dflash builtin lilicorr` leaves out the verify variants and `--systems base lilicorr lilicorr_fixed
lilicorr_w1` the other engines too (fewer servers: a shorter start-up and rounds). A setting's calls must all play the
same systems: the first records them in WORK/speed/SETTING/speed_run.json ("systems", before its servers start), and a
later call that holds a different set is refused (the rounds pair the systems within a round; calls from before
--systems played all six), so another set needs another --work. Every server gets --server-args (with run.py's
--attention-backend / --sampling-backend applied) under the step's pool, graph and speculation flags; a setting's rounds
served with another target attention backend than the kit's Triton live in WORK/speed/SETTING_BACKEND
(graphs32_flashinfer: setting_folder), and a call whose --server-args differ from those its setting's earlier calls
recorded ("base_server_args") is refused, so Triton and flashinfer rounds are never paired or summarized together.

The chosen servers start once, side by side on GPU 0 (fixed KV pools: server_args; a Triton cache each, so every
start-up on a fresh machine is cold), with SGLang's --sleep-on-idle: an
idle server blocks instead of spinning, and the step records the CPU seconds every idle server spent while another
one played (idle_cpu_s in speed_summary.json: the evidence that they do not disturb each other). No stage timer,
profiler or recorder runs in the throughput rounds. For each concurrency c and round r every system plays the same
prompts (greedy, --max-tokens new tokens, ignore_eos off), the order rotating every round; round r of every c goes to
WORK/speed/SETTING/round<r>.jsonl. --prompt-set writing (default) plays long-form writing prompts (speed_prompts:
LILICORR's tau 1.5 with the shipped drafts), `eval` the project's six evaluation sets interleaved (eval_prompts: tau
2.2), `writing eval` both, one after the other with the servers up once (a set the deadline leaves no room for waits
for the next call); an eval
setting's rounds live in WORK/speed/SETTING_eval (setting_folder), never paired or summarized with the writing rounds
(each set its own summary, table, report and bundle; the call's server logs, tau check and profile go with the first
set's). A run at c plays prompts_for(c) prompts and at least c (run_prompts: the set cycled where it has fewer, so
the batch reaches c): at c = 32 on the writing set one wave, whose wall is its slowest request. --sustained plays 4c
(at least 16; the set cycled) so the batch stays at c for most of the run, as a server under steady load (its rounds
in WORK/speed/SETTING[_eval]_sustained: never paired with a wave's).
--setting graphs32 captures CUDA graphs up to batch 32 (every c graph-replayed); graphs16 stops them at 16, so c = 32
runs the eager path; graphs64 captures them to 64 and admits 64 requests (c = 1 to 64, graph-replayed; a KV pool of
KV_TOKENS_PER_REQUEST a request). With --greedy-check every reply's token ids are recorded (the chat API's sglext) and,
once the servers stop, each distinct reply is checked against the fp32 target (benchmarks/served/greedy_ulps.py): the
summary's `greedy` holds per c and system the worst deviation in bf16 ulps. Then, in their own pass, each server is
profiled for --profile-steps forward passes at c = 1 (with --tau-check, every evaluation prompt is first served
once at c = 8 by the speculative servers: tau through the server, beside the replay's) (benchmarks/step_profile.py:
the host and GPU timeline of the same steps, LILICORR beside the built-in), where $TESTBED_DEADLINE still leaves time
for it. A setting may take several device calls (--concurrency a few at a time): each call's rounds stop before the
deadline, leaving the tau check its time (TAU_CHECK_S a server), which stops at the deadline too and resumes in the
next call (common.served_tau); the summary takes every concurrency the setting's calls played. Writes
speed_summary.json (serve_speed.summarize: tok/s, paired ratios with 95 % intervals, tau, per c), speed_table.md,
speed.png, the graph-capture seconds of every server, and `lilicorr bench report`'s tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shlex
import tarfile
from pathlib import Path

from benchmarks.served.serve_speed import ALL_SYSTEMS as CHOICES
from benchmarks.served.serve_speed import REQUIRED  # in every summarized cell
from benchmarks.served.serve_speed import SYSTEMS as ENGINES
from benchmarks.served.serve_speed import VERIFY_SYSTEMS

from .common import Step, enough_time

SYSTEMS = (*ENGINES, *VERIFY_SYSTEMS)  # the default six (WALK_SYSTEMS only where named)

PORT0 = 32000
SETTINGS = {"graphs32": 32, "graphs16": 16, "graphs64": 64}  # --cuda-graph-max-bs-decode of each setting
DEFAULT_CONCURRENCY = {"graphs32": [1, 4, 8, 16, 32], "graphs16": [32], "graphs64": [1, 4, 8, 16, 32, 64]}
PROMPT_SETS = ("writing", "eval")  # long-form writing (speed_prompts), the six evaluation sets (eval_prompts)
SPEED_SETS = ("writingbench",)  # long-form prompts; MT-Bench's writing questions fill up to SPEED_PROMPTS
SPEED_PROMPTS = 32
GREEDY_CHECK_S = 45.0  # the rounds leave the greedy check this (the target loaded, ~400 distinct replies on a GPU)
AFTER_CHECK_S = 30.0  # the greedy check stops this long before the deadline: the report and the bundle
# the tau check's time per speculative server: every evaluation prompt at c = 8 took ~25 s on an H200 (55k tokens
# at ~2,200 tok/s: benchmarks/results/testbed/h200x2_5ff6f18/speed/tau_check/), with room for a slower card
TAU_CHECK_S = 45.0
# a server's KV pool: 2k tokens for each request it admits (65,536 at 32); a fixed size, so servers starting together do
# not race for memory
KV_TOKENS_PER_REQUEST = 2048


def speed_prompts(eval_rows: list[dict]) -> list[dict]:
    """The long-form prompt file: every single-turn writing prompt, then MT-Bench writing first turns."""
    rows = [{"id": r["id"], "set": "speed", "text": r["text"]} for r in eval_rows if r["set"] in SPEED_SETS]
    writing = [r for r in eval_rows if r["set"] == "mtbench" and 81 <= int(r["id"].split("/")[1]) <= 90]
    rows += [{"id": r["id"] + "/1", "set": "speed", "text": r["messages"][0]["content"]} for r in writing]
    return rows[:SPEED_PROMPTS]


def eval_prompts(eval_rows: list[dict]) -> list[dict]:
    """The evaluation prompt file: every evaluation prompt (MT-Bench's two turns as they are), the sets interleaved
    in the file's order of sets (the first n prompts hold every set about equally), one group ("eval": a run plays
    them as one phase)."""
    by_set: dict[str, list[dict]] = {}
    for r in eval_rows:
        by_set.setdefault(r["set"], []).append(r)
    sets = list(by_set.values())
    return [{**rs[k], "set": "eval"} for k in range(max(map(len, sets))) for rs in sets if k < len(rs)]


def prompts_for(c: int) -> int:
    """Prompts per run at concurrency c: 16 at c <= 4 (request-to-request host jitter is of the order of the effects
    measured at c = 1), the whole file from c = 8."""
    return min(SPEED_PROMPTS, max(16, 4 * c))


def run_prompts(every: list, c: int, sustained: bool = False) -> list:
    """The prompts a run at c plays: the first prompts_for(c) of the set, and at least c (`sustained`: 4c, at least
    16), the set cycled past its end (the k-th copy of a prompt named <id>#k), so the running batch reaches c."""
    n = max(16, 4 * c) if sustained else max(min(len(every), prompts_for(c)), c)
    return [
        p if i < len(every) else dataclasses.replace(p, prompt_id=f"{p.prompt_id}#{i // len(every) + 1}")
        for i, p in ((i, every[i % len(every)]) for i in range(n))
    ]


def chosen_systems(given) -> list[str]:
    """--systems in CHOICES' order (None: SYSTEMS); a set without all of REQUIRED is refused."""
    given = list(SYSTEMS if given is None else given)
    unknown = [s for s in given if s not in CHOICES]
    missing = [s for s in REQUIRED if s not in given]
    if unknown or missing:
        fix = [s for s in CHOICES if s in given or s in REQUIRED]
        raise SystemExit(
            f"speed: --systems {' '.join(given)} "
            + (f"names no speed system {' '.join(unknown)} (of {' '.join(CHOICES)})" if unknown else "")
            + (" and " if unknown and missing else "")
            + (f"lacks {' '.join(missing)}" if missing else "")
            + f"; base and lilicorr are every summarized cell's: pass --systems {' '.join(fix)}"
        )
    return [s for s in CHOICES if s in given]


def earlier_record(work: Path) -> dict | None:
    """What the earlier calls of this setting (work) recorded in speed_run.json before their servers started ({} for
    calls that predate the record); None where work/runs holds no run yet."""
    if not any((work / "runs").glob("c*_r*_*.jsonl")):
        return None
    record = work / "speed_run.json"
    return json.loads(record.read_text()) if record.is_file() else {}


def earlier_systems(work: Path) -> list[str] | None:
    """The systems an earlier call of this setting played (earlier_record's "systems"; all of SYSTEMS where it has
    none: calls from before --systems played all six), None where none was played yet."""
    record = earlier_record(work)
    return None if record is None else list(record.get("systems", SYSTEMS))


def setting_folder(setting: str, server_args: str, prompt_set: str = "writing", sustained: bool = False) -> str:
    """The folder of a setting's rounds under WORK/speed: the setting's name, then _eval for the evaluation prompt set,
    _BACKEND for a target attention other than the kit's Triton (graphs32_flashinfer, graphs64_eval) and _sustained for
    --sustained: rounds of two prompt sets, backends or loads never share a folder, so they are never paired, merged or
    summarized together."""
    from .common import KIT_BACKENDS, backends_of

    attention = backends_of(server_args)["attention"]
    return (
        setting
        + ("" if prompt_set == "writing" else f"_{prompt_set}")
        + ("" if attention == KIT_BACKENDS["attention"] else f"_{attention}")
        + ("_sustained" if sustained else "")
    )


def speed_folders(args) -> dict[str, Path]:
    """{prompt set: WORK/speed/<setting_folder>} of this call's --prompt-set(s), in the order given (--setting and
    --server-args name the folders too)."""
    sets = dict.fromkeys(getattr(args, "prompt_set", None) or ["writing"])
    sustained = getattr(args, "sustained", False)
    folder = lambda name: setting_folder(args.setting, base_args(args), name, sustained)  # noqa: E731
    return {name: Path(args.work) / "speed" / folder(name) for name in sets}


def base_args(args) -> str:
    """This call's --server-args (the backends applied), normalized: the record a resumed setting must match."""
    from .common import SERVER_ARGS

    return shlex.join(shlex.split(getattr(args, "server_args", None) or SERVER_ARGS))


def systems_for(args) -> list[str]:
    """The systems of this call: --systems (chosen_systems), refused where an earlier call of one of its setting
    folders (speed_folders) played another set (its rounds pair the systems within each round; merging them is not
    done) or served its rounds with other --server-args (another backend, pool or graph flag would mix unlike
    rounds)."""
    systems = chosen_systems(getattr(args, "systems", None))
    for work in speed_folders(args).values():
        earlier = earlier_systems(work)
        if earlier is not None and earlier != systems:
            raise SystemExit(
                f"speed: {work} holds rounds of --systems {' '.join(earlier)} (speed_run.json), not "
                f"{' '.join(systems)}: pass --systems {' '.join(earlier)} to resume that setting, or another --work"
            )
        before, now = (earlier_record(work) or {}).get("base_server_args"), base_args(args)
        if before is not None and before != now:
            raise SystemExit(
                f"speed: {work} holds rounds served with --server-args {before!r} (speed_run.json), not {now!r}: pass "
                "the same --server-args and backends to resume that setting, or another --work"
            )
    return systems


def server_args(base_args: str, system: str, drafts: Path, graphs_to: int) -> tuple[str, ...]:
    """A speed server's arguments: CUDA graphs to `graphs_to`, max(32, graphs_to) requests admitted (graphs16's c = 32
    runs eager), a KV pool of KV_TOKENS_PER_REQUEST each, idle servers asleep, the system's speculation."""
    from .common import set_flags, speculation_args

    args = set_flags(
        shlex.split(base_args), {"--mem-fraction-static": "0.9", "--cuda-graph-max-bs-decode": str(graphs_to)}
    )
    running = max(32, graphs_to)
    return (
        *args,
        "--max-running-requests",
        str(running),
        "--max-total-tokens",
        str(KV_TOKENS_PER_REQUEST * running),
        "--sleep-on-idle",
        *speculation_args(system, drafts),
    )


class IdleWatch:
    """CPU seconds each idle server's process tree spends while another server plays
    (serve_speed.process_tree_cpu_s)."""

    def __init__(self, pids: dict) -> None:
        self.pids, self.spent = pids, {s: 0.0 for s in pids}

    def __call__(self, playing: str, c: int, r: int):
        from benchmarks.served.serve_speed import process_tree_cpu_s

        idle = {s: pid for s, pid in self.pids.items() if s != playing}
        before = {s: process_tree_cpu_s(pid) for s, pid in idle.items()}

        def done() -> None:
            for s, pid in idle.items():
                self.spent[s] += process_tree_cpu_s(pid) - before[s]

        return done


def profile_systems(urls: dict, root: Path, steps: int, prompt: str) -> list[str]:
    """One c = 1 torch-profiler window of `steps` forward passes per server -> root/summary.json, root/profile.md;
    the failures. The report's Python-frame differences read its first two: LILICORR at width 1 - no speculation
    where width 1 played (a chain of plain forwards through the speculative path against plain decode steps), else
    LILICORR - built-in."""
    from benchmarks.served import step_profile
    from benchmarks import save_json

    first = ("lilicorr_w1", "base") if "lilicorr_w1" in urls else ("lilicorr", "builtin")
    order = dict.fromkeys((*first, "lilicorr", "builtin", "dflash", "base"))
    summaries, failed = {}, []
    for system in [s for s in order if s in urls]:
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


def call_key(concurrency: list[int], recorded: dict) -> str:
    """The key of this call's start-up and idle-CPU records: its concurrencies ("c=1,4"), with " #n" for the n-th
    call that played the same ones (a resumed setting), so no call's record replaces an earlier one's (the first is
    the cold start-up)."""
    call = "c=" + ",".join(map(str, concurrency))
    n = sum(1 for k in recorded if k == call or k.startswith(call + " #"))
    return f"{call} #{n + 1}" if n else call


@dataclasses.dataclass
class SetPlay:
    """One prompt set of a call: its setting folder, its prompts (bench Prompts, in file order), the runs this call
    plays ({c: prompts}), those of every c its folder's calls played, and the CPU its idle servers spent."""

    name: str
    work: Path
    every: list
    prompts: dict
    every_c: dict
    watch: IdleWatch | None = None


def open_set(args, name: str, work: Path, systems: list[str], concurrency: list[int]) -> SetPlay:
    """A prompt set's folder made ready: this call's systems, server args and set on record in speed_run.json before any
    round is played (a later call of the setting must play the same ones), its prompt file written."""
    from . import eval_sets

    from sglang_lilicorr.bench import prompt_file
    from benchmarks import save_json

    rows = (speed_prompts if name == "writing" else eval_prompts)(eval_sets.read(Path(args.eval_prompts)))
    work.mkdir(parents=True, exist_ok=True)
    record = json.loads((work / "speed_run.json").read_text()) if (work / "speed_run.json").is_file() else {}
    save_json(
        work / "speed_run.json", {**record, "systems": systems, "base_server_args": base_args(args), "prompt_set": name}
    )
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    every = prompt_file.load(work / "prompts.jsonl")
    # the concurrencies earlier calls of this setting played count too (a setting may take several device calls)
    played = {int(p.name.split("_")[0][1:]) for p in (work / "runs").glob("c*_r*_*.jsonl")}
    return SetPlay(
        name,
        work,
        every,
        {c: run_prompts(every, c, getattr(args, "sustained", False)) for c in concurrency},
        {c: run_prompts(every, c, getattr(args, "sustained", False)) for c in sorted(played | set(concurrency))},
    )


def run(args, base_server_args: str) -> int:
    from .common import served_tau, variant_env

    from benchmarks.served import greedy_ulps, paired

    from sglang_lilicorr.train.engine import SGLangServers, ServerSpec

    drafts = Path(args.work) / "drafts"
    missing = [s for s in ("dflash", "lilicorr") if not (drafts / s / "config.json").is_file()]
    if missing:
        raise SystemExit(f"{drafts}: no exported draft for {missing}; run `export` first.")
    systems = systems_for(args)
    concurrency = args.concurrency or DEFAULT_CONCURRENCY[args.setting]
    plays = [open_set(args, name, work, systems, concurrency) for name, work in speed_folders(args).items()]
    first = plays[0].work  # the call's server logs, tau check and profile
    deadline = paired.Deadline(float(os.environ["TESTBED_DEADLINE"])) if os.environ.get("TESTBED_DEADLINE") else None
    # the profile pass, the report, stopping the servers; the greedy check's start (its replies stop at the deadline)
    after_tau_s = 60.0 + (45.0 if args.profile_steps else 0.0) + (GREEDY_CHECK_S if args.greedy_check else 0.0)
    # the rounds leave the tau check its time too (TAU_CHECK_S a speculative server)
    after_rounds_s = after_tau_s + (TAU_CHECK_S * sum(s != "base" for s in systems) if args.tau_check else 0.0)
    # each server its own Triton cache: a server's start-up on a fresh machine compiles all it needs itself (the
    # servers start together, and one would otherwise find kernels another had just built)
    caches = {s: first.parent / "triton_cache" / s for s in systems}
    # a start-up is a cold one only where the server's Triton cache held nothing before it (serve_speed's startup_s)
    cold = {s: not (caches[s].is_dir() and any(caches[s].iterdir())) for s in systems}
    specs = [
        ServerSpec(
            args.target,
            PORT0 + i,
            "0",
            server_args(base_server_args, s, drafts, SETTINGS[args.setting]),
            {**variant_env(s), "TRITON_CACHE_DIR": str(caches[s])},
            s,
        )
        for i, s in enumerate(systems)
    ]
    url = {s: f"http://127.0.0.1:{PORT0 + i}" for i, s in enumerate(systems)}
    failed = []
    launcher = shlex.split(args.server_launch or "")  # tests: stand-ins that serve $PORT
    with contextlib.ExitStack() as stack:
        servers = stack.enter_context(SGLangServers.start(specs, first / "logs", launcher=launcher, warm_first=True))
        plan = paired.RoundPlan(
            "speed", args.max_tokens, rounds=args.rounds, reserve_s=after_rounds_s, record_ids=args.greedy_check
        )
        for play in plays:  # the sets in the order given; one the deadline leaves no room for waits for the next call
            play.watch = IdleWatch({s: p.pid for s, p in zip(systems, servers.processes)})
            if any(line.startswith("deadline:") for line in failed):
                failed.append(f"deadline: the {play.name} set not played")
                continue
            failed += paired.play_rounds(
                url,
                play.prompts,
                plan,
                play.work,
                deadline=deadline,
                log=lambda line: print(line, flush=True),
                watch=play.watch,
            )
        if args.tau_check:
            failed += served_tau(
                url,
                {0.0: (0,)},
                eval_prompts=Path(args.eval_prompts),
                results=first / "tau_check.jsonl",
                concurrency=8,
                max_tokens=args.max_tokens,
                deadline=deadline,
                reserve_s=after_tau_s,
            )
        if args.profile_steps and (deadline is None or deadline.allows(after_tau_s)):
            failed += profile_systems(url, first / "profile", args.profile_steps, plays[0].every[0].turns[0])
    check = functools.cache(lambda: greedy_ulps.fp32_check(args.target))  # the target loaded once, where needed
    rc = 0
    for play in plays:
        rc |= finish_set(args, play, systems, specs, first / "logs", cold, failed, check if args.greedy_check else None)
    print("\n".join(failed) or "[speed] every run finished")
    return 1 if failed or rc else 0


def finish_set(args, play: SetPlay, systems, specs, logs_dir: Path, cold: dict, failed: list, check) -> int:
    """A set's rounds merged and summarized (with `check`, a greedy check's loader, its replies checked while the
    deadline allows), the call's start-up, idle-CPU and late-compile records beside the summary, the table, plot and
    `bench report`, speed_run.json (with the call's failures, this check's included) and the set's bundle in $OUT;
    -> the reports' exit codes."""
    from .common import backends_of, bench, to_out

    from benchmarks.served import greedy_ulps, paired, serve_speed

    from benchmarks import save_json

    work, folder = play.work, play.work.name
    rounds = [str(p) for p in paired.merge_rounds(work, systems, play.every_c, args.rounds)]
    records = [[json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()] for p in rounds]
    summary = serve_speed.summarize(records)
    if check is not None:
        deadline = float(os.environ["TESTBED_DEADLINE"]) if os.environ.get("TESTBED_DEADLINE") else None
        failed += greedy_check(check, records, work, paired.Deadline(deadline))
        greedy = greedy_ulps.summarize(
            (r for rs in records for r in rs), greedy_ulps.read_cache(work / greedy_ulps.CACHE)
        )
        for c, entry in summary.items():
            entry["greedy"] = greedy.get(c, {})
    earlier = json.loads((work / "speed_summary.json").read_text()) if (work / "speed_summary.json").is_file() else {}
    concurrency = sorted(play.prompts)
    call = call_key(concurrency, earlier.get("capture_s", {}))
    logs = {
        s: (logs_dir / f"server-{s}.log").read_text(errors="replace")
        for s in systems
        if (logs_dir / f"server-{s}.log").is_file()
    }
    capture = {s: serve_speed.capture_seconds(text) | {"cold_cache": cold[s]} for s, text in logs.items()}
    late = {s: serve_speed.late_compiles(text) for s, text in logs.items()}
    save_json(
        work / "speed_summary.json",
        {
            "setting": args.setting,
            "folder": folder,
            "prompt_set": play.name,
            "graphs_to": SETTINGS[args.setting],
            "backends": backends_of(args.server_args),
            "server_args": base_args(args),
            "summary": summary,
            "capture_s": {**earlier.get("capture_s", {}), call: capture},
            "idle_cpu_s": {
                **earlier.get("idle_cpu_s", {}),
                call: {s: round(v, 2) for s, v in play.watch.spent.items()},
            },
            "late_compiles": {**earlier.get("late_compiles", {}), call: late},
        },
    )
    census = ", ".join(
        f"{s} {sum(k.values())}" + (" (" + ", ".join(f"{name} {n}" for name, n in k.items()) + ")" if k else "")
        for s, k in late.items()
    )
    (work / "speed_table.md").write_text(
        serve_speed.table(summary, f"{folder} (CUDA graphs to batch {SETTINGS[args.setting]})")
        + f"\nTriton compiles after serving started (SGLang's warning), this call's servers: {census}\n"
    )
    if summary:
        serve_speed.plot({args.setting: summary}, work / "speed.png")
    print((work / "speed_table.md").read_text())
    rc = bench(
        "report", *rounds, "--baseline", "base", "--block-ref", "dflash", "--out", str(work / "report"), cwd=work
    )
    if args.tau_check and (work / "tau_check.jsonl").is_file():
        rc |= bench(
            "report",
            str(work / "tau_check.jsonl"),
            "--block-ref",
            "dflash",
            "--no-plots",
            "--out",
            str(work / "tau_check"),
            cwd=work,
        )
    save_json(
        work / "speed_run.json",
        {
            "setting": args.setting,
            "folder": folder,
            "prompt_set": play.name,
            "systems": systems,
            "base_server_args": base_args(args),
            "concurrency": concurrency,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "failed": failed,
            "server_args": {s: " ".join(spec.args) for s, spec in zip(systems, specs)},
            "server_env": {s: dict(spec.env) for s, spec in zip(systems, specs)},
        },
    )
    bundle = work / f"speed_{folder}.tar.gz"
    with tarfile.open(bundle, "w:gz") as t:
        for p in [
            *work.glob("round*.jsonl"),
            work / "report",
            work / "tau_check.jsonl",
            work / "tau_check",
            work / "speed_summary.json",
            work / "speed_table.md",
            work / "speed.png",
            work / "speed_run.json",
            work / greedy_ulps.CACHE,
            work / "logs",
            work / "profile",
        ]:
            if p.exists():
                t.add(p, arcname=str(p.relative_to(work)))
    to_out(args.out, bundle)
    return rc


def greedy_check(check, records: list[list[dict]], work: Path, deadline) -> list[str]:
    """Checks the rounds' replies not yet checked (`check()`: the fp32 target's check, loaded on first use) into
    work/CACHE while the deadline leaves AFTER_CHECK_S (the report and the bundle); the line saying what it left, if
    it left any."""
    from benchmarks.served import greedy_ulps

    every = [r for rs in records for r in rs]
    done = greedy_ulps.read_cache(work / greedy_ulps.CACHE)
    todo = {greedy_ulps.reply_key(t) for _, t in greedy_ulps.replies(every)} - set(done)
    print(f"[speed] greedy check of {work.name}: {len(todo)} distinct replies to check", flush=True)
    if todo and deadline.allows(AFTER_CHECK_S):
        greedy_ulps.check_new(every, work / greedy_ulps.CACHE, check(), lambda: deadline.allows(AFTER_CHECK_S))
    left = todo - set(greedy_ulps.read_cache(work / greedy_ulps.CACHE))
    return [f"greedy check: {len(left)} distinct replies not checked (deadline): call the step again"] if left else []


def cmd_speed(args) -> int:
    if args.profile_steps < 0:
        raise SystemExit(f"--profile-steps must be >= 0 (0: no profile), got {args.profile_steps}")
    systems = len(systems_for(args))  # refuses a set without the four summarized systems, or a resumed other set
    # minutes: the servers' start-up side by side (2.5 for all six), a round of a cell (0.2 for six), the profile pass,
    # the greedy check. A call needs the time to play one round; the rounds stop at the deadline and the next call of
    # the setting resumes them
    startup, per_round = 1.0 + 0.25 * systems, 0.2 * systems / len(SYSTEMS)
    after = (0.5 if args.profile_steps else 0.0) + (GREEDY_CHECK_S / 60 if args.greedy_check else 0.0)
    enough_time("speed", startup + per_round + after)
    return run(args, args.server_args)


def arguments(parser) -> None:
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=CHOICES,
        default=None,
        help=f"the servers (default: all but lilicorr_viterbi; played in the order {' '.join(CHOICES)}); "
        "base and lilicorr must be among them, and a setting's calls must all name the same",
    )
    parser.add_argument(
        "--setting",
        choices=tuple(SETTINGS),
        default="graphs32",
        help="CUDA graphs up to batch 32, or to 16 (c = 32 then runs the eager path), or to 64 (64 requests admitted)",
    )
    parser.add_argument(
        "--prompt-set",
        nargs="+",
        choices=PROMPT_SETS,
        default=["writing"],
        help="long-form writing prompts, the six evaluation sets interleaved (the rounds in "
        "WORK/speed/SETTING_eval), or both: played in the order given with the servers up once",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        help="default: 1 4 8 16 32 (graphs32), 32 (graphs16), 1 4 8 16 32 64 (graphs64)",
    )
    parser.add_argument(
        "--sustained",
        action="store_true",
        help="each run plays 4c prompts (at least 16, the set cycled): the batch stays at c as under steady load "
        "(default: the set's first max(16, 4c) up to its size; one wave at c = 32 on the writing set)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--tau-check",
        action="store_true",
        help="after the rounds, serve every eval prompt once at c = 8 (tau through the server)",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=12,
        help="forward passes profiled per server at c = 1 after the rounds, in their own pass (0: no profile)",
    )
    parser.add_argument(
        "--greedy-check",
        action="store_true",
        help="record every reply's token ids and, once the servers stop, check each against the fp32 target: the "
        "worst deviation in bf16 ulps per c and system (the summary's `greedy`)",
    )


STEP = Step(
    "speed", "served speed: the --systems' servers in paired, rotated rounds, no instrumentation", cmd_speed, arguments
)
