"""What LILICORR tells about its verify widths: each step's width as SGLang's `cap_lens` (so `meta_info` holds
`spec_cap_lens_histogram` and `spec_cap_length`), and with `--enable-metrics` lilicorr:verify_steps_total{width},
lilicorr:committed_tokens_total{width} and lilicorr:draft_acceptance{position}."""

from __future__ import annotations

import torch

GAUGE_EVERY = 64  # verify reports between two updates of the acceptance gauges


class WidthMetrics:
    def __init__(self, series: dict | None = None):
        self.series = series  # None: SGLang's metrics are off
        self.reports = 0
        self.widths: dict[tuple[int, torch.device], torch.Tensor] = {}  # (width, device) -> [rows] int32 of the width

    @classmethod
    def create(cls) -> WidthMetrics:
        from sglang.srt.runtime_context import get_observability

        if not get_observability().enable_metrics:
            return cls()
        from prometheus_client import Counter, Gauge  # after SGLang set PROMETHEUS_MULTIPROC_DIR

        return cls(
            {
                "steps": Counter("lilicorr:verify_steps_total", "Decode steps verified at each width.", ["width"]),
                "tokens": Counter(
                    "lilicorr:committed_tokens_total", "Tokens committed by the steps of each width.", ["width"]
                ),
                "acceptance": Gauge(
                    "lilicorr:draft_acceptance",
                    "Running acceptance of draft position i given drafts 1..i-1 were accepted.",
                    ["position"],
                    multiprocess_mode="mostrecent",
                ),
            }
        )

    def step(self, width: int, result, size: int) -> None:
        """A decode step of `width` over `size` requests returned `result`: its width as the result's cap_lens."""
        accepted = getattr(result, "accept_lens", None)
        if isinstance(accepted, torch.Tensor) and getattr(result, "cap_lens", None) is None:
            result.cap_lens = self._constant(width, size, accepted.device)
        if self.series is not None:
            self.series["steps"].labels(width=str(width)).inc()

    def _constant(self, width: int, size: int, device) -> torch.Tensor:
        """[size] int32 of `width`: a slice of one tensor per width, never written after it is made."""
        held = self.widths.get((width, device))
        if held is None or held.shape[0] < size:
            held = torch.full((max(size, 64),), width, dtype=torch.int32, device=device)
            self.widths[(width, device)] = held
        return held[:size]

    def verified(self, width: int | None, accepted_drafts: list[int], record) -> None:
        """A step of `width` (None: not matched) accepted these draft counts; `record` is the policy's."""
        if self.series is None or width is None:
            return
        self.series["tokens"].labels(width=str(width)).inc(sum(accepted_drafts) + len(accepted_drafts))
        self.reports += 1
        if self.reports % GAUGE_EVERY == 1:
            for i in range(1, record.slots + 1):
                self.series["acceptance"].labels(position=str(i)).set(record.acceptance(i))
