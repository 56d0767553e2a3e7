"""benchmarks/micro/timeline.py on CPU: a synthetic chrome trace of two replays (two streams) gives the
per-kernel medians, the idle time before each kernel on its stream, and the wall / busy / idle sums."""

import pytest

from benchmarks.micro.timeline import format_timeline, main, replay_rows, timeline


def _event(name, stream, ts, dur):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_timeline_of_two_replays():
    trace = {"traceEvents": [{"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 1}]}
    for t0, extra in ((100.0, 0.0), (500.0, 2.0)):  # the second replay's last kernel starts 2 us later
        trace["traceEvents"] += [
            _event("topk", 7, t0, 10.0),
            _event("side_gemm", 9, t0 + 1.0, 5.0),
            _event("gemm", 7, t0 + 12.0 + extra, 6.0),
        ]
    reps = replay_rows(trace, 3)
    assert len(reps) == 2 and [k["name"] for k in reps[0]] == ["topk", "side_gemm", "gemm"]
    res = timeline(reps)
    gemm = res["kernels"][2]
    assert gemm["stream"] == 7 and gemm["start"] == 13.0 and gemm["idle"] == 3.0  # medians of 2 / 4 us after topk
    assert res["kernels"][1]["idle"] == 1.0  # the side stream's first kernel: since the replay began
    assert res["wall_us"] == 19.0 and res["main_busy_us"] == 16.0 and res["main_idle_us"] == 3.0
    text = format_timeline(res)
    assert "side_gemm" in text and "idle between them 3.0 us" in text


def test_unknown_variant_is_named(capsys):
    with pytest.raises(SystemExit):
        main(["--variant", "servd"])
    assert "--variant 'servd' unknown; use one of" in capsys.readouterr().err
