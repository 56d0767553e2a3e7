"""The target-verify attention of a speculative block, alone on the GPU: SGLang's Triton kernels for a block of
B = 16 causal query tokens per request over its cached prefix.

  extend   `extend_attention_fwd`, what SGLang's Triton backend runs for every target verify on CUDA: one program
           per (request, query head, 128-query tile), each walking the whole prefix serially (at c = 1 and 9 heads,
           9 programs on 132 SMs)
  splitkv  `verify_splitkv_fwd`, SGLang's split-KV verify kernel (prefix split over programs, log-sum-exp merge), which
           its Triton backend enables on AMD MI350-class chips only (SGLANG_ENABLE_SPLITKV_VERIFY); it picks its
           split count from the shape of kv_indices (4 below 4k tokens per request, 8 below 8k, else 16)
  splitkv_graph  the same kernel as a captured CUDA graph calls it: kv_indices is the graphs' static buffer,
           GRAPH_KV_SLOTS long, so the split count comes from that length, not from the requests

Each at every (geometry, batch, prefix length): its time per call inside a CUDA graph of REPLAY_CALLS calls (as a
served verify runs it: no launch or Python overhead; the inputs stay in L2 between calls), and its output's largest
difference from a float32 reference on the first request (causal over prefix + block). Geometries: SmolLM2-135M
(9 query / 3 KV heads of 64) and Qwen3-8B (32 / 8 of 128).

  python -m benchmarks verify-attention-bench --out DIR     (on a GPU; DIR/verify_attention.json + .png)
  python -m benchmarks verify-attention-bench --plot DIR/verify_attention.json --out DIR   (the plot again)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

GEOMETRIES = {"smollm2-135m": (9, 3, 64), "qwen3-8b": (32, 8, 128)}  # query heads, KV heads, head dim
BLOCK = 16
GRAPH_KV_SLOTS = (
    32 * 4096
)  # the graphs' kv_indices buffer: --cuda-graph-max-bs-decode 32 x --context-length 4096 (the testbed's)
KERNELS = ("extend", "splitkv", "splitkv_graph")
REPLAY_CALLS = 20  # calls captured in one graph
REPLAYS = 10  # graph replays timed


def problem(geometry: str, bs: int, prefix: int, seed: int = 0) -> dict:
    """Random bf16 inputs of one verify: bs requests, each `prefix` cached tokens + BLOCK new ones."""
    hq, hkv, d = GEOMETRIES[geometry]
    g = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    tokens = bs * BLOCK
    pool = bs * (prefix + BLOCK)
    perm = torch.randperm(pool, generator=g, device="cuda")  # cached tokens scattered over the pool, as in serving
    return {
        "q_extend": rand(tokens, hq, d),
        "k_extend": rand(tokens, hkv, d),
        "v_extend": rand(tokens, hkv, d),
        "k_buffer": rand(pool, hkv, d),
        "v_buffer": rand(pool, hkv, d),
        "qo_indptr": torch.arange(bs + 1, device="cuda", dtype=torch.int32) * BLOCK,
        "kv_indptr": torch.arange(bs + 1, device="cuda", dtype=torch.int32) * prefix,
        "kv_indices": perm[: bs * prefix].to(torch.int64),
        "kv_indices_graph": torch.cat(
            [
                perm[: bs * prefix].to(torch.int64),
                torch.zeros(max(0, GRAPH_KV_SLOTS - bs * prefix), dtype=torch.int64, device="cuda"),
            ]
        ),
    }


def run(kernel: str, p: dict, o: torch.Tensor) -> torch.Tensor:
    """One verify attention by `kernel` into o [tokens, hq, d]."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

    indices = p["kv_indices_graph" if kernel == "splitkv_graph" else "kv_indices"]
    args = (
        p["q_extend"],
        p["k_extend"],
        p["v_extend"],
        o,
        p["k_buffer"],
        p["v_buffer"],
        p["qo_indptr"],
        p["kv_indptr"],
        indices,
        None,
        True,
        None,
        BLOCK,
        1.0,
        1.0,
    )
    if kernel == "extend":
        extend_attention_fwd(*args)
    elif not verify_splitkv_fwd(*args):
        raise RuntimeError("verify_splitkv_fwd declined this problem")
    return o


def reference(p: dict, hq: int, hkv: int) -> torch.Tensor:
    """The first request's output [BLOCK, hq, d] in float32: each query sees the prefix and the block up to itself."""
    import torch.nn.functional as F

    prefix = int(p["kv_indptr"][1])
    idx = p["kv_indices"][:prefix]
    k = torch.cat([p["k_buffer"][idx], p["k_extend"][:BLOCK]]).float().transpose(0, 1).repeat_interleave(hq // hkv, 0)
    v = torch.cat([p["v_buffer"][idx], p["v_extend"][:BLOCK]]).float().transpose(0, 1).repeat_interleave(hq // hkv, 0)
    mask = torch.ones(BLOCK, prefix + BLOCK, dtype=torch.bool, device=k.device).tril(prefix)
    return F.scaled_dot_product_attention(
        p["q_extend"][:BLOCK].float().transpose(0, 1), k, v, attn_mask=mask
    ).transpose(0, 1)


def graph_ms(fn) -> float:
    """ms per call of fn, captured REPLAY_CALLS times in one CUDA graph and replayed REPLAYS times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm outside the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPLAY_CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (REPLAYS * REPLAY_CALLS)


def measure(geometries, batches, prefixes) -> list[dict]:
    rows = []
    for geometry in geometries:
        for bs in batches:
            for prefix in prefixes:
                p = problem(geometry, bs, prefix)
                out = {k: run(k, p, torch.empty_like(p["q_extend"])) for k in KERNELS}
                ref = reference(p, *GEOMETRIES[geometry][:2])
                ms = {k: graph_ms(lambda k=k: run(k, p, out[k])) for k in KERNELS}
                rows.append(
                    {
                        "geometry": geometry,
                        "bs": bs,
                        "prefix": prefix,
                        **{f"{k}_ms": round(ms[k], 4) for k in KERNELS},
                        "speedup": round(ms["extend"] / ms["splitkv"], 2),
                        "speedup_graph": round(ms["extend"] / ms["splitkv_graph"], 2),
                        **{f"{k}_err": float((o[:BLOCK].float() - ref).abs().max()) for k, o in out.items()},
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def plot(doc: dict, path: Path) -> Path:
    """extend / splitkv time against the prefix length: one panel per geometry, one line per batch size."""
    from sglang_lilicorr.bench.plots import pyplot, save

    plt = pyplot()
    geometries = sorted({r["geometry"] for r in doc["rows"]})
    fig, axes = plt.subplots(1, len(geometries), figsize=(5 * len(geometries), 3.6), squeeze=False)
    for ax, geometry in zip(axes[0], geometries):
        rows = [r for r in doc["rows"] if r["geometry"] == geometry]
        for i, bs in enumerate(sorted({r["bs"] for r in rows})):
            line = sorted((r for r in rows if r["bs"] == bs), key=lambda r: r["prefix"])
            ax.plot(
                [r["prefix"] for r in line], [r["speedup"] for r in line], marker="o", color=f"C{i}", label=f"c = {bs}"
            )
            if "speedup_graph" in line[0]:
                ax.plot(
                    [r["prefix"] for r in line],
                    [r["speedup_graph"] for r in line],
                    marker="x",
                    ls="--",
                    color=f"C{i}",
                    label=f"c = {bs}, graph buffer",
                )
        ax.axhline(1.0, color="grey", lw=0.8)
        prefixes = sorted({r["prefix"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_xticks(prefixes, [str(x) for x in prefixes], minor=False)
        ax.minorticks_off()
        ax.set(
            xlabel="prefix tokens per request", ylabel="extend ms / splitkv ms", title=f"{geometry}, {doc['device']}"
        )
        ax.legend(fontsize=7)
    return save(fig, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--plot", type=Path, help="draw DIR/verify_attention.png from this verify_attention.json (no GPU)")
    p.add_argument("--geometry", nargs="+", default=list(GEOMETRIES), choices=list(GEOMETRIES))
    p.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--prefix", type=int, nargs="+", default=[256, 1024, 4096])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.plot:
        try:
            doc = json.loads(args.plot.read_text())
        except (OSError, json.JSONDecodeError) as e:
            p.error(f"{args.plot}: not a readable verify_attention.json ({e})")
        print(plot(doc, args.out / "verify_attention.png"))
        return 0
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (SGLang's Triton attention kernels); run it on the device machine")
    doc = {"device": torch.cuda.get_device_name(), "rows": measure(args.geometry, args.bs, args.prefix)}
    (args.out / "verify_attention.json").write_text(json.dumps(doc, indent=1))
    plot(doc, args.out / "verify_attention.png")
    return 0
