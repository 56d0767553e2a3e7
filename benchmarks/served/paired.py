"""Paired, alternating rounds: several servers play the same prompts at each concurrency, one server at a
time, in an order that rotates every round (a, b, c / b, c, a / c, a, b, ...), so no system is always
first or last. A ratio of two systems taken within one round cancels what moves a whole round (the
machine's state, the order); `lilicorr bench report` takes the rounds as repeated runs and gives the mean
of each within-round ratio with its 95 % t interval (metrics.add_paired_ratios).

Each run (system, c, round r) appends to WORK/runs/c<c>_r<r>_<system>.jsonl and resumes like every
`bench run`. `merge_rounds` writes WORK/round<r>.jsonl from the (c, r) cells that every system finished
with every prompt, so a cell cut short (a deadline, a failure) is left out whole: no pair is half
measured. The first run of each (server, c) that a call plays starts with a warm-up (runner.warmup_waves), so a call
that resumes a setting mid-way (its servers started afresh) warms them up before its first round too.
benchmarks/testbed/speed.py and benchmarks/scale.py measure throughput this way.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from sglang_lilicorr.bench import runner
from sglang_lilicorr.bench.client import Sampling
from sglang_lilicorr.bench.prompt import Prompt


def rotation(systems: Sequence[str], round_index: int) -> list[str]:
    """The systems' order in round `round_index`: rotated by one each round."""
    k = round_index % len(systems)
    return [*systems[k:], *systems[:k]]


class Deadline:
    """Epoch seconds by which a device call must be done (None: no limit)."""

    def __init__(self, at: Optional[float], clock: Callable[[], float] = time.time) -> None:
        self.at, self.clock = at, clock

    def left(self) -> float:
        return math.inf if self.at is None else self.at - self.clock()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    dataset: str  # names the runs in the results files
    max_tokens: int
    rounds: int = 3
    api: str = "chat"
    ignore_eos: bool = False
    warmup: int = 2  # unrecorded requests before a call's first run of each (server, c): max(warmup, c)
    request_timeout: float = 300.0
    reserve_s: float = 0.0  # time the deadline must still leave after the last round (stop servers, pack results)
    record_ids: bool = False  # each turn keeps its prompt's and reply's token ids (runner.run's record_ids)


def run_path(work: Path, c: int, r: int, system: str) -> Path:
    return Path(work) / "runs" / f"c{c}_r{r}_{system}.jsonl"


def play_rounds(
    urls: Mapping[str, str],
    prompts: Mapping[int, Sequence[Prompt]],
    plan: RoundPlan,
    work: Path,
    *,
    deadline: Optional[Deadline] = None,
    log: Callable[[str], None] = print,
    watch: Optional[Callable[[str, int, int], Callable[[], None]]] = None,
) -> list[str]:
    """Plays every (c, round, system) of `prompts` ({c: prompts}) against `urls` ({system: url}), greedy.
    Before each round it checks that the deadline leaves the longest round so far plus plan.reserve_s;
    if not, it stops there. `watch(system, c, round)`, where given, is called before each run and returns what to
    call after it (e.g. the CPU the idle servers spent meanwhile). Returns what failed or was left out, one line
    each."""
    systems, failures, longest, warm = list(urls), [], 0.0, set()
    for c, todo in prompts.items():
        for r in range(1, plan.rounds + 1):
            if deadline is not None and not deadline.allows(longest + plan.reserve_s):
                log(
                    f"[rounds] stopping before c={c} round {r}: {deadline.left():.0f} s left, "
                    f"a round takes up to {longest:.0f} s"
                )
                return failures + [f"deadline: from c={c} round {r} on not played"]
            t0 = time.time()
            for system in rotation(systems, r):
                config = runner.RunConfig(system, plan.dataset, c, 0.0, 0, plan.max_tokens)
                done = watch(system, c, r) if watch is not None else (lambda: None)
                try:
                    outcome = runner.run(
                        todo,
                        config,
                        urls[system],
                        run_path(work, c, r, system),
                        Sampling(max_tokens=plan.max_tokens, ignore_eos=plan.ignore_eos),
                        api=plan.api,
                        warmup=0 if (system, c) in warm else plan.warmup,
                        show_progress=False,
                        request_timeout=plan.request_timeout,
                        record_ids=plan.record_ids,
                    )
                    if outcome.skipped < len(todo):  # it played (a finished run is skipped whole, unwarmed)
                        warm.add((system, c))
                except Exception as e:  # a server that went away: record it, the other systems' rounds go on
                    failures.append(f"{system} c={c} round {r}: {type(e).__name__}: {e}")
                    continue
                finally:
                    done()
                failures += [
                    f"{system} c={c} round {r}: {len(outcome.failures)} prompt(s) failed, first {pid}: {err}"
                    for pid, err in outcome.failures[:1]
                ]
            longest = max(longest, time.time() - t0)
            log(f"[rounds] c={c} round {r} done in {time.time() - t0:.1f} s")
    return failures


def merge_rounds(
    work: Path, systems: Sequence[str], prompts: Mapping[int, Sequence[Prompt]], rounds: int
) -> list[Path]:
    """WORK/round<r>.jsonl for every round with at least one complete cell: the lines of each (c, r) whose
    every system's run holds all of c's prompts (a round with none has no file). Returns the files."""
    written = []
    for r in range(1, rounds + 1):
        lines = []
        for c, todo in prompts.items():
            paths = [run_path(work, c, r, s) for s in systems]
            if all(p.is_file() and len(runner.read_results(p)) == len(todo) for p in paths):
                lines += [line for p in paths for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        out = Path(work) / f"round{r}.jsonl"
        if not lines:
            out.unlink(missing_ok=True)
            continue
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, out)
        written.append(out)
    return written
