"""Where a served decode step's time goes: a torch-profiler trace of a few steps of a running SGLang server at
c = 1, summarised per step, and systems compared side by side (the `speed` step's profile).

`record(url, out_dir, steps)` streams one long greedy request (/generate, ignore_eos) and, once it has produced
`lead_tokens` tokens, asks the server to profile the next `steps` forward passes through SGLang's /start_profile
(CPU + GPU activities, Python stacks); it returns the trace SGLang writes when they are done. Every system is so
profiled at the same context, within one block (attention's cost grows with it). At c = 1 every profiled forward
pass of a speculative server is one block (draft + verify + accept), of a plain server one decode step.

`summarize(trace, steps)` reads the trace (chrome JSON, gzipped) and reports per step:
  wall_ms       first to last GPU activity of the window, / steps (the per-block wall, scheduler gaps included)
  gpu_busy_ms   the union of kernel, memcpy and memset intervals, / steps; gpu_idle_ms = wall - busy
  kernels       kernel launches; `top_kernels` by GPU time
  runtime       CUDA runtime / driver calls by name (count and host ms): graph launches, copies, synchronizations
  python        Python functions by inclusive host ms (the server's own frames: which method the host time is in)
  segments      a speculative step's GPU timeline (`graph_segments`): the draft and verify CUDA graphs' spans, the GPU's
                idle time between them and after the verify, the host time between their launches (medians over steps)
The profiler's Python tracing slows the host side: compare systems within one profile run, not with the served
throughput. `compare` lines the systems up and lists the Python frames whose time differs most.
"""

from __future__ import annotations

import gzip
import json
import statistics
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Mapping, Optional

from benchmarks.served.gpu_client import post_json
from sglang_lilicorr.bench.metrics import busy_seconds

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
TOP = 15  # rows per table in the report
PYTHON_MIN_MS = 0.005  # Python frames kept in the summary: at least this much host time per step
NAME_CHARS = 90
SEGMENTS = (
    "draft_graph_ms",
    "idle_draft_to_verify_ms",
    "verify_graph_ms",
    "idle_verify_to_next_draft_ms",
    "host_draft_to_verify_launch_ms",
    "eager_gpu_ms",
)  # graph_segments' rows in the comparison


def record(
    url: str,
    out_dir: Path,
    steps: int,
    prompt: str,
    *,
    max_new_tokens: int = 1024,
    lead_tokens: int = 128,
    wait_s: float = 120.0,
) -> Optional[Path]:
    """Profile `steps` forward passes of the server at `url` once one streamed greedy request has produced
    `lead_tokens` tokens; the trace path, or None when the request ended before that or no trace appeared within
    wait_s after it ended."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "text": prompt,
        "stream": True,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    }
    profile = {
        "output_dir": str(out_dir),
        "num_steps": int(steps),
        "activities": ["CPU", "GPU"],
        "with_stack": True,
        "profile_prefix": "step",
    }
    req = urllib.request.Request(
        url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    started = None
    with urllib.request.urlopen(req, timeout=600.0) as stream:
        for raw in stream:  # keep reading to the end: the profiled steps run while the request does
            line = raw.decode().strip()
            if started is None and line.startswith("data:") and line != "data: [DONE]":
                if json.loads(line[5:]).get("meta_info", {}).get("completion_tokens", 0) >= lead_tokens:
                    started = threading.Thread(
                        target=post_json, args=(url, "/start_profile", profile, 120.0), daemon=True
                    )
                    started.start()
    if started is None:
        return None
    started.join()
    end = time.time() + wait_s
    while time.time() < end:
        traces = sorted(out_dir.rglob("*.trace.json.gz"))
        if traces:
            time.sleep(1.0)  # the exporter may still be writing
            return traces[0]
        time.sleep(1.0)
    return None


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def _table(groups: Mapping[str, list[float]], steps: int, min_ms: float = 0.0) -> list[dict]:
    """[{name, per_step (calls), ms (per step)}] by time, those of at least min_ms per step."""
    rows = [
        {"name": _short(n), "per_step": round(len(d) / steps, 2), "ms": round(sum(d) / 1000.0 / steps, 4)}
        for n, d in groups.items()
    ]
    return sorted((r for r in rows if r["ms"] >= min_ms), key=lambda r: -r["ms"])


def graph_segments(events: list[dict]) -> Optional[dict]:
    """Medians over the window's steps (ms) of a speculative server's timeline at c = 1, where every step replays two
    CUDA graphs: the draft graph (the one with fewer kernels) and the target's verify graph. A kernel belongs to the
    graph launch whose correlation id it carries. None where the window has no such pair (no speculation, eager)."""
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in RUNTIME_CATS and e["name"] == "cudaGraphLaunch" and "correlation" in e.get("args", {})
    }
    graphs, eager = defaultdict(list), []
    for e in events:
        if e.get("cat") in GPU_CATS:
            corr = e.get("args", {}).get("correlation")
            (graphs[corr] if corr in launches else eager).append(e)
    spans = sorted(
        (
            {
                "host": float(launches[c]["ts"]),
                "start": min(float(k["ts"]) for k in ks),
                "end": max(float(k["ts"]) + float(k["dur"]) for k in ks),
                "kernels": len(ks),
            }
            for c, ks in graphs.items()
        ),
        key=lambda g: g["start"],
    )
    if len({g["kernels"] for g in spans}) != 2:
        return None
    fewer = min(g["kernels"] for g in spans)
    drafts = [g for g in spans if g["kernels"] == fewer]
    rows = defaultdict(list)
    for draft, following in zip(drafts, drafts[1:]):
        verify = [g for g in spans if g["kernels"] != fewer and draft["start"] < g["start"] < following["start"]]
        if len(verify) != 1:
            continue
        verify = verify[0]
        rows["draft_graph_ms"].append(draft["end"] - draft["start"])
        rows["idle_draft_to_verify_ms"].append(verify["start"] - draft["end"])
        rows["verify_graph_ms"].append(verify["end"] - verify["start"])
        rows["idle_verify_to_next_draft_ms"].append(following["start"] - verify["end"])
        rows["host_draft_to_verify_launch_ms"].append(verify["host"] - draft["host"])
        rows["eager_gpu_ms"].append(
            sum(float(e["dur"]) for e in eager if draft["start"] <= float(e["ts"]) < following["start"])
        )
    if not rows:
        return None
    out = {key: round(statistics.median(values) / 1000.0, 4) for key, values in rows.items()}
    return {
        "steps": len(rows["draft_graph_ms"]),
        "draft_kernels": fewer,
        "verify_kernels": max(g["kernels"] for g in spans),
        **out,
    }


def summarize(trace: Path, steps: int) -> dict:
    """Per-step figures of a profiled window of `steps` forward passes (module docstring)."""
    with gzip.open(trace, "rt") as f:
        events = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    if not gpu:
        raise ValueError(f"{trace}: no GPU activity in the trace (was the GPU activity profiled?)")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu]
    wall_ms = (max(end for _, end in spans) - min(start for start, _ in spans)) / 1000.0
    busy_ms = busy_seconds(spans) / 1000.0  # spans in microseconds
    kernels, runtime, python = defaultdict(list), defaultdict(list), defaultdict(list)
    for e in events:
        cat, dur = e.get("cat"), float(e["dur"])
        if cat == "kernel":
            kernels[e["name"]].append(dur)
        elif cat in RUNTIME_CATS:
            runtime[e["name"]].append(dur)
        elif cat == "python_function":
            python[e["name"]].append(dur)
    return {
        "trace": Path(trace).name,
        "steps": steps,
        "wall_ms": round(wall_ms / steps, 4),
        "gpu_busy_ms": round(busy_ms / steps, 4),
        "gpu_idle_ms": round((wall_ms - busy_ms) / steps, 4),
        "kernels": round(sum(len(d) for d in kernels.values()) / steps, 2),
        "top_kernels": _table(kernels, steps)[:TOP],
        "runtime": _table(runtime, steps),
        "python": _table(python, steps, PYTHON_MIN_MS),
        "segments": graph_segments(events),
    }


def python_differences(summaries: Mapping[str, dict], a: str, b: str) -> list[dict]:
    """The Python frames whose host ms per step differ most between systems a and b."""
    ms = {s: {r["name"]: r["ms"] for r in summaries[s]["python"]} for s in (a, b)}
    rows = [
        {"name": n, a: ms[a].get(n, 0.0), b: ms[b].get(n, 0.0), "diff": round(ms[a].get(n, 0.0) - ms[b].get(n, 0.0), 4)}
        for n in set(ms[a]) | set(ms[b])
    ]
    return sorted(rows, key=lambda r: -abs(r["diff"]))[:TOP]


def compare(summaries: Mapping[str, dict]) -> str:
    """Markdown: the per-step figures of every system, each system's top kernels / runtime calls / Python frames,
    and the Python frames that differ most between the first two systems."""
    systems = list(summaries)
    lines = ["| per step | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    for key, label in (
        ("wall_ms", "wall (ms)"),
        ("gpu_busy_ms", "GPU busy (ms)"),
        ("gpu_idle_ms", "GPU idle (ms)"),
        ("kernels", "kernel launches"),
    ):
        lines.append(f"| {label} | " + " | ".join(f"{summaries[s][key]}" for s in systems) + " |")
    for key in SEGMENTS:
        lines.append(
            f"| {key} (median) | "
            + " | ".join(str((summaries[s].get("segments") or {}).get(key, "-")) for s in systems)
            + " |"
        )
    for s in systems:
        for key, label in (
            ("top_kernels", "kernels by GPU time"),
            ("runtime", "CUDA runtime calls by host time"),
            ("python", "Python frames by inclusive host time"),
        ):
            lines += ["", f"**{s}: {label}** (per step)", "", "| name | calls | ms |", "|---|---|---|"]
            lines += [f"| `{r['name']}` | {r['per_step']} | {r['ms']} |" for r in summaries[s][key][:TOP]]
    if len(systems) >= 2:
        a, b = systems[:2]
        lines += [
            "",
            f"**Python frames: {a} - {b}** (host ms per step)",
            "",
            f"| name | {a} | {b} | difference |",
            "|---|---|---|---|",
        ]
        lines += [f"| `{r['name']}` | {r[a]} | {r[b]} | {r['diff']} |" for r in python_differences(summaries, a, b)]
    return "\n".join(lines) + "\n"
