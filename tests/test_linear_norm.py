"""The GEMM with the residual add + RMSNorm epilogue (kernels/linear_norm.py) equals its PyTorch
definition: F.linear, the residual add in the stream's dtype, RMSNorm (and concat[h, h * t]).

CPU: fp32 under Triton's interpreter, whole-row tiles and rows split over column tiles (the
last-arriving program normalises; the counters are left zero), every config forced once, bad inputs
named; an sm_90 compile of every config under both Tritons. GPU (`-m gpu`): bf16 at the paper's and
the testbed's shapes, CUDA-graph replay, the counters across replays (timings: `python -m
sglang_lilicorr.kernels.linear_norm` on the GPU).
"""
from __future__ import annotations

import pytest
import torch

from sglang_lilicorr.kernels.head_nodes import lattice_nodes_triton
from sglang_lilicorr.kernels.head_norm import add_rmsnorm_triton
from sglang_lilicorr.kernels.linear_norm import (
    lattice_nodes_linear_reference,
    lattice_nodes_linear_triton,
    linear_add_rmsnorm_reference,
    linear_add_rmsnorm_triton,
    row_tiles,
    select_config,
)
from sglang_lilicorr.kernels.tuning import NORM_CONFIG_BY_SHAPE, NORM_CONFIGS, norm_band

from sm90_build import check_in_fresh_process
from triton_mode import CUDA, INTERPRETER, needs_interpreter


def _inputs(gen, m, k, n, dtype=torch.float32, device="cpu", b=None):
    a = torch.randn(m, k, generator=gen).to(device, dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    bias = torch.randn(n, generator=gen).to(device, dtype)
    x = torch.randn(m, n, generator=gen).to(device, dtype)
    norm_w = (1 + 0.1 * torch.randn(n, generator=gen)).to(device, dtype)
    cross = None if b is None else torch.randn(b, n, generator=gen).to(device, dtype)
    return a, weight, bias, x, norm_w, cross


@needs_interpreter
@pytest.mark.parametrize(
    "m, k, n, config",
    [
        (7, 48, 40, "fp32"),  # one column tile of 32 < 40: two tiles, partial rows; K not a multiple of BLOCK_K
        (37, 64, 96, "fp32"),  # three row tiles x three column tiles
        (20, 64, 96, "row16"),  # whole rows in one tile, two row tiles
        (20, 64, 300, "row16"),  # 300 > 256: two column tiles of a "row" config
        (70, 64, 96, "split64x32"),
        (70, 64, 130, "split64x64"),
    ],
)
@pytest.mark.parametrize("cross_rows", [None, 10])  # cross: t per request of 10 rows (m a multiple of it below)
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_pytorch(gen, m, k, n, config, cross_rows, with_bias):
    if cross_rows is not None:
        m = -(-m // cross_rows) * cross_rows
    a, weight, bias, x, norm_w, cross = _inputs(gen, m, k, n, b=None if cross_rows is None else m // cross_rows)
    bias = bias if with_bias else None
    x_ref = x.clone()
    counters = torch.zeros(16, dtype=torch.int32)
    out = linear_add_rmsnorm_triton(a, weight, bias, x, norm_w, 1e-6, counters, cross, config=config)
    ref = linear_add_rmsnorm_reference(a, weight, bias, x_ref, norm_w, 1e-6, cross)
    assert out.shape == ref.shape and out.dtype == x.dtype
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(x, x_ref, atol=1e-5, rtol=1e-5)  # the stream: x + y in place, untouched with cross
    assert not counters.any(), "every launch leaves the counters zero"


@needs_interpreter
def test_equals_the_two_launch_path_and_repeats(gen):
    """Same as F.linear + add_rmsnorm_triton (the path it replaces); launched twice on one counter
    buffer (a replay) it adds y twice, as the unfused path does."""
    a, weight, bias, x, norm_w, _ = _inputs(gen, 40, 32, 96, b=None)
    x2 = x.clone()
    counters = torch.zeros(4, dtype=torch.int32)
    for _ in range(2):
        out = linear_add_rmsnorm_triton(a, weight, bias, x, norm_w, 1e-5, counters, config="fp32")
        ref = add_rmsnorm_triton(x2, torch.nn.functional.linear(a, weight, bias), norm_w, 1e-5)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(x, x2, atol=1e-5, rtol=1e-5)


def _node_inputs(gen, b, s, k, h, vocab=50, s_max=None, dtype=torch.float32, device="cpu"):
    up = torch.randn(b * s * k, h, generator=gen)
    w_down = torch.randn(h, h, generator=gen) / h**0.5
    ids = torch.randint(0, vocab, (b, s, k), generator=gen)
    table = torch.randn(vocab, h, generator=gen)
    pass_proj = torch.randn(b, s, h, generator=gen)
    node_const = torch.randn(s_max or s, k, h, generator=gen)  # fp32 always
    norm_w = 1 + 0.1 * torch.randn(h, generator=gen)
    cast = lambda t: t.to(device, dtype)  # noqa: E731
    return cast(up), cast(w_down), ids.to(device), cast(table), cast(pass_proj), node_const.to(device), cast(norm_w)


@needs_interpreter
@pytest.mark.parametrize("b, s, s_max, k, h, config", [(3, 5, 5, 4, 40, "fp32"), (2, 3, 5, 4, 96, "fp32"), (2, 5, 5, 8, 64, "row16")])
def test_nodes_match_pytorch_and_the_two_launch_path(gen, b, s, s_max, k, h, config):
    """The node sum + norm in the down GEMM's epilogue: equals its PyTorch definition and
    lattice_nodes_triton on the cuBLAS GEMM; fewer slots than node_const holds (a shorter block)."""
    up, w_down, ids, table, pass_proj, node_const, norm_w = _node_inputs(gen, b, s, k, h, s_max=s_max)
    counters = torch.zeros(16, dtype=torch.int32)
    x, xn = lattice_nodes_linear_triton(up, w_down, ids, table, pass_proj, node_const, norm_w, 1e-6, counters, config=config)
    r_x, r_xn = lattice_nodes_linear_reference(up, w_down, ids, table, pass_proj, node_const, norm_w, 1e-6)
    torch.testing.assert_close(x, r_x, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(xn, r_xn, atol=1e-4, rtol=1e-4)
    u_x, u_xn = lattice_nodes_triton(ids, table, pass_proj, torch.nn.functional.linear(up, w_down), node_const, norm_w, 1e-6)
    torch.testing.assert_close(x, u_x, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(xn, u_xn, atol=1e-4, rtol=1e-4)
    assert not counters.any()


@needs_interpreter
def test_nodes_bad_shapes_raise(gen):
    up, w_down, ids, table, pass_proj, node_const, norm_w = _node_inputs(gen, 2, 3, 4, 32)
    with pytest.raises(ValueError, match="do not match ids"):
        lattice_nodes_linear_triton(up, w_down, ids, table, pass_proj[:, :2], node_const, norm_w, 1e-6, torch.zeros(8, dtype=torch.int32))


def test_config_table():
    """Every table row names a config; the selection covers every shape; fp32 has its own config."""
    assert all(row[2] in NORM_CONFIGS for row in NORM_CONFIG_BY_SHAPE) and NORM_CONFIG_BY_SHAPE[-1][:2] == (None, None)
    for n in (32, 256, 257, 1024, 4096):
        for m in (1, 120, 1920, 10**6):
            assert select_config(n, m, torch.bfloat16) in NORM_CONFIGS and isinstance(norm_band(n, m)[3], bool)
    assert select_config(1024, 120, torch.float32) == "fp32"
    assert row_tiles(120, 1024, torch.float32) == 120 // NORM_CONFIGS["fp32"].block_m + 1


@needs_interpreter
@pytest.mark.parametrize(
    "change, match",
    [
        (dict(counters=torch.zeros(1, dtype=torch.int32)), "at least 3 entries"),
        (dict(counters=torch.zeros(16, dtype=torch.int64)), "int32 zeros"),
        (dict(x=torch.randn(40, 95)), "residual stream x"),
        (dict(weight=torch.randn(96, 31)), "nn.Linear layout"),
        (dict(norm_w=torch.ones(95)), "norm weight"),
        (dict(cross=torch.randn(3, 96)), "dividing the 40 rows"),
        (dict(bias=torch.zeros(96, dtype=torch.float64)), "share one dtype"),
        (dict(config="huge"), "config 'huge' unknown"),
    ],
)
def test_bad_inputs_raise(gen, change, match):
    a, weight, bias, x, norm_w, cross = _inputs(gen, 40, 32, 96, b=None)
    args = dict(a=a, weight=weight, bias=bias, x=x, norm_w=norm_w, counters=torch.zeros(16, dtype=torch.int32), cross=cross, config="fp32")
    args.update(change)
    with pytest.raises(ValueError, match=match):
        linear_add_rmsnorm_triton(
            args["a"], args["weight"], args["bias"], args["x"], args["norm_w"], 1e-6, args["counters"], args["cross"], config=args["config"]
        )


_AOT = """
import sys
from sm90_build import build
from sglang_lilicorr.kernels import linear_norm as ln, tuning

bf, f32, i32, c = "*bf16", "*fp32", "i32", "constexpr"
count = 0
for name, cfg in tuning.NORM_CONFIGS.items():
    t = f32 if name == "fp32" else bf
    n_tiles = -(-1024 // cfg.block_n)  # the paper width: rows split over column tiles (one tile at 256 wide)
    for cross in (False, True, None):
        for width, tiles in ((1024, n_tiles), (256, -(-256 // cfg.block_n))):
            nodes = cross is None  # the node-assembly epilogue in the third slot of the loop
            consts = dict(HAS_BIAS=nodes is not True, CROSS=bool(cross), NODES=nodes, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                          BLOCK_K=cfg.block_k, N_TILES=tiles, EVEN_K=True, IEEE_F32=name == "fp32")
            part = f32 if tiles > 1 else "*i32"  # whole rows: the counters stand in for the unused partial sums
            types = [t] * 7 + [part, "*i32", "*i64", t, t, f32] + [i32] * 9 + ["fp32"] + [c] * 9
            r = build(ln._linear_add_rmsnorm_kernel, types, consts, aligned=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15, 16, 17, 18),
                      num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            count += 1
            print(name, {False: "", True: "cross", None: "nodes"}[cross], "N_TILES", tiles, "registers", r["registers"], "spill bytes", r["spills"], "smem", r["shared"])
            if r["spills"]:
                sys.exit(f"{name} spills {r['spills']} bytes")
            if r["shared"] > 227 * 1024:
                sys.exit(f"{name} needs {r['shared']} bytes of shared memory")
            if tiles > 1 and "atom.global" not in r["ptx"] and "atom." not in r["ptx"]:
                sys.exit(f"{name}: no atomic in the split-row kernel")
print("compiled", count)
"""


def test_kernel_compiles_for_sm90_without_spills(sm90_triton):
    """Every config, residual (with and without cross) and node epilogues, at widths 1024 and 256,
    lowered to sm_90 in a fresh process: no spills, fits shared memory, the split-row kernels count
    with an atomic."""
    assert f"compiled {len(NORM_CONFIGS) * 6}" in check_in_fresh_process(_AOT, sm90_triton)


# --- GPU: bf16 at the served shapes, graph replay, counters across replays, bench table ------------


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("k, n", [(1024, 1024), (2048, 1024), (256, 256), (512, 256)])
@pytest.mark.parametrize("m", [120, 1920, 3840])
@pytest.mark.parametrize("cross", [False, True])
def test_gpu_served_shapes_bf16_and_graph_replay(k, n, m, cross):
    """Every 16-bit config within 3e-2 of the bf16 PyTorch definition (and of the unfused path);
    a graph replayed three times equals three eager launches (the counters reset every time)."""
    gen = torch.Generator().manual_seed(m + n + k)
    a, weight, bias, x, norm_w, t = _inputs(gen, m, k, n, torch.bfloat16, "cuda", b=m // 120 if cross else None)
    counters = torch.zeros(max(row_tiles(m, n, torch.bfloat16, c) for c in NORM_CONFIGS), dtype=torch.int32, device="cuda")
    for name in (c for c in NORM_CONFIGS if c != "fp32"):
        xs, x_ref = x.clone(), x.clone()
        out = linear_add_rmsnorm_triton(a, weight, bias, xs, norm_w, 1e-6, counters, t, config=name)
        ref = linear_add_rmsnorm_reference(a, weight, bias, x_ref, norm_w, 1e-6, t)
        torch.testing.assert_close(out, ref, atol=3e-2, rtol=3e-2, msg=lambda s: f"{name}: {s}")
        torch.testing.assert_close(xs, x_ref, atol=3e-2, rtol=3e-2)
        assert not counters.any()
        x_eager, x_graph = x.clone(), x.clone()
        eager = [linear_add_rmsnorm_triton(a, weight, bias, x_eager, norm_w, 1e-6, counters, t, config=name) for _ in range(3)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = linear_add_rmsnorm_triton(a, weight, bias, x_graph, norm_w, 1e-6, counters, t, config=name)
        x_graph.copy_(x)
        for i in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(captured, eager[i]), f"{name}: replay {i} differs from eager launch {i}"
        assert torch.equal(x_graph, x_eager) and not counters.any()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("h", [1024, 256])
@pytest.mark.parametrize("b", [1, 16, 32])
def test_gpu_nodes_bf16_and_graph_replay(h, b):
    """The node epilogue at the served shapes (15 slots x 8 candidates), every 16-bit config: within
    3e-2 of the PyTorch definition; a graph replay equals the eager launch."""
    gen = torch.Generator().manual_seed(b + h)
    args = _node_inputs(gen, b, 15, 8, h, vocab=4096, dtype=torch.bfloat16, device="cuda")
    args = args[:5] + (args[5].float(),) + args[6:]
    counters = torch.zeros(-(-b * 120 // 16), dtype=torch.int32, device="cuda")  # the smallest row tile is 16
    r_x, r_xn = lattice_nodes_linear_reference(*args, 1e-6)
    for name in (c for c in NORM_CONFIGS if c != "fp32"):
        x, xn = lattice_nodes_linear_triton(*args, 1e-6, counters, config=name)
        torch.testing.assert_close(x, r_x, atol=3e-2, rtol=3e-2, msg=lambda s: f"{name}: {s}")
        torch.testing.assert_close(xn, r_xn, atol=3e-2, rtol=3e-2, msg=lambda s: f"{name}: {s}")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_x, g_xn = lattice_nodes_linear_triton(*args, 1e-6, counters, config=name)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(g_x, x) and torch.equal(g_xn, xn) and not counters.any()
