"""Experiment (not committed): on version 18 (the merge in full order), in context (post-logits graph replay):
the attention launched in full order; the cosine kernel's launch geometry; the pass projection forked before the top-K."""
import json, os
import torch, torch.nn.functional as F
from sglang_lilicorr.benchmarks.head_bench import build_ours, make_inputs, GEOMETRIES
from sglang_lilicorr.fast_head import FastLiLiCorrSelect, _SideStream
from sglang_lilicorr.kernels import lattice_attention as la, head_scores as hs
from sglang_lilicorr.kernels.graph_timing import graph_ms

class FullOrder:
    def __init__(self, k): self.k, self.on = k, False
    def __getitem__(self, grid):
        f = self.k[grid]
        return (lambda *a, **kw: f(*a, **{**kw, "launch_pdl": False})) if self.on else f
la._lattice_attention_kernel = attn = FullOrder(la._lattice_attention_kernel)
walk_fn = hs.lattice_cosine_walk_triton
cos_launch = [hs.LAUNCH]
hs.lattice_cosine_walk_triton = lambda *a, **kw: walk_fn(*a, launch=cos_launch[0], **kw)

def projections_pass_early(self, pass_hidden, anchor_hidden):  # the pass was forked before the top-K (self._early)
    pass_proj, join_pass = self._early
    side = _SideStream(self._side)
    with side:
        t, anchor = self._anchor_projection(anchor_hidden)
        ready = side.record()
    return pass_proj, t, anchor, join_pass, lambda: side.join(ready, t, anchor)

def select_pass_early(fast, logits, hidden, anchor):
    side = _SideStream(fast._side)
    with side:
        pass_proj = fast._pass_projection(hidden)
        ready = side.record()
    fast._early = (pass_proj, lambda: side.join(ready, pass_proj))
    fast._projections = projections_pass_early.__get__(fast)
    try:
        return fast.select_from_logits(logits, hidden, anchor)
    finally:
        del fast._projections

VARS = {"base": {}, "attn_full": dict(attn=True), "pass_early": dict(early=True),
        "cos_128x5": dict(cos=hs.CosineLaunch(block_d=128, num_stages=5)), "cos_256x4": dict(cos=hs.CosineLaunch(block_d=256, num_stages=4)),
        "cos_64x8": dict(cos=hs.CosineLaunch(block_d=64, num_stages=8)), "cos_128x8w8": dict(cos=hs.CosineLaunch(block_d=128, num_warps=8, num_stages=4))}
out = {}
for geo_name, bss in (("paper", (1, 4)), ("testbed", (1, 4))):
    geo = GEOMETRIES[geo_name]
    head = build_ours(geo, "cuda", torch.bfloat16)
    g = torch.Generator(device="cpu").manual_seed(7)
    table = head.token_table(torch.randn(geo.V, geo.HM, generator=g).to("cuda", torch.bfloat16))
    lm_head = (torch.randn(geo.V, geo.HM, generator=g) * 0.02).to("cuda", torch.bfloat16)
    fast = FastLiLiCorrSelect(head, token_table=table)
    for bs in bss:
        hidden, anchor = make_inputs(geo, bs, "cuda", torch.bfloat16)
        logits = F.linear(hidden.reshape(bs * geo.S, geo.HM), lm_head)
        ref = None
        for rnd in range(4):
            for v, kw in VARS.items():
                attn.on, cos_launch[0] = kw.get("attn", False), kw.get("cos", hs.LAUNCH)
                fn = (lambda: select_pass_early(fast, logits, hidden, anchor)) if kw.get("early") else (lambda: fast.select_from_logits(logits, hidden, anchor))
                ms, res = graph_ms(fn, 100)
                ref = ref or res
                same = all(torch.equal(a, b) for a, b in zip(ref, res))
                out.setdefault(f"{geo_name}_bs{bs}", {}).setdefault(v, []).append(ms * 1e3)
                if not same:
                    out.setdefault("differs_from_base", []).append(f"{geo_name}_bs{bs}_{v}")
        r = out[f"{geo_name}_bs{bs}"]
        print(geo_name, bs, " ".join(f"{v} {sorted(x)[len(x)//2]:.1f}/{min(x):.1f}" for v, x in r.items()), flush=True)
print("differs from base:", sorted(set(out.get("differs_from_base", []))))
json.dump(out, open(os.path.join(os.environ["OUT"], "exp2.json"), "w"))
