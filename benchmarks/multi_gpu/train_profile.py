"""Where a training step's time goes on each rank: `lilicorr train` with a torch-profiler window over a few steps.

  torchrun --nproc-per-node N -m benchmarks train-profile --window START COUNT --out DIR -- TRAIN_ARGS...

TRAIN_ARGS are `lilicorr train`'s (without `train`). The window opens at the start of step START + 1 and closes at
the start of step START + COUNT + 1 (steps counted from this run's first, resumed or not), so it holds COUNT whole
steps and the run must go past step START + COUNT (`--max-steps`). Each rank writes DIR/rank{R}.txt: the wall time,
the aten ops launched and the host reads of a tensor per step of the window (on a GPU each op costs host time to
launch, each read a sync), then the CPU ops and the CUDA kernels by their total time (`key_averages`, top 25 each),
and DIR/rank{R}.trace.json.gz, the window's timeline (chrome://tracing, Perfetto) with a zero-length CPU range
`mark:PHASE` where PhaseTimer ends each trainer phase (`mark:start` at a step's start).
Without torchrun it profiles one process (rank 0).
The run's outputs are `lilicorr train`'s.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from sglang_lilicorr import cli
from sglang_lilicorr.train import timing


class Window:
    """Starts and stops one profiler at given step starts (PhaseTimer.start_step runs once per step)."""

    def __init__(self, start: int, count: int, out: Path, rank: int) -> None:
        self.start, self.count, self.out, self.rank = start, count, out, rank
        self.steps = 0
        self.prof: profile | None = None
        self.t0 = 0.0

    def on_step(self) -> None:
        if self.steps == self.start:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.prof = profile(activities=activities)
            self.prof.__enter__()
            self.t0 = time.perf_counter()
        elif self.prof is not None and self.steps == self.start + self.count:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - self.t0
            self.prof.__exit__(None, None, None)
            self.write(wall)
            self.prof = None
        self.steps += 1

    def on_mark(self, phase: str) -> None:
        """PhaseTimer marks the end of `phase` (or a step's start, "start"): a zero-length CPU range `mark:PHASE` in
        the trace, so a reader can cut the timeline into the trainer's phases."""
        if self.prof is not None:
            with torch.profiler.record_function(f"mark:{phase}"):
                pass

    def write(self, wall: float) -> None:
        events = self.prof.key_averages()
        ops = sum(e.count for e in events if e.key.startswith("aten::")) / self.count
        syncs = sum(e.count for e in events if e.key == "aten::_local_scalar_dense") / self.count
        lines = [
            f"rank {self.rank}: steps {self.start + 1}..{self.start + self.count}, "
            f"{1e3 * wall / self.count:.1f} ms per step (wall), {ops:.0f} aten ops and {syncs:.0f} host reads of a "
            "tensor (.item() and the like) per step",
            "",
            events.table(sort_by="cpu_time_total", row_limit=25),
        ]
        if torch.cuda.is_available():
            lines += ["", events.table(sort_by="cuda_time_total", row_limit=25)]
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{self.rank}.txt").write_text("\n".join(lines) + "\n")
        trace = self.out / f"rank{self.rank}.trace.json"
        self.prof.export_chrome_trace(str(trace))
        with trace.open("rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print(
            "error: no `--` before the training arguments: python -m benchmarks train-profile --window START COUNT "
            "--out DIR -- TRAIN_ARGS (lilicorr train's)",
            file=sys.stderr,
        )
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--window", type=int, nargs=2, metavar=("START", "COUNT"), required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv[:cut])
    if a.window[0] < 1 or a.window[1] < 1:
        print(
            f"error: --window {a.window[0]} {a.window[1]}: START and COUNT must be >= 1 (step 1 holds the warm-up)",
            file=sys.stderr,
        )
        return 2
    window = Window(a.window[0], a.window[1], a.out, int(os.environ.get("RANK", "0")))
    start_step, mark = timing.PhaseTimer.start_step, timing.PhaseTimer.mark

    def start_step_profiled(self) -> None:
        window.on_step()
        window.on_mark("start")
        start_step(self)

    def mark_profiled(self, phase: str) -> None:
        window.on_mark(phase)
        mark(self, phase)

    timing.PhaseTimer.start_step, timing.PhaseTimer.mark = start_step_profiled, mark_profiled
    return cli.main(["train", *argv[cut + 1 :]])
