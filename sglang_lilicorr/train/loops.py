"""Loops in a generated reply: a periodic suffix of period p <= `max_period` covering at least `min_repeats` copies and
`min_span` tokens. `find_loop` returns where the repetition begins, so `ids[:start]` keeps one copy of the cycle. The
recipe (regenerate.py) cuts looping replies there, asking in pieces of `check_every` tokens."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class LoopRule:
    max_period: int = 256  # longest cycle looked for, in tokens
    min_repeats: int = 2  # whole copies of the cycle in the periodic suffix, at least
    min_span: int = 64  # tokens the periodic suffix covers (every copy), at least: short runs such as 0, 0, 0 are text
    min_kept: int = 16  # a reply whose cut leaves fewer tokens (a loop from its start) is not kept
    check_every: int = 256  # a reply is asked for in pieces of this many tokens, checked after each

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LoopRule.{field.name}={value!r}: expected an integer >= 1.")
        if self.min_repeats < 2:
            raise ValueError(f"LoopRule.min_repeats={self.min_repeats}: expected >= 2 (one copy is no repetition).")


class Loop(NamedTuple):
    start: int  # the first repeated token: ids[:start] is the text and one copy of the cycle
    period: int
    repeats: float  # copies of the cycle from start - period to the end


def find_loop(ids: Sequence[int], rule: LoopRule = LoopRule()) -> Loop | None:
    """The loop ending `ids` under `rule`, or None; of several periods, the earliest to begin (ties: the shorter)."""
    a = np.asarray(ids, dtype=np.int64)
    n = len(a)
    if n < rule.min_span:
        return None
    last = min(rule.max_period, n // rule.min_repeats)
    # only periods p with ids[-1] == ids[-1 - p] can be periodic at the end
    candidates = np.flatnonzero(a[n - 1 - last : n - 1][::-1] == a[-1]) + 1
    best: Loop | None = None
    for p in candidates.tolist():
        mismatch = np.flatnonzero(a[p:] != a[:-p])
        run = n - p - int(mismatch[-1]) - 1 if mismatch.size else n - p  # tokens equal to the one p before
        span = run + p
        if span < max(rule.min_span, rule.min_repeats * p):
            continue
        start = n - run
        if best is None or start < best.start:
            best = Loop(start, p, span / p)
    return best
