"""The lab's width-replay (benchmarks/served/width_replay.py): the simulated c = 1 server over replayed acceptance,
and the traces it replays and keeps."""

from __future__ import annotations

import json

import pytest

from benchmarks.served.width_replay import COSTS, REPLAY, ms_by_width, plot, simulate, trace_replies

COSTS_S, REPLAY_S = ms_by_width(COSTS), ms_by_width(REPLAY)


def test_costs_read_as_seconds_by_width():
    assert ms_by_width("1=12.8,16=4.5") == {1: pytest.approx(0.0128), 16: pytest.approx(0.0045)}
    assert sorted(COSTS_S) == sorted(REPLAY_S) == [1, 2, 4, 8, 16]


@pytest.mark.parametrize("matched, best", [(15, 16), (3, 16), (1, 1), (0, 1)])
def test_the_adaptive_server_follows_the_best_fixed_width_of_the_replies(matched, best):
    """Every anchor matching `matched` drafts: width 16 commits 16 tokens a 4.65 ms step where all match, the chain 8
    a 12.8 ms step where few do (4 tokens at 4.65 ms already beat it). The adaptive server ends within 5 % of the best
    (its probes of the other widths cost most where one width is 5x the others)."""
    traces = [{"matched": [matched] * 255, "tokens": 256}] * 8
    out = simulate(traces, COSTS_S, REPLAY_S, repeat=8)
    assert out["best_fixed"] == best and out["adaptive_vs_best"] >= 0.95
    assert out["fixed"]["16"] == pytest.approx(min(matched + 1, 16) / 4.65e-3, rel=0.02)
    assert max(out["steps"], key=out["steps"].get) == str(best) and sum(out["steps"].values()) == pytest.approx(
        1, abs=1e-3
    )


def test_a_step_commits_no_more_than_the_reply_holds():
    out = simulate([{"matched": [15] * 9, "tokens": 10}], {16: 1.0}, {16: 1.0}, repeat=1)
    assert out["fixed"]["16"] == 9.0  # one step, the 9 tokens after the first (the first is the prefill's)


class _Replayer:
    def __init__(self):
        self.calls = []

    def matches(self, prompt_ids, output_ids):
        self.calls.append(list(prompt_ids))
        return {"draft": {"argmax": [0] * (len(output_ids) - 1), "lilicorr": [2] * (len(output_ids) - 1)}}


def test_traces_take_the_served_draft_and_resume(tmp_path):
    found = {k: {"input_ids": [k], "output_ids": [1, 2, 3], "prompt_id": str(k)} for k in (7, 8)}
    replayer, path = _Replayer(), tmp_path / "traces.jsonl"
    traces = trace_replies(replayer, {"a": found[7]}, path)
    assert traces == [{"key": "a", "prompt_id": "7", "tokens": 3, "matched": [2, 2]}]  # the head's walk, not argmax
    again = trace_replies(replayer, {"a": found[7], "b": found[8]}, path)
    assert [t["key"] for t in again] == ["a", "b"] and replayer.calls == [[7], [8]]  # "a" was not replayed again
    assert len(path.read_text().splitlines()) == 2 and json.loads(path.read_text().splitlines()[1])["key"] == "b"


def test_the_simulated_speeds_are_plotted(tmp_path):
    out = simulate([{"matched": [3] * 63, "tokens": 64}] * 2, COSTS_S, REPLAY_S, repeat=2)
    summary = {"replies": 2, "repeat": 2, **out}
    path = plot(summary, tmp_path / "width_replay.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
