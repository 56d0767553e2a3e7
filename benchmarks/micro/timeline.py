"""Where the time of one served select goes: the kernel timeline of its CUDA-graph replay.

  python3 -m benchmarks timeline [--geometry paper] [--bs 1] [--reps 20] [--variant served] \
      [--out timeline.json]

Builds the served select path (`FastLiLiCorrSelect` with its served plans, head_bench's trained-like weights;
--variant: another of head_bench's VARIANTS, e.g. served_unfolded without the folded norms), captures
`propose` (post-logits: top-K/LSE + head + walk) in a CUDA graph, and
records `reps` replays with torch.profiler. Per kernel of the replay, in launch order: its stream,
median start (us after the replay's first kernel starts), median duration, and median idle time on
its stream before it (since that stream's previous kernel ended, or since the replay began). The
sums split the replay's wall time into kernel time and boundaries (PERF_NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F


def replay_rows(trace: dict, n_kernels: int) -> list[list[dict]]:
    """Chrome-trace dict -> per replay, its n_kernels kernel events {name, stream, start, dur}
    (us; start relative to the replay's first kernel), in start order."""
    kernels = sorted(
        (e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"),
        key=lambda e: float(e["ts"]),
    )
    replays = []
    for i in range(0, len(kernels) - n_kernels + 1, n_kernels):
        chunk = kernels[i : i + n_kernels]
        t0 = float(chunk[0]["ts"])
        replays.append(
            [
                {
                    "name": e["name"],
                    "stream": e.get("args", {}).get("stream", 0),
                    "start": float(e["ts"]) - t0,
                    "dur": float(e["dur"]),
                }
                for e in chunk
            ]
        )
    return replays


def timeline(replays: list[list[dict]]) -> dict:
    """Per position: name, stream, median start / duration / idle before it on its stream; and the
    medians of the replay's wall time, its critical stream's kernel time and idle time."""
    rows, walls, busy, idle = [], [], [], []
    for rep in replays:
        last_end: dict = {}
        for k in rep:
            k["idle"] = k["start"] - last_end.get(k["stream"], 0.0)
            last_end[k["stream"]] = k["start"] + k["dur"]
        walls.append(max(k["start"] + k["dur"] for k in rep))
        main = rep[0]["stream"]
        busy.append(sum(k["dur"] for k in rep if k["stream"] == main))
        idle.append(sum(k["idle"] for k in rep if k["stream"] == main))
    for pos in range(len(replays[0])):
        ks = [rep[pos] for rep in replays]
        rows.append(
            {
                "name": ks[0]["name"][:70],
                "stream": ks[0]["stream"],
                **{f: statistics.median(k[f] for k in ks) for f in ("start", "dur", "idle")},
            }
        )
    med = statistics.median
    return {
        "kernels": rows,
        "wall_us": med(walls),
        "main_busy_us": med(busy),
        "main_idle_us": med(idle),
        "replays": len(replays),
    }


def run(geometry: str, bs: int, reps: int, variant: str = "served") -> dict:
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.micro.head_bench import GEOMETRIES, build_ours, build_variant, make_inputs
    from benchmarks.micro.graph_timing import capture

    geo, dev, dtype = GEOMETRIES[geometry], "cuda", torch.bfloat16
    head = build_ours(geo, dev, dtype)
    g = torch.Generator().manual_seed(0)
    embed = (torch.randn(geo.V, geo.HM, generator=g) * 0.02).to(dev, dtype)
    lm_head = (torch.randn(geo.V, geo.HM, generator=g) / geo.HM**0.5).to(dev, dtype)
    with torch.no_grad():
        fast = build_variant(variant, head, head.token_table(embed))
    hidden, anchor = make_inputs(geo, bs, dev, dtype)
    logits = F.linear(hidden.reshape(bs * geo.S, geo.HM), lm_head)
    graph, _ = capture(lambda: fast.propose(logits, hidden, anchor))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # kernels per replay, counted once
        graph.replay()
        torch.cuda.synchronize()
    n_kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    if not n_kernels:
        raise RuntimeError(
            "timeline: the profiler saw no kernels in a graph replay (CUPTI kernel tracing of graphs unavailable)"
        )
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
            torch.cuda.synchronize()  # one replay at a time: the starts of a replay are its own
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    res = timeline(replay_rows(trace, n_kernels))
    return {
        "card": torch.cuda.get_device_name(),
        "geometry": geometry,
        "bs": bs,
        "variant": variant,
        "kernels_per_replay": n_kernels,
        **res,
    }


def format_timeline(res: dict) -> str:
    lines = [
        f"{res.get('card', '')} {res.get('geometry', '')} bs {res.get('bs', '')}: "
        f"{res['replays']} replays, medians in us",
        f"{'#':>3} {'stream':>6} {'start':>7} {'dur':>6} {'idle':>6}  kernel",
    ]
    for i, k in enumerate(res["kernels"]):
        lines.append(f"{i:>3} {k['stream']:>6} {k['start']:>7.1f} {k['dur']:>6.1f} {k['idle']:>6.1f}  {k['name']}")
    lines.append(
        f"wall {res['wall_us']:.1f} us; first stream: kernels {res['main_busy_us']:.1f} us, "
        f"idle between them {res['main_idle_us']:.1f} us"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="kernel timeline of the served select's CUDA-graph replay")
    ap.add_argument("--geometry", choices=("paper", "testbed"), default="paper")
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--variant", default="served", help="one of head_bench's VARIANTS (the select's plans), e.g. served_unfolded"
    )
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "timeline.json"))
    args = ap.parse_args(argv)
    from benchmarks.micro.head_bench import VARIANTS

    if args.variant not in VARIANTS:
        ap.error(f"--variant {args.variant!r} unknown; use one of {sorted(VARIANTS)}")
    if not torch.cuda.is_available():
        print("timeline needs a CUDA GPU")
        return 2
    res = run(args.geometry, args.bs, args.reps, args.variant)
    print(format_timeline(res))
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0
