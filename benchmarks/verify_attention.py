"""The target-verify attention of a speculative block, alone on the GPU: SGLang's Triton kernels for a block of
B = 16 causal query tokens per request over its cached prefix.

  extend   `extend_attention_fwd`, what SGLang's Triton backend runs for every target verify on CUDA: one program
           per (request, query head, 128-query tile), each walking the whole prefix serially (at c = 1 and 9 heads,
           9 programs on 132 SMs)
  splitkv  `verify_splitkv_fwd`, SGLang's split-KV verify kernel (prefix split over programs, log-sum-exp merge), which
           its Triton backend enables on AMD MI350-class chips only (SGLANG_ENABLE_SPLITKV_VERIFY)

Both at each (geometry, batch, prefix length): the kernel time (triton.testing.do_bench, median ms) and each output's
largest difference from a float32 reference on the first request (causal over prefix + block). Geometries: SmolLM2-135M (9 query / 3 KV heads of 64) and Qwen3-8B (32 / 8 of
128).

  python -m sglang_lilicorr.benchmarks.verify_attention --out DIR     (on a GPU; DIR/verify_attention.json + .png)
  python -m sglang_lilicorr.benchmarks.verify_attention --plot DIR/verify_attention.json --out DIR   (the plot again)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

GEOMETRIES = {"smollm2-135m": (9, 3, 64), "qwen3-8b": (32, 8, 128)}  # query heads, KV heads, head dim
BLOCK = 16


def problem(geometry: str, bs: int, prefix: int, seed: int = 0) -> dict:
    """Random bf16 inputs of one verify: bs requests, each `prefix` cached tokens + BLOCK new ones."""
    hq, hkv, d = GEOMETRIES[geometry]
    g = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    tokens = bs * BLOCK
    pool = bs * (prefix + BLOCK)
    perm = torch.randperm(pool, generator=g, device="cuda")  # cached tokens scattered over the pool, as in serving
    return {
        "q_extend": rand(tokens, hq, d), "k_extend": rand(tokens, hkv, d), "v_extend": rand(tokens, hkv, d),
        "k_buffer": rand(pool, hkv, d), "v_buffer": rand(pool, hkv, d),
        "qo_indptr": torch.arange(bs + 1, device="cuda", dtype=torch.int32) * BLOCK,
        "kv_indptr": torch.arange(bs + 1, device="cuda", dtype=torch.int32) * prefix,
        "kv_indices": perm[: bs * prefix].to(torch.int64),
    }


def run(kernel: str, p: dict) -> torch.Tensor:
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

    o = torch.empty_like(p["q_extend"])
    args = (p["q_extend"], p["k_extend"], p["v_extend"], o, p["k_buffer"], p["v_buffer"], p["qo_indptr"], p["kv_indptr"],
            p["kv_indices"], None, True, None, BLOCK, 1.0, 1.0)
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
    return F.scaled_dot_product_attention(p["q_extend"][:BLOCK].float().transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1)


def measure(geometries, batches, prefixes) -> list[dict]:
    import triton.testing

    rows = []
    for geometry in geometries:
        for bs in batches:
            for prefix in prefixes:
                p = problem(geometry, bs, prefix)
                out = {k: run(k, p) for k in ("extend", "splitkv")}
                ref = reference(p, *GEOMETRIES[geometry][:2])
                ms = {k: triton.testing.do_bench(lambda k=k: run(k, p), warmup=25, rep=100) for k in out}
                rows.append({"geometry": geometry, "bs": bs, "prefix": prefix, "extend_ms": round(ms["extend"], 4),
                             "splitkv_ms": round(ms["splitkv"], 4), "speedup": round(ms["extend"] / ms["splitkv"], 2),
                             **{f"{k}_err": float((o[:BLOCK].float() - ref).abs().max()) for k, o in out.items()}})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def plot(doc: dict, path: Path) -> Path:
    """extend / splitkv time against the prefix length: one panel per geometry, one line per batch size."""
    from .plots import pyplot

    plt = pyplot()
    geometries = sorted({r["geometry"] for r in doc["rows"]})
    fig, axes = plt.subplots(1, len(geometries), figsize=(5 * len(geometries), 3.6), squeeze=False)
    for ax, geometry in zip(axes[0], geometries):
        rows = [r for r in doc["rows"] if r["geometry"] == geometry]
        for i, bs in enumerate(sorted({r["bs"] for r in rows})):
            line = sorted((r for r in rows if r["bs"] == bs), key=lambda r: r["prefix"])
            ax.plot([r["prefix"] for r in line], [r["speedup"] for r in line], marker="o", color=f"C{i}", label=f"c = {bs}")
        ax.axhline(1.0, color="grey", lw=0.8)
        prefixes = sorted({r["prefix"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_xticks(prefixes, [str(x) for x in prefixes], minor=False)
        ax.minorticks_off()
        ax.set(xlabel="prefix tokens per request", ylabel="extend ms / splitkv ms", title=f"{geometry}, {doc['device']}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_lilicorr.benchmarks.verify_attention", description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    raise SystemExit(main())
