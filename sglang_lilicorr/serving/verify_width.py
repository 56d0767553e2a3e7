"""Adaptive verify width: how many tokens w of each drafted block the target verifies, per decode batch (width 1: no
draft, CHAIN plain decode forwards). The worker picks the width of the highest rate(w, b) = E[L_w] / cost(w, b),
E[L_w] = 1 + sum_{i<w} a_1...a_i (a_i: acceptance of draft i given 1..i-1, `AcceptanceRecord`; E[L_1] = CHAIN; cost:
`StepCosts`), at an upper confidence bound, every `interval` steps with a `margin`, probing the width verified least
recently now and then (a cost observed once stays the median until measured again). LILICORR_VERIFY_WIDTH: `adaptive`
(default), one width (pinned), or a comma list of tiers."""

from __future__ import annotations

import os
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Callable

from .draft_check import ServingConfigError

WIDTH_ENV = "LILICORR_VERIFY_WIDTH"
ADAPTIVE = "adaptive"
# Powers of two: E[L_w] saturates geometrically in w while a verify's cost grows about linearly once the target is
# compute-bound, so each doubling is the next point worth a graph set; the block itself is always a tier.
WIDTHS = (1, 2, 4, 8, 16)
# Plain decode forwards a width-1 step runs back to back. A step's fixed cost (the scheduler's turn, the block's set-up,
# the draft-KV append: ~0.65 ms beside a 0.98 ms forward at batch 1 on the H100 testbed) is shared by them; 8 keeps a
# step's burst of tokens, and a new request's wait for its prefill, within the width-8 tier's.
CHAIN = 8


def parse_widths(value: str | None, block_size: int) -> tuple[int, ...]:
    """The sorted tiers LILICORR_VERIFY_WIDTH asks for (default: WIDTHS below the block, and the block)."""
    value = ADAPTIVE if value is None else value.strip()
    if value == ADAPTIVE:
        return tuple(sorted({w for w in WIDTHS if w < block_size} | {block_size}))
    try:
        widths = sorted({int(part) for part in value.split(",")})
    except ValueError:
        widths = []
    if not widths or widths[0] < 1 or widths[-1] > block_size:
        raise ServingConfigError(
            f"{WIDTH_ENV}={value!r} is not a verify width: set it to {ADAPTIVE}, one width in 1..{block_size} "
            f"(the draft's block size), or a comma list of them."
        )
    return tuple(widths)


def widths_from_env(block_size: int) -> tuple[int, ...]:
    return parse_widths(os.environ.get(WIDTH_ENV), block_size)


class AcceptanceRecord:
    """Per draft position i, decayed counts of verifies that reached i and that accepted it (half in `half_life`
    observations, decayed only when observed). An estimate leans with `prior_weight` on the position before it."""

    def __init__(self, slots: int, *, half_life: float = 1024.0, prior: float = 0.5, prior_weight: float = 2.0):
        self.slots = slots
        self.keep = 0.5 ** (1.0 / half_life)
        self.prior, self.prior_weight = prior, prior_weight
        self.reached = [0.0] * slots
        self.accepted = [0.0] * slots

    def add(self, width: int, accepted_drafts: list[int]) -> None:
        """One verify step of `width`: each request's accepted draft count (0..width-1)."""
        for i in range(1, width):
            reached = sum(1 for k in accepted_drafts if k >= i - 1)
            if reached:
                keep = self.keep**reached
                self.reached[i - 1] = self.reached[i - 1] * keep + reached
                self.accepted[i - 1] = self.accepted[i - 1] * keep + sum(1 for k in accepted_drafts if k >= i)

    def acceptances(self, width: int, optimism: float = 0.0) -> list[float]:
        """[a_1, ..., a_{width-1}]; with `optimism` z, each raised by z standard errors."""
        out, lean = [], self.prior
        for i in range(width - 1):
            n = self.reached[i] + self.prior_weight
            lean = (self.accepted[i] + lean * self.prior_weight) / n
            bound = lean + optimism * (lean * (1 - lean) / n) ** 0.5 if self.reached[i] else lean
            out.append(min(bound, 1.0))
        return out

    def acceptance(self, i: int) -> float:
        return self.acceptances(i + 1)[-1]

    def expected_length(self, width: int, optimism: float = 0.0) -> float:
        """E[L_w]: tokens a verify of `width` commits (the bonus token included)."""
        total, run = 1.0, 1.0
        for a in self.acceptances(width, optimism):
            run *= a
            total += run
        return total


@dataclass
class StepCosts:
    """Seconds of one decode step of width w at graph batch size b: the median of its last `memory` observed periods
    once `least` were seen (robust to a rare idle gap, however large the host's share), else the start-up replay time
    (cheaper, so an unobserved width gets tried)."""

    replay: dict[tuple[int, int], float]  # (width, graph batch size) -> seconds
    agree: Callable[[list[float]], list[float]] | None = None  # tensor parallelism: the ranks' elementwise max
    memory: int = 32
    least: int = 3
    periods: dict[tuple[int, int], deque] = field(default_factory=dict)  # (width, graph batch size) -> seconds
    observed: dict[tuple[int, int], float] = field(default_factory=dict)  # their medians, once `least` were seen

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({b for _, b in self.replay})

    def bucket(self, batch: int) -> int | None:
        """The graph batch size a batch of `batch` requests replays (the smallest at least as large), or None."""
        sizes = self.batch_sizes
        i = bisect_left(sizes, batch)
        return sizes[i] if i < len(sizes) else None

    def covers(self, widths, batch: int) -> bool:
        b = self.bucket(batch)
        return b is not None and all((w, b) in self.replay for w in widths)

    def cost(self, width: int, batch: int) -> float:
        key = (width, self.bucket(batch))
        return self.observed.get(key, self.replay[key])

    def settle(self) -> None:
        """Each cost becomes the slowest rank's (their collectives wait for it): every rank then chooses alike."""
        if self.agree is not None:
            keys = sorted(self.replay)
            agreed = self.agree([self.observed.get(k, self.replay[k]) for k in keys])
            self.observed = {k: v for k, v in zip(keys, agreed) if k in self.observed or v != self.replay[k]}

    def observe(self, width: int, batch: int, period: float) -> None:
        """A decode step of `width` on `batch` requests was followed by the next one `period` seconds later."""
        key = (width, self.bucket(batch))
        if key not in self.replay:
            return
        seen = self.periods.setdefault(key, deque(maxlen=self.memory))
        seen.append(period)
        if len(seen) >= self.least:
            self.observed[key] = median(seen)


class WidthPolicy:
    """Picks the width of every decode step (`width`) and learns from what each step verified (`verified`)."""

    def __init__(
        self,
        widths: tuple[int, ...],
        costs: StepCosts,
        record: AcceptanceRecord,
        *,
        interval: int = 4,
        margin: float = 0.02,
        probe_every: int = 64,
        settle: int = 8,
        warmup: float = 16.0,
        optimism: float = 0.5,
        chain: int = 1,
    ):
        self.widths, self.costs, self.record = tuple(sorted(widths)), costs, record
        self.chain = chain  # tokens a width-1 step commits
        self.interval, self.margin, self.probe_every, self.warmup = interval, margin, probe_every, warmup
        self.settle = settle  # a width tried on fewer steps than this at a batch size is probed again at once
        self.optimism = optimism
        self.current = self.widths[-1]
        self.probing: int | None = None  # the width a probe verifies, for about one interval's time
        self.probe_left = 0  # steps the probe has left
        self.steps = 0  # decode steps the policy chose (covered batches)
        self.since_probe = 0  # decisions since the last probe
        self.used: dict[tuple[int, int | None], int] = {}  # (width, graph batch size) -> the step it last verified
        # (width, batch) of the steps whose accept counts are not back yet (a bound, should reports stop coming)
        self.pending: deque[tuple[int, int]] = deque(maxlen=256)
        self.events = {"settle probes": 0, "periodic probes": 0, "switches": 0}  # since start, for the log line

    def length(self, width: int, optimism: float = 0.0) -> float:
        """E[L_w]: tokens a step of `width` commits (width 1: its chain, drafting nothing)."""
        return self.chain if width == 1 else self.record.expected_length(width, optimism)

    def rate(self, width: int, batch: int, optimism: float = 0.0) -> float:
        """Expected committed tokens per second of one request's share of a step."""
        return self.length(width, optimism) / self.costs.cost(width, batch)

    def best(self, batch: int) -> int:
        """The width of the highest rate at the record's upper confidence bound."""
        return max(self.widths, key=lambda w: (self.rate(w, batch, self.optimism), -w))

    def width(self, batch: int, narrow: bool = True) -> int:
        """The next step's width: the whole block (the record spans its drafts) where a narrow step may not serve the
        batch, the widest tier where its size has no measured cost or the record is warming up, else the choice."""
        if not narrow:
            return self._use(self.record.slots + 1, batch)
        if not self.costs.covers(self.widths, batch) or self.record.reached[0] < self.warmup:
            return self._use(self.widths[-1], batch)
        if self.steps % self.interval == 0:
            self.costs.settle()
            self._decide(batch)
        self.steps += 1
        if self.probing:
            self.probe_left -= 1
            if self.probe_left == 0:
                probe, self.probing = self.probing, None
                return self._use(probe, batch)
        return self._use(self.probing or self.current, batch)

    def describe(self, batch: int) -> str:
        """The policy's view of a covered batch of `batch` requests: per width E[L_w] and its step cost (observed or
        the replay), the width it verifies, and its probes and switches since start."""
        views = []
        for w in self.widths:
            seen = (w, self.costs.bucket(batch)) in self.costs.observed
            cost_ms = self.costs.cost(w, batch) * 1e3
            views.append(f"{w}: E[L] {self.length(w):.2f}, {cost_ms:.2f} ms {'seen' if seen else 'replay'}")
        events = ", ".join(f"{n} {what}" for what, n in self.events.items())
        return f"batch {batch}: " + "; ".join(views) + f"; verifying {self.probing or self.current}; {events}"

    def _decide(self, batch: int) -> None:
        if (unsettled := self._unsettled(batch)) or (
            self.since_probe >= self._probe_period(batch) and len(self.widths) > 1
        ):
            self.probing, self.since_probe = unsettled or self._stalest(batch), 0
            self.events["settle probes" if unsettled else "periodic probes"] += 1
            # as many steps as the current width runs in one interval's time (a chain at 8B shapes: one step)
            share = self.costs.cost(self.current, batch) / self.costs.cost(self.probing, batch)
            self.probe_left = max(1, min(self.interval, round(self.interval * share)))
            return
        best = self.best(batch)
        rate = lambda w: self.rate(w, batch, self.optimism)  # noqa: E731
        if best != self.current and rate(best) > rate(self.current) * (1 + self.margin):
            self.current = best
            self.events["switches"] += 1
        self.since_probe += 1

    def _probe_period(self, batch: int) -> int:
        """Decisions between two probes: a quarter as many while the current width drafts nothing (the record then
        learns from probes only) and a width could beat it at one standard error above the record."""
        if self.current != 1 or all(self.rate(w, batch, 1.0) < self.rate(1, batch) for w in self.widths if w > 1):
            return self.probe_every
        return self.probe_every // 4

    def _unsettled(self, batch: int) -> int | None:
        """A width other than the current one tried at this batch's graph size on fewer than `settle` steps (its first
        steps may have run slow), else None."""
        bucket = self.costs.bucket(batch)
        counts = {w: len(self.costs.periods.get((w, bucket), ())) for w in self.widths if w != self.current}
        return next((w for w, n in counts.items() if 0 < n < self.settle), None)

    def _stalest(self, batch: int) -> int:
        """The width other than the current one verified least recently at this batch's graph size (the wider on a
        tie): its cost and, for a wider one, the acceptance of its later positions are measured again."""
        bucket = self.costs.bucket(batch)
        others = [w for w in self.widths if w != self.current]
        return min(others, key=lambda w: (self.used.get((w, bucket), -1), -w))

    def _use(self, width: int, batch: int) -> int:
        self.pending.append((width, batch))
        self.used[(width, self.costs.bucket(batch))] = self.steps
        return width

    def verified(self, accepted_drafts: list[int]) -> int | None:
        """The accepted draft counts of the oldest pending step (reported in launch order; a width-1 step reports its
        chain as chain - 1 accepted) -> its width; pending steps that do not fit the report are dropped until one does;
        no fit: None."""
        while self.pending:
            width, batch = self.pending.popleft()
            if width == 1 and batch == len(accepted_drafts) and all(k == self.chain - 1 for k in accepted_drafts):
                return width  # drafted nothing
            if width > 1 and batch == len(accepted_drafts) and all(0 <= k < width for k in accepted_drafts):
                self.record.add(width, accepted_drafts)
                return width
        return None
