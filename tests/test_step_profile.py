"""benchmarks/served/step_profile.py: per-step figures of a profiled window, the systems' comparison, and the record
call against a stand-in server (the profile starts once the streamed request has produced the lead tokens)."""

from __future__ import annotations

import gzip
import json

import pytest
from stub_server import StubServer, write_stub_trace

from benchmarks.served import step_profile


def test_summary_per_step(tmp_path):
    trace = tmp_path / "t.trace.json.gz"
    write_stub_trace(trace, steps=3)  # per step: 1000 us from first to last GPU activity, 500 us of kernels
    s = step_profile.summarize(trace, steps=3)
    assert (s["wall_ms"], s["gpu_busy_ms"], s["gpu_idle_ms"], s["kernels"]) == (1.0, 0.5, 0.5, 3.0)
    assert s["top_kernels"][0] == {"name": "stub_verify", "per_step": 1.0, "ms": 0.3}
    assert s["runtime"] == [{"name": "cudaGraphLaunch", "per_step": 1.0, "ms": 0.02}]
    assert s["python"][0]["ms"] == 0.9


def test_busy_time_is_the_union_of_overlapping_activity(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "a", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 50, "dur": 100},  # another stream, overlapping a
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 400, "dur": 100},
    ]
    trace = tmp_path / "t.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = step_profile.summarize(trace, steps=1)
    assert (s["wall_ms"], s["gpu_busy_ms"], s["gpu_idle_ms"], s["kernels"]) == (0.5, 0.25, 0.25, 2.0)


def test_a_trace_without_gpu_activity_is_named(tmp_path):
    trace = tmp_path / "cpu_only.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 5}]}, f)
    with pytest.raises(ValueError, match="cpu_only.trace.json.gz: no GPU activity"):
        step_profile.summarize(trace, steps=4)


def test_compare_lists_the_frames_that_differ(tmp_path):
    write_stub_trace(tmp_path / "a.trace.json.gz", steps=2)
    a = step_profile.summarize(tmp_path / "a.trace.json.gz", steps=2)
    b = json.loads(json.dumps(a))
    b["python"][0]["ms"] = 0.6
    rows = step_profile.python_differences({"lilicorr": a, "dflash": b}, "lilicorr", "dflash")
    assert rows[0]["diff"] == pytest.approx(0.3)
    text = step_profile.compare({"lilicorr": a, "dflash": b})
    assert "| wall (ms) | 1.0 | 1.0 |" in text and "Python frames: lilicorr - dflash" in text


def test_record_profiles_a_running_request(tmp_path):
    with StubServer(step_s=0.0) as stub:
        trace = step_profile.record(
            stub.url, tmp_path / "lilicorr", steps=5, prompt="Write a poem.", lead_tokens=8, wait_s=5.0
        )
    assert trace is not None and trace.parent == (tmp_path / "lilicorr").resolve()
    assert step_profile.summarize(trace, steps=5)["kernels"] == 3.0
    generate = next(r["body"] for r in stub.log if r["path"] == "/generate")
    assert generate["stream"] and generate["sampling_params"] == {
        "temperature": 0.0,
        "max_new_tokens": 1024,
        "ignore_eos": True,
    }


def test_a_request_shorter_than_the_lead_is_not_profiled(tmp_path):
    with StubServer(step_s=0.0) as stub:
        trace = step_profile.record(
            stub.url, tmp_path / "dflash", steps=5, prompt="Hi.", max_new_tokens=4, lead_tokens=128, wait_s=1.0
        )
    assert trace is None and not list((tmp_path / "dflash").rglob("*.gz"))


def speculative_steps(steps: int) -> list[dict]:
    """Per step (1000 us apart): the draft graph (2 kernels, 0..100 us) launched at 0, the verify graph (3 kernels,
    300..700 us) launched at 250, one eager kernel at 800 (10 us)."""
    events = []
    for i in range(steps):
        t = 1000.0 * i
        for corr, host, kernels in (
            (2 * i, t - 10, [(t, 50), (t + 50, 50)]),
            (2 * i + 1, t + 250, [(t + 300, 100), (t + 400, 200), (t + 600, 100)]),
        ):
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaGraphLaunch",
                    "ts": host,
                    "dur": 5,
                    "args": {"correlation": corr},
                }
            )
            events += [
                {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "args": {"correlation": corr}}
                for ts, dur in kernels
            ]
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "append",
                "ts": t + 800,
                "dur": 10,
                "args": {"correlation": 10_000 + i},
            }
        )
    return events


def test_graph_segments_split_a_speculative_step():
    seg = step_profile.graph_segments(speculative_steps(4))
    assert seg == {
        "steps": 3,
        "draft_kernels": 2,
        "verify_kernels": 3,
        "draft_graph_ms": 0.1,
        "idle_draft_to_verify_ms": 0.2,
        "verify_graph_ms": 0.4,
        "idle_verify_to_next_draft_ms": 0.3,
        "host_draft_to_verify_launch_ms": 0.26,
        "eager_gpu_ms": 0.01,
    }


def test_graph_segments_need_a_draft_and_a_verify_graph(tmp_path):
    one_graph = [e for e in speculative_steps(3) if e["args"]["correlation"] % 2 == 1 or e["name"] == "append"]
    assert step_profile.graph_segments(one_graph) is None
    trace = tmp_path / "s.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": speculative_steps(3)}, f)
    summary = step_profile.summarize(trace, steps=3)
    assert summary["segments"]["verify_graph_ms"] == 0.4
    assert "| verify_graph_ms (median) | 0.4 | 0.4 |" in step_profile.compare({"a": summary, "b": summary})
