"""The lattice layers as one persistent kernel (kernels/lattice_persistent.py).

CPU: under Triton's interpreter the kernel runs one launch per phase (a grid barrier cannot open
when programs run one after another); tests/test_fast_head.py checks that path against the
launch-per-GEMM fused path. Here: the sm_90 build of the persistent mode (ptxas, no GPU needed)
and, on a GPU (`-m gpu`), the persistent launch against the per-phase launches at the paper shape.
"""
from __future__ import annotations

import pytest
import torch

from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.fast_head import FastLiLiCorrSelect

from sm90_build import check_in_fresh_process
from test_fast_head import make_head, make_inputs
from triton_mode import CUDA, INTERPRETER, graph_replay

_AOT = """
import sys
from sm90_build import build
from sglang_lilicorr.kernels import lattice_persistent as lp

bf = "*bf16"
types = [bf] * 8 + ["*i32", "*i64"] + [bf] * 10 + [bf, "i32", "i32", "i32", "i32", "fp32", "fp32"] + ["constexpr"] * 19
consts = dict(LINES_H=16, LINES_F=32, TRACE=False, H=1024, FFN=2048, HEADS=8, LAYERS=2, PHASE=-1, BLOCK_M=lp.BLOCK_M, BLOCK_N=lp.BLOCK_N, BLOCK_K=lp.BLOCK_K,
              EVEN_K=True, ATT_BLOCK_M=lp.ATT_BLOCK_M, LP=128, DP=128, BLOCK_H=1024, IEEE=False, F32_DOT=False, PREFETCH=True)
r = build(lp._lattice_layers_kernel, types, consts, aligned=tuple(range(22)), num_warps=lp.NUM_WARPS)
traced = build(lp._lattice_layers_kernel, types, {**consts, "TRACE": True}, aligned=tuple(range(22)), num_warps=lp.NUM_WARPS)
if "%globaltimer" not in traced["ptx"] or "atom.global.gpu.relaxed.max.s64" not in traced["ptx"]:
    sys.exit("the traced build reads no clock or records no per-phase finish")
ptx = r["ptx"]
print("registers", r["registers"], "spills", r["spills"], "shared", r["shared"])
barriers = 2 * lp.PHASES_PER_LAYER - 1
if r["spills"] or r["shared"] > 227 * 1024:
    sys.exit("the persistent kernel spills or overflows shared memory")
if ptx.count("atom.global.gpu.release.add") != barriers or ptx.count("ld.global.gpu.acquire") != barriers:
    sys.exit(f"expected {barriers} grid barriers (release arrival + acquire spin)")
if "cp.async.ca" in ptx or "ld.global.ca" in ptx:
    sys.exit("a load may hit a stale L1 line: data written in the launch must be read with .cg")
if "prefetch.global.L2" not in ptx:
    sys.exit("no L2 prefetch of the layer weights")
print("ok")
"""


def test_persistent_kernel_compiles_for_sm90(sm90_triton):
    """The paper shape in persistent mode, lowered to sm_90 in a fresh process: no spills, fits
    shared memory, one release arrival and one acquire spin per barrier (13), no L1-cached loads,
    the weights' L2 prefetch present."""
    assert check_in_fresh_process(_AOT, sm90_triton).rstrip().endswith("ok")


def test_phase_times_split_work_from_barrier():
    """trace[1] = start, then per phase p: trace[2p] last finish, trace[2p + 1] barrier open (ns)."""
    from sglang_lilicorr.kernels.lattice_persistent import phase_times

    trace = torch.tensor([0, 1000, 6000, 7500, 9500, 11000, 20000, 0], dtype=torch.int64)
    assert phase_times(trace) == [(5.0, 1.5), (2.0, 1.5), (9.0, 0.0)]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("b", [1, 4])
def test_gpu_persistent_equals_per_phase_and_replays(b):
    """bf16 paper config: the persistent launch (grid barriers) writes exactly what the per-phase
    launches of the same kernel write; a CUDA-graph replay (the counter zeroed by the previous
    launch) equals eager; the fused select with it is within the bf16 tolerance of the one without."""
    from sglang_lilicorr.kernels.lattice_persistent import lattice_layers_persistent

    cfg, hm, vocab = LiLiCorrConfig(), 4096, 32000
    head = make_head(cfg, hm, 0, dtype=torch.bfloat16, device="cuda")
    hidden, anchor, lm_head, embed = make_inputs(b, cfg.num_slots, hm, vocab, 0, dtype=torch.bfloat16, device="cuda")
    lm_head *= 0.1
    fast = FastLiLiCorrSelect(head, embed_weight=embed, fused=True, persistent=True)
    rows, h, n = b * cfg.num_slots * cfg.candidate_topk, fast.width, cfg.num_slots * cfg.candidate_topk
    g = torch.Generator(device="cuda").manual_seed(b)
    x0 = torch.randn(rows, h, device="cuda", generator=g).bfloat16()
    xn0 = torch.randn(rows, h, device="cuda", generator=g).bfloat16()
    t = torch.randn(b, h, device="cuda", generator=g).bfloat16()
    bias = fast.attn_bias[..., :n, :n]
    run = lambda persistent, prefetch=True: lattice_layers_persistent(  # noqa: E731
        fast.lattice, x0.clone(), xn0.clone(), bias, t, persistent=persistent, prefetch=prefetch)
    phased, whole = run(False), run(True)
    assert torch.equal(whole, phased) and torch.equal(run(True, prefetch=False), phased)
    assert torch.equal(graph_replay(lambda: run(True)), whole)
    assert fast.lattice.counter.tolist() == [0, 0, 0]  # zeroed for the next launch; no barrier gave up
    plain = FastLiLiCorrSelect(head, token_table=fast.token_table, fused=True)
    start, pair, _ = fast.lattice_scores(*fast.candidates(hidden, lm_head), hidden, anchor)
    p_start, p_pair, _ = plain.lattice_scores(*plain.candidates(hidden, lm_head), hidden, anchor)
    torch.testing.assert_close(start, p_start, atol=0.25, rtol=0)
    torch.testing.assert_close(pair, p_pair, atol=0.25, rtol=0)
