"""Device time per training phase (CUDA events; host clock on CPU), read once per logging window."""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []  # (phase that ends here, event or host time)
        self.steps = 0

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start_step(self) -> None:
        self.marks.append(("", self._now()))
        self.steps += 1

    def mark(self, phase: str) -> None:
        """The phase that started at the previous mark ends now."""
        if self.marks:
            self.marks.append((phase, self._now()))

    def window(self) -> dict[str, float]:
        """ms per step of each phase since the last window (and their sum as `step`)."""
        if self.cuda and self.marks:
            self.marks[-1][1].synchronize()
        totals: dict[str, float] = {}
        for (_, before), (phase, after) in zip(self.marks, self.marks[1:]):
            if phase:  # a step's first mark starts it; nothing ends there
                ms = before.elapsed_time(after) if self.cuda else 1e3 * (after - before)
                totals[phase] = totals.get(phase, 0.0) + ms
        steps = max(self.steps, 1)
        out = {f"time/{k}_ms": v / steps for k, v in totals.items()}
        out["time/step_ms"] = sum(totals.values()) / steps
        self.marks, self.steps = [], 0
        return out
