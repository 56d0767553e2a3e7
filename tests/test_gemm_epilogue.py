"""The GEMM with its epilogue (kernels/gemm_epilogue.py) equals its PyTorch definition: as the FFN up projection
with bias + SiLU (linear_silu_triton) F.silu(F.linear(x, W_up, b_up)), SiluMLP's first half; in general
(gemm_epilogue_triton: plain, with a per-request bias and SiLU as in the factor projection, the folded norms, the
residual add) gemm_epilogue_reference.

CPU: small shapes with masked edges under Triton's interpreter (tests/conftest.py selects it before
anything imports triton), fp32 to 1e-4, every launch config forced once; plus an sm_90 compile of
every config (ptxas, no GPU needed). GPU (`-m gpu`): the paper shapes in bf16, CUDA-graph replay (timings:
`python -m benchmarks kernel-sweeps linear-silu` on the GPU).
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from sglang_lilicorr.kernels import linear_silu_triton
from sglang_lilicorr.kernels.gemm_epilogue import (
    fold_norm_gain,
    gemm_epilogue_reference,
    gemm_epilogue_triton,
    select_config,
)
from sglang_lilicorr.kernels.tuning import GEMM_CONFIG_BY_ROWS, GEMM_CONFIGS, GemmLaunch, gemm_band
from sglang_lilicorr.lattice import SiluMLP

from sm90_build import check_in_fresh_process
from triton_mode import CUDA, INTERPRETER, graph_replay, needs_interpreter


@needs_interpreter
@pytest.mark.parametrize(
    "m, k, n, config",
    [
        (7, 48, 40, "skinny"),  # K not a multiple of BLOCK_K, partial row and column tiles
        (130, 64, 96, "small"),  # three row tiles, the last of 2 rows
        (130, 48, 96, "medium"),
        (130, 48, 96, "large"),
        (7, 64, 40, "fp32"),
        (130, 64, 96, None),  # select_config: fp32 inputs take the fp32 config
    ],
)
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_pytorch(gen, m, k, n, config, with_bias):
    x, weight = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) / k**0.5
    bias = torch.randn(n, generator=gen) if with_bias else None
    out = linear_silu_triton(x, weight, bias, config=config)
    assert out.shape == (m, n) and out.dtype == x.dtype and out.is_contiguous()
    torch.testing.assert_close(out, F.silu(F.linear(x, weight, bias)), atol=1e-4, rtol=1e-4)


@needs_interpreter
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("config", ["skinny", GemmLaunch(16, 16, 16, 8, 1, 4)])
def test_gemm_with_group_bias_matches_reference(gen, silu, config):
    """act(x @ W.T + b + group_bias[row // rows_per_group]): 3 groups of 10 rows (tiles straddle
    groups), the group bias a column slice of a wider buffer (as anchor[:, d:] in the head)."""
    x, weight = torch.randn(30, 48, generator=gen), torch.randn(40, 48, generator=gen) / 7
    bias, group_bias = torch.randn(40, generator=gen), torch.randn(3, 56, generator=gen)[:, 16:]
    out = gemm_epilogue_triton(x, weight, bias, silu=silu, group_bias=group_bias, rows_per_group=10, config=config)
    ref = gemm_epilogue_reference(x, weight, bias, silu=silu, group_bias=group_bias, rows_per_group=10)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        gemm_epilogue_triton(x, weight, config=config), F.linear(x, weight), atol=1e-4, rtol=1e-4
    )


def _sumsq(x: torch.Tensor) -> torch.Tensor:
    """The partial sums of squares a producer GEMM writes (sumsq_out): one per 16 columns."""
    xf = F.pad(x.float(), (0, -x.shape[1] % 16))
    return xf.pow(2).view(x.shape[0], -1, 16).sum(-1)


@needs_interpreter
@pytest.mark.parametrize("config", ["skinny", GemmLaunch(16, 16, 16, 8, 1, 4)])
@pytest.mark.parametrize("k", [48, 40])  # BLOCK_K divides K / masked last K step; 40: a partial group of 16
def test_folded_norm_matches_rmsnorm_then_linear(gen, config, k):
    """norm (rstd from the rows' partial sums of squares) with the gain folded into the weight
    (fold_norm_gain) equals the RMSNorm then the GEMM; with norm_width, the factor GEMM over
    concat[x, x * t] equals the one over concat[h, h * t] (3 requests of 10 rows)."""
    x, g, t = (
        torch.randn(30, k, generator=gen),
        1 + 0.1 * torch.randn(k, generator=gen),
        torch.randn(3, k, generator=gen),
    )
    weight, bias = torch.randn(24, 2 * k, generator=gen) / k**0.5, torch.randn(24, generator=gen)
    h = F.rms_norm(x, (k,), g, 1e-5)
    plain = gemm_epilogue_triton(
        x, fold_norm_gain(weight[:, :k].contiguous(), g), bias, norm=(_sumsq(x), 1e-5), config=config
    )
    torch.testing.assert_close(plain, F.linear(h, weight[:, :k], bias), atol=1e-4, rtol=1e-4)
    group_bias = torch.randn(3, 24, generator=gen)
    cat = torch.cat([x, x * t.repeat_interleave(10, 0)], dim=1)
    crossed = gemm_epilogue_triton(
        cat,
        fold_norm_gain(weight, g),
        silu=True,
        group_bias=group_bias,
        rows_per_group=10,
        norm=(_sumsq(x), 1e-5),
        norm_width=k,
        config=config,
    )
    ref = F.silu(
        F.linear(torch.cat([h, h * t.repeat_interleave(10, 0)], dim=1), weight) + group_bias.repeat_interleave(10, 0)
    )
    torch.testing.assert_close(crossed, ref, atol=1e-4, rtol=1e-4)
    by_definition = gemm_epilogue_reference(
        cat, fold_norm_gain(weight, g), silu=True, group_bias=group_bias, rows_per_group=10, norm_eps=1e-5, norm_width=k
    )
    torch.testing.assert_close(crossed, by_definition, atol=1e-4, rtol=1e-4)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", ["skinny", GemmLaunch(16, 16, 16, 8, 1, 4)])
def test_residual_and_extra_outputs_match_reference(gen, dtype, config):
    """residual: x += a @ W.T + b in place (x a view with row stride 2N: the first half of [x, x * t]),
    rounded like F.linear then the add, with the sums of squares of the new rows (sumsq_out) and
    x * t per request (cross, 2 requests of 12 rows) beside it."""
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    a, weight, bias = (
        torch.randn(24, 40, generator=gen).to(dtype),
        (torch.randn(40, 40, generator=gen) / 7).to(dtype),
        torch.randn(40, generator=gen).to(dtype),
    )
    cat, t = torch.randn(24, 80, generator=gen).to(dtype), torch.randn(2, 40, generator=gen).to(dtype)
    x = cat[:, :40]
    expect = gemm_epilogue_reference(a, weight, bias, residual=x.clone(), cross=t)[0]
    sumsq = torch.empty(24, 3)
    out = gemm_epilogue_triton(a, weight, bias, residual=x, sumsq_out=sumsq, cross=(t, cat[:, 40:]), config=config)
    assert out.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, expect, **tol)
    xt = (x.float() * t.float().repeat_interleave(12, 0)).to(dtype)  # of the rows it stored, rounded once
    torch.testing.assert_close(cat[:, 40:], xt, atol=1e-6, rtol=1e-6 if dtype == torch.float32 else 2**-7)  # (1 ulp)
    torch.testing.assert_close(sumsq, _sumsq(x), atol=1e-4, rtol=1e-5)  # of the rounded rows it stored
    plain = gemm_epilogue_triton(a, weight, bias, out=torch.empty(24, 80, dtype=dtype)[:, 40:], config=config)
    torch.testing.assert_close(plain, gemm_epilogue_reference(a, weight, bias), **tol)


def test_bad_epilogue_operands_raise():
    dev = "cuda" if CUDA else "cpu"
    x, weight = torch.zeros(30, 16, device=dev), torch.zeros(8, 16, device=dev)
    with pytest.raises(ValueError, match=r"norm's sum-of-squares partials is \(30, 2\) .* must be \[30, 1\]"):
        gemm_epilogue_triton(x, weight, norm=(torch.zeros(30, 2, device=dev), 1e-5))
    with pytest.raises(ValueError, match=r"norm_width 20 must be in 1..16"):
        gemm_epilogue_triton(x, weight, norm=(torch.zeros(30, 2, device=dev), 1e-5), norm_width=20)
    with pytest.raises(ValueError, match=r"residual is \(30, 7\)"):
        gemm_epilogue_triton(x, weight, residual=torch.zeros(30, 7, device=dev))
    with pytest.raises(ValueError, match=r"sumsq_out is \(30, 1\) torch.float16"):
        gemm_epilogue_triton(x, weight, sumsq_out=torch.zeros(30, 1, device=dev, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"cross t \(7, 8\) must be \[b, 8\]"):
        gemm_epilogue_triton(x, weight, cross=(torch.zeros(7, 8, device=dev), torch.zeros(30, 8, device=dev)))
    with pytest.raises(ValueError, match="share the output's row stride"):
        gemm_epilogue_triton(x, weight, cross=(torch.zeros(3, 8, device=dev), torch.zeros(30, 16, device=dev)[:, :8]))
    with pytest.raises(ValueError, match="residual is the output; pass it without out"):
        gemm_epilogue_triton(x, weight, residual=torch.zeros(30, 8, device=dev), out=torch.zeros(30, 8, device=dev))
    with pytest.raises(ValueError, match=r"\(TMA\) has no norm"):
        gemm_epilogue_triton(x, weight, sumsq_out=torch.zeros(30, 1, device=dev), config="tma_large")


def test_bad_group_bias_raises():
    dev = "cuda" if CUDA else "cpu"
    x, weight = torch.zeros(30, 16, device=dev), torch.zeros(8, 16, device=dev)
    for group_bias, rows in (
        (torch.zeros(3, 8, device=dev), 7),
        (torch.zeros(2, 8, device=dev), 10),
        (torch.zeros(8, 3, device=dev).t(), 10),
    ):
        with pytest.raises(ValueError, match=r"group_bias .* must be \[M / rows_per_group, N\]"):
            gemm_epilogue_triton(x, weight, group_bias=group_bias, rows_per_group=rows)
    with pytest.raises(ValueError, match="group_bias is torch.float64"):
        gemm_epilogue_triton(
            x, weight, group_bias=torch.zeros(3, 8, device=dev, dtype=torch.float64), rows_per_group=10
        )


@needs_interpreter
def test_strided_rows_and_grouped_order(gen):
    """x and weight as column slices of wider buffers (row stride > K); 19 x 4 tiles of 16 x 16
    in groups of GROUP_M = 8 row tiles (the last group 3): every tile is written."""
    x = torch.randn(300, 80, generator=gen)[:, :64]
    weight = torch.randn(50, 72, generator=gen)[:, :64]
    bias = torch.randn(50, generator=gen)
    out = linear_silu_triton(x, weight, bias, config=GemmLaunch(16, 16, 16, 8, 1, 4))
    torch.testing.assert_close(out, F.silu(F.linear(x, weight, bias)), atol=1e-4, rtol=1e-4)


@needs_interpreter
def test_bf16_and_wiring_equals_silu_mlp(gen):
    """16-bit inputs within bf16 rounding; down_proj(kernel) equals SiluMLP.forward."""
    x, weight = torch.randn(20, 32, generator=gen).bfloat16(), (torch.randn(24, 32, generator=gen) / 6).bfloat16()
    out = linear_silu_triton(x, weight)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.silu(F.linear(x.float(), weight.float())), atol=2e-2, rtol=2e-2)

    torch.manual_seed(gen.initial_seed())
    mlp = SiluMLP(32, 48, 32)
    xf = torch.randn(20, 32, generator=gen)
    with torch.no_grad():
        got = mlp.down_proj(linear_silu_triton(xf, mlp.up_proj.weight, mlp.up_proj.bias))
        torch.testing.assert_close(got, mlp(xf), atol=1e-4, rtol=1e-4)


def test_config_table():
    """Every row band names a known 16-bit config; the paper shapes pick skinny / small / large."""
    assert all(name in GEMM_CONFIGS and name != "fp32" for _, name, _ in GEMM_CONFIG_BY_ROWS)
    assert GEMM_CONFIG_BY_ROWS[-1][0] is None  # the last band is unbounded
    assert [select_config(m, torch.bfloat16) for m in (120, 480, 960, 1920, 3840)] == [
        "skinny",
        "small",
        "tma_medium",
        "tma_large",
        "tma_large",
    ]
    assert select_config(3840, torch.float32) == "fp32"
    assert (
        select_config(120, torch.bfloat16, 2048) == "skinny_wide_k"
        and select_config(120, torch.bfloat16, 1024) == "skinny"
    )
    assert select_config(480, torch.bfloat16, 4096) == "small" and select_config(120, torch.float32, 2048) == "fp32"
    assert all(isinstance(gemm_band(m)[2], bool) for m in (1, 120, 480, 1920, 3840, 10**6))


def test_empty_rows():
    dev = "cuda" if CUDA else "cpu"
    out = linear_silu_triton(torch.zeros(0, 16, device=dev), torch.zeros(8, 16, device=dev), torch.zeros(8, device=dev))
    assert out.shape == (0, 8)


@pytest.mark.parametrize(
    "x, weight, bias, match",
    [
        (torch.zeros(2, 3, 16), torch.zeros(8, 16), None, r"\[M, K\] and \[N, K\]"),
        (torch.zeros(4, 16), torch.zeros(8, 12), None, "same K"),
        (torch.zeros(4, 16), torch.zeros(8, 16), torch.zeros(7), r"must be \[N\] = \[8\]"),
        (torch.zeros(4, 16), torch.zeros(8, 16), torch.zeros(8, 1), r"must be \[N\] = \[8\]"),
        (
            torch.zeros(4, 16, dtype=torch.int32),
            torch.zeros(8, 16, dtype=torch.int32),
            None,
            "dtype torch.int32 unsupported",
        ),
        (torch.zeros(4, 16), torch.zeros(8, 16, dtype=torch.bfloat16), None, "cast the parameters"),
        (torch.zeros(4, 16), torch.zeros(8, 16), torch.zeros(8, dtype=torch.float16), "cast the parameters"),
        (torch.zeros(16, 4).t(), torch.zeros(8, 16), None, "unit stride along K"),
        (torch.zeros(4, 16), torch.zeros(16, 8).t(), None, "unit stride along K"),
        (torch.zeros(4, 16), torch.zeros(8, 16), torch.zeros(16)[::2], "unit stride along K"),
    ],
)
def test_bad_inputs_raise(x, weight, bias, match):
    with pytest.raises(ValueError, match=match):
        linear_silu_triton(x, weight, bias)


def test_unknown_config_raises():
    with pytest.raises(ValueError, match="config 'huge' unknown"):
        dev = "cuda" if CUDA else "cpu"
        linear_silu_triton(torch.zeros(4, 16, device=dev), torch.zeros(8, 16, device=dev), config="huge")


def test_prefetch_needs_an_early_launch():
    """The weight prefetch runs while the previous kernel does: prefetch=True without a PDL launch is refused."""
    x, w = torch.zeros(4, 16), torch.zeros(8, 16)
    with pytest.raises(ValueError, match=r"prefetch=True .* needs a launch with PDL \(pdl=True"):
        gemm_epilogue_triton(x, w, prefetch=True)


@needs_interpreter
def test_tma_config_off_gpu_raises():
    with pytest.raises(ValueError, match="TMA configs need 16-bit CUDA tensors"):
        linear_silu_triton(torch.zeros(4, 16), torch.zeros(8, 16), config="tma_large")


_AOT = """
import sys
from sm90_build import build
import torch
from sglang_lilicorr.kernels import gemm_epilogue as ge, tuning
from sglang_lilicorr.kernels.prefetch import lines_per_row
from sglang_lilicorr.fast_path.plan import Device, HeadGeometry, plans_for


def served_configs(runs):  # the configs by M (and their wide-K twins) at the lattice rows where a served plan of the
    # paper or the testbed head (on an sm_90 card) satisfies runs(plan)
    geos = [HeadGeometry(width, width, 15, 8, torch.bfloat16) for width in (1024, 256)]
    rows = [bound * geo.lattice_rows for geo in geos
            for bound, plan in plans_for(geo, Device(True, True, True)).buckets() if bound and runs(plan)]
    names = {tuning.gemm_band(m)[1] for m in range(1, max(rows) + 1)}
    return names | {tuning.GEMM_WIDE_K_CONFIG[c] for c in names if c in tuning.GEMM_WIDE_K_CONFIG}


small_m = served_configs(lambda plan: plan.route == "folded")  # where the factor GEMM runs in Triton

for name, c in tuning.GEMM_CONFIGS.items():
    t = "*fp32" if name == "fp32" else "*bf16"
    # under PDL, with the factor projection's epilogue (bias, per-request bias, SiLU: the most a kernel
    # carries) on the configs of the rows it runs at (small_m), the FFN up's elsewhere
    tiles = dict(HAS_BIAS=True, GROUP_BIAS=name in small_m, SILU=True, PDL=True, **c.tiles())
    if c.tma:
        # descriptors of the x, weight and output tiles, then bias, group bias, M, N, K, its stride, rows per group
        descs = [f"tensordesc<bf16[{a}, {b}]>"
                 for a, b in ((c.block_m, c.block_k), (c.block_n, c.block_k), (c.block_m, c.block_n))]
        r = build(ge._gemm_tma_kernel, descs + [t, t] + ["i32"] * 5 + ["constexpr"] * 8, tiles,
                  aligned=(3, 4, 6, 7, 8), num_warps=c.num_warps, num_stages=c.num_stages)
        if "cp.async.bulk.tensor" not in r["ptx"]:
            sys.exit(f"{name} does not load by TMA")
    else:  # pointers (x, w, b, group bias, out, sums of squares in / out, t, x * t), then N, K and the strides aligned
        types = [t] * 5 + ["*fp32"] * 2 + [t] * 2 + ["i32"] * 11 + ["fp32"] + ["constexpr"] * 17
        aligned = tuple(range(9)) + (10, 11, 12, 13, 14)
        plain = dict(NORM=False, PARTS_IN=1, RESIDUAL=False, SUMSQ_OUT=False, CROSS_OUT=False)
        r = build(ge._gemm_kernel, types,
                  dict(EVEN_K=True, IEEE_F32=name == "fp32", PREFETCH_LINES=0, **plain, **tiles),
                  aligned=aligned, num_warps=c.num_warps, num_stages=c.num_stages)
        if "prefetch.global.L2" in r["ptx"]:
            sys.exit(f"{name} with PREFETCH_LINES=0 prefetches")
        if name in small_m:  # the folded route's lattice GEMMs at the rows they run at,
            lines = lines_per_row(c.block_n, c.num_warps)  # launched early: the weight prefetched before the wait
            for extra in (dict(plain, NORM=True, PARTS_IN=64),  # QKV, FFN up, the factor GEMM
                          dict(plain, RESIDUAL=True, SUMSQ_OUT=True, CROSS_OUT=True)):
                f = build(ge._gemm_kernel, types,
                          dict(EVEN_K=True, IEEE_F32=False, PREFETCH_LINES=lines, **extra, **tiles),
                          aligned=aligned, num_warps=c.num_warps, num_stages=c.num_stages)
                print(name, extra, "registers", f["registers"], "spill bytes", f["spills"])
                if f["spills"] or "griddepcontrol.wait" not in f["ptx"]:
                    sys.exit(f"{name} {extra} spills {f['spills']} bytes or does not wait on the previous grid")
                ptx = f["ptx"]
                if ("prefetch.global.L2::evict_last" not in ptx
                        or ptx.index("prefetch.global.L2") > ptx.index("griddepcontrol.wait")):
                    sys.exit(f"{name} {extra}: no L2 prefetch of the weight before the wait on the previous grid")
                # the K loop; in a small tile every epilogue operand loads before it
                loop = ptx.index("wgmma.mma_async")
                early = c.block_m * c.block_n <= tuning.EARLY_OPERANDS_MAX_TILE
                if early and "ld.global" in ptx[loop:]:
                    sys.exit(f"{name} {extra}: {ptx[loop:].count('ld.global')} epilogue loads after the K loop")
                if early and "ld.global" not in ptx[:ptx.index("griddepcontrol.wait")]:
                    sys.exit(f"{name} {extra}: the bias not loaded before the wait")
    if "griddepcontrol.wait" not in r["ptx"]:
        sys.exit(f"{name} with PDL=True does not wait on the previous grid")
    print(name, c, "registers", r["registers"], "spill bytes", r["spills"], "smem", r["shared"])
    if r["spills"]:
        sys.exit(f"{name} spills {r['spills']} bytes")
    if r["shared"] > 227 * 1024:
        sys.exit(f"{name} needs {r['shared']} bytes of shared memory (sm_90 has 227 KiB per block)")
    if name != "fp32" and "wgmma.mma_async" not in r["ptx"]:
        sys.exit(f"{name} does not use wgmma")
print("compiled", len(tuning.GEMM_CONFIGS))
"""


def test_kernel_compiles_for_sm90_without_spills(sm90_triton):
    """Every launch config lowered to sm_90 (bf16, fp32 for the fp32 config) in a fresh process:
    no register spills, fits shared memory, 16-bit configs use wgmma, TMA configs load by TMA."""
    assert f"compiled {len(GEMM_CONFIGS)}" in check_in_fresh_process(_AOT, sm90_triton)


# --- GPU: paper shapes in bf16, graph replay ------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [120, 480, 1920, 3840])
def test_gpu_paper_shapes_bf16_and_graph_replay(m):
    """x [M, 1024], W_up [2048, 1024] bf16 with bias: within 2e-2 of the PyTorch path and of fp32;
    a CUDA-graph replay writes exactly the eager result."""
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = (torch.randn(2048, 1024, device="cuda", generator=g) / 32).bfloat16()
    bias = torch.randn(2048, device="cuda", dtype=torch.bfloat16, generator=g)
    eager = linear_silu_triton(x, weight, bias)
    torch.testing.assert_close(eager, F.silu(F.linear(x, weight, bias)), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(
        eager.float(), F.silu(F.linear(x.float(), weight.float(), bias.float())), atol=2e-2, rtol=2e-2
    )

    assert torch.equal(graph_replay(lambda: linear_silu_triton(x, weight, bias)), eager)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("config", [name for name, c in GEMM_CONFIGS.items() if c.tma])
@pytest.mark.parametrize("m", [130, 3840])
def test_gpu_tma_configs(config, m):
    """The persistent TMA kernel: partial row tiles (M = 130) and the paper's largest M, bf16 with
    bias, within 2e-2 of the PyTorch path; graph replay equals eager."""
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = (torch.randn(2048, 1024, device="cuda", generator=g) / 32).bfloat16()
    bias = torch.randn(2048, device="cuda", dtype=torch.bfloat16, generator=g)
    eager = linear_silu_triton(x, weight, bias, config=config)
    torch.testing.assert_close(eager, F.silu(F.linear(x, weight, bias)), atol=2e-2, rtol=2e-2)
    assert torch.equal(graph_replay(lambda: linear_silu_triton(x, weight, bias, config=config)), eager)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("k, n", [(1024, 3072), (2048, 1024)])
def test_gpu_weight_prefetch_changes_no_value(k, n):
    """A chain of PDL launches at M = 120 (the bs-1 lattice), each prefetching its weight into L2 before
    its wait: bit-equal to the same chain without the prefetch, eager and in graph replay."""
    from sglang_lilicorr.kernels.pdl import pdl_supported

    g = torch.Generator(device="cuda").manual_seed(k + n)
    x = torch.randn(120, k, device="cuda", dtype=torch.bfloat16, generator=g)
    if not pdl_supported(x):
        pytest.skip("PDL (and so the prefetch) needs sm_90+")
    ws = [(torch.randn(n, k, device="cuda", generator=g) / k**0.5).bfloat16() for _ in range(4)]
    w_back = (torch.randn(k, n, device="cuda", generator=g) / n**0.5).bfloat16()

    def chain(prefetch):
        y = x
        for w in ws:
            y = gemm_epilogue_triton(
                gemm_epilogue_triton(y, w, pdl=True, prefetch=prefetch), w_back, pdl=True, prefetch=prefetch
            )
        return y

    plain = chain(False)
    assert torch.equal(chain(None), plain)
    assert torch.equal(graph_replay(lambda: chain(None)), plain)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
def test_gpu_fp32_exact(monkeypatch):
    """fp32 (IEEE FMA dots, TF32 off in the reference) to 1e-4, so the fp32 select path stays exact."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    x, weight, bias = (
        torch.randn(480, 1024, device="cuda"),
        torch.randn(2048, 1024, device="cuda") / 32,
        torch.randn(2048, device="cuda"),
    )
    torch.testing.assert_close(
        linear_silu_triton(x, weight, bias), F.silu(F.linear(x, weight, bias)), atol=1e-4, rtol=1e-4
    )
