"""Experiment (not committed): which early-launched (PDL) kernels lose to a full-order launch.
Each named kernel's launches forced to launch_pdl=False by a proxy; post-logits graph replay, interleaved rounds."""
import json, os, sys
import torch, torch.nn.functional as F
from sglang_lilicorr.benchmarks.head_bench import build_ours, make_inputs, GEOMETRIES
from sglang_lilicorr.fast_head import FastLiLiCorrSelect
from sglang_lilicorr.kernels.graph_timing import graph_ms
from sglang_lilicorr.kernels import lattice_attention as la, head_scores as hs, topk_lse_fused as tk, head_nodes as hn, ffn_silu as fs

class FullOrder:
    def __init__(self, k): self.k, self.on = k, False
    def __getitem__(self, grid):
        f = self.k[grid]
        return (lambda *a, **kw: f(*a, **{**kw, "launch_pdl": False})) if self.on else f
PROXIES = {"attn": (la, "_lattice_attention_kernel"), "cos": (hs, "_lattice_cosine_kernel"),
           "merge": (tk, "_topk_lse_merge_kernel"), "confup": (hn, "_confidence_up_kernel")}
for name, (mod, attr) in PROXIES.items():
    setattr(mod, attr, FullOrder(getattr(mod, attr)))
VARS = {"base": (), "attn": ("attn",), "cos": ("cos",), "merge": ("merge",), "confup": ("confup",), "attn_cos": ("attn", "cos")}
out = {}
for geo_name, bs in (("paper", 1), ("paper", 4), ("testbed", 1)):
    geo = GEOMETRIES[geo_name]
    head = build_ours(geo, "cuda", torch.bfloat16)
    g = torch.Generator(device="cpu").manual_seed(7)
    table = head.token_table(torch.randn(geo.V, geo.HM, generator=g).to("cuda", torch.bfloat16))
    lm_head = (torch.randn(geo.V, geo.HM, generator=g) * 0.02).to("cuda", torch.bfloat16)
    hidden, anchor = make_inputs(geo, bs, "cuda", torch.bfloat16)
    logits = F.linear(hidden.reshape(bs * geo.S, geo.HM), lm_head)
    fast = FastLiLiCorrSelect(head, token_table=table)
    ref = None
    for rnd in range(4):
        for v, on in VARS.items():
            for name, (mod, attr) in PROXIES.items():
                getattr(mod, attr).on = name in on
            ms, res = graph_ms(lambda: fast.select_from_logits(logits, hidden, anchor), 100)
            if ref is None: ref = res
            assert all(torch.equal(a, b) for a, b in zip(ref, res)), v
            out.setdefault(f"{geo_name}_bs{bs}", {}).setdefault(v, []).append(ms * 1e3)
    r = out[f"{geo_name}_bs{bs}"]
    print(geo_name, bs, " ".join(f"{v} {sorted(x)[len(x)//2]:.1f}/{min(x):.1f}" for v, x in r.items()), flush=True)
json.dump(out, open(os.path.join(os.environ["OUT"], "exp_order.json"), "w"))
