"""Experiment (not committed): the top-K merge launched early (PDL) or in full order, with and without the
confidence MLP's up projection in it (version 18's merge+up). post-logits graph replay, interleaved rounds."""
import json, os
import torch, torch.nn.functional as F
from sglang_lilicorr.benchmarks.head_bench import build_ours, make_inputs, GEOMETRIES
from sglang_lilicorr.fast_head import FastLiLiCorrSelect
from sglang_lilicorr.kernels import topk_lse, topk_lse_fused as tk
from sglang_lilicorr.kernels.graph_timing import graph_ms

class FullOrder:
    def __init__(self, k): self.k, self.on = k, False
    def __getitem__(self, grid):
        f = self.k[grid]
        return (lambda *a, **kw: f(*a, **{**kw, "launch_pdl": False})) if self.on else f
tk._topk_lse_merge_kernel = merge = FullOrder(tk._topk_lse_merge_kernel)
served_candidates = FastLiLiCorrSelect._candidates_from_logits
def v17_candidates(self, logits, b, s):  # top-K alone; the node stage runs the confidence up kernel
    vals, ids, lse = topk_lse(logits, self.topk, pdl=self._pdl_at(b * s * self.topk))
    return vals.view(b, s, self.topk), ids.view(b, s, self.topk), lse.view(b, s), None
VARS = {"v17": (v17_candidates, False), "v17_mf": (v17_candidates, True), "up": (served_candidates, False), "up_mf": (served_candidates, True)}
out = {}
for geo_name, bss in (("paper", (1, 4, 16, 32)), ("testbed", (1, 4, 16))):
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
            for v, (cand, full) in VARS.items():
                FastLiLiCorrSelect._candidates_from_logits, merge.on = cand, full
                ms, res = graph_ms(lambda: fast.select_from_logits(logits, hidden, anchor), 100)
                ref = ref or res
                assert all(torch.equal(a, b) for a, b in zip(ref, res)), v
                out.setdefault(f"{geo_name}_bs{bs}", {}).setdefault(v, []).append(ms * 1e3)
        r = out[f"{geo_name}_bs{bs}"]
        print(geo_name, bs, " ".join(f"{v} {sorted(x)[len(x)//2]:.1f}/{min(x):.1f}" for v, x in r.items()), flush=True)
json.dump(out, open(os.path.join(os.environ["OUT"], "exp_merge.json"), "w"))
