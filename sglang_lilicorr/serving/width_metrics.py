"""What LILICORR tells about its verify widths while serving: each request's `meta_info["lilicorr_verify_width"]`
(the width of every verify step that served it, beside SGLang's `spec_correct_drafts_histogram`), and, where SGLang's
metrics are on (`--enable-metrics`), Prometheus series of the scheduler:

  lilicorr:verify_steps_total{width}          decode steps verified at each width
  lilicorr:committed_tokens_total{width}      tokens those steps committed (the bonus token included)
  lilicorr:draft_acceptance{position}         the width policy's running acceptance of draft position i given 1..i-1
"""

from __future__ import annotations

META_KEY = "lilicorr_verify_width"
GAUGE_EVERY = 64  # verify reports between two updates of the acceptance gauges


class WidthMetrics:
    def __init__(self, series: dict | None = None):
        self.series = series  # None: SGLang's metrics are off
        self.reports = 0

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
        """A decode step of `width` over `size` requests returned `result`: tag its requests' meta_info."""
        output = getattr(result, "logits_output", None)
        if output is not None:
            info = output.customized_info if output.customized_info is not None else {}
            info[META_KEY] = [width] * size
            output.customized_info = info
        if self.series is not None:
            self.series["steps"].labels(width=str(width)).inc()

    def verified(self, width: int | None, accepted_drafts: list[int], record) -> None:
        """A step of `width` (None: not matched) accepted these draft counts; `record` is the policy's."""
        if self.series is None or width is None:
            return
        self.series["tokens"].labels(width=str(width)).inc(sum(accepted_drafts) + len(accepted_drafts))
        self.reports += 1
        if self.reports % GAUGE_EVERY == 1:
            for i in range(1, record.slots + 1):
                self.series["acceptance"].labels(position=str(i)).set(record.acceptance(i))
