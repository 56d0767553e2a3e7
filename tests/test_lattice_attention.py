"""The lattice self-attention kernel (kernels/lattice_attention.py) equals SDPA on LatticeAttention's
q, k, v views of the packed QKV GEMM output, with the select's padded-row bias view.

CPU: small shapes under Triton's interpreter (tests/conftest.py selects it before anything imports
triton), fp32 to ~1e-4; plus an sm_90 compile of the paper-shape kernel (ptxas, no GPU needed).
GPU (`-m gpu`): the paper shape in bf16 against cuDNN/flash SDPA, and CUDA-graph replay.
Inputs come from the session's seed (LILICORR_TEST_SEED, tests/conftest.py).
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from sglang_lilicorr.kernels import lattice_attention_triton
from sglang_lilicorr.kernels.lattice_attention import lattice_attention_reference
from sglang_lilicorr.lattice import LatticeAttention, lattice_attention_bias

from sm90_build import check_in_fresh_process
from triton_mode import CUDA, INTERPRETER, graph_replay, needs_interpreter


def _padded_bias(heads: int, length: int, gen=None, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Random finite bias as the select stores it: a [1, heads, L, L] view of rows padded to 16."""
    pad = -(-length // 16) * 16
    full = torch.randn(1, heads, length, pad, generator=gen).to(device, dtype)
    return full[..., :length]


def _sdpa(qkv: torch.Tensor, bias: torch.Tensor, heads: int, scale=None) -> torch.Tensor:
    """LatticeAttention's SDPA on the packed layout -> [b*L, H]."""
    length, width = bias.shape[-1], qkv.shape[1] // 3
    b = qkv.shape[0] // length
    q, k, v = qkv.view(b, length, 3, heads, width // heads).unbind(2)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias.to(qkv.dtype), scale=scale
    )
    return o.transpose(1, 2).reshape(b * length, width)


@needs_interpreter
@pytest.mark.parametrize(
    "b, heads, dh, length, padded, block_m",
    [
        (1, 2, 16, 12, True, 64),
        (3, 2, 16, 12, True, 64),
        (3, 2, 16, 12, False, 64),  # contiguous [heads, L, L] bias
        (2, 2, 8, 12, True, 64),  # dh < 16: padded to tl.dot's 16 with masked loads
        (2, 2, 16, 40, True, 16),  # three query blocks, the last partial
        (1, 1, 16, 120, True, 64),  # the paper's L = S*K = 15*8 (LP = 128)
        (1, 1, 64, 120, True, 64),  # the shipped SmolLM2 head: 4 heads of 64
    ],
)
def test_matches_sdpa(gen, b, heads, dh, length, padded, block_m):
    width = heads * dh
    qkv = torch.randn(b * length, 3 * width, generator=gen)
    bias = _padded_bias(heads, length, gen) if padded else torch.randn(heads, length, length, generator=gen)
    out = lattice_attention_triton(qkv, bias, heads, block_m=block_m)
    expected = _sdpa(qkv, bias, heads)
    assert out.shape == (b * length, width) and out.dtype == qkv.dtype and out.is_contiguous()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lattice_attention_reference(qkv, bias, heads), expected, atol=1e-6, rtol=1e-6)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_sdpa(gen, dtype):
    """16-bit inputs: P rounded to the input dtype as SDPA does; output within half-precision error."""
    b, heads, dh, length = 2, 2, 16, 20
    qkv = torch.randn(b * length, 3 * heads * dh, generator=gen).to(dtype)
    bias = _padded_bias(heads, length, gen, dtype=dtype)
    out = lattice_attention_triton(qkv, bias, heads)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), _sdpa(qkv.float(), bias.float(), heads), atol=2e-2, rtol=2e-2)


@needs_interpreter
def test_scale_and_strided_qkv(gen):
    """An explicit scale, and qkv as a column slice of a wider buffer (row stride > 3H)."""
    heads, dh, length, b = 2, 16, 12, 2
    wide = torch.randn(b * length, 3 * heads * dh + 16, generator=gen)
    qkv = wide[:, : 3 * heads * dh]
    bias = _padded_bias(heads, length, gen)
    out = lattice_attention_triton(qkv, bias, heads, scale=0.5)
    torch.testing.assert_close(out, _sdpa(qkv, bias, heads, scale=0.5), atol=1e-4, rtol=1e-4)


@needs_interpreter
def test_wiring_equals_lattice_attention(gen):
    """in_proj GEMM -> kernel -> out_proj equals LatticeAttention.forward on the lattice bias."""
    slots, topk, heads, width, b = 3, 4, 2, 32, 3
    length = slots * topk
    torch.manual_seed(gen.initial_seed())
    attn = LatticeAttention(width, heads)
    with torch.no_grad():
        attn.in_proj_bias.normal_()
        rel, same = torch.randn(heads, 2 * (slots + 1) - 1, generator=gen), torch.randn(heads, generator=gen)
        bias = torch.zeros(1, heads, length, 16)
        bias[..., :length] = lattice_attention_bias(rel, same, slots, topk)
        bias = bias[..., :length]
        x = torch.randn(b, length, width, generator=gen)
        qkv = F.linear(x.view(b * length, width), attn.in_proj_weight, attn.in_proj_bias)
        got = attn.out_proj(lattice_attention_triton(qkv, bias, attn.num_heads)).view(b, length, width)
        torch.testing.assert_close(got, attn(x, bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "qkv_shape, heads, bias_shape, match",
    [
        ((24, 50), 2, (2, 12, 12), "width a multiple of 3"),
        ((24, 90), 4, (4, 12, 12), "not divisible by heads"),
        ((24, 96), 2, (3, 12, 12), r"\[heads=2, L, L\]"),
        ((24, 96), 2, (2, 12, 11), r"\[heads=2, L, L\]"),
        ((24, 96), 2, (2, 1, 12, 12), r"\[heads=2, L, L\]"),
        ((24, 96), 2, (2, 10, 10), "not a multiple of the bias's L = 10"),
        ((300, 96), 2, (2, 300, 300), "at most 256 nodes"),
    ],
)
def test_bad_shapes_raise(qkv_shape, heads, bias_shape, match):
    with pytest.raises(ValueError, match=match):
        lattice_attention_triton(torch.zeros(qkv_shape), torch.zeros(bias_shape), heads)


def test_bad_layouts_raise():
    qkv, bias = torch.zeros(24, 96), torch.zeros(2, 12, 12)
    with pytest.raises(ValueError, match="unit column stride"):
        lattice_attention_triton(qkv, bias.transpose(1, 2), 2)
    with pytest.raises(ValueError, match="unit column stride"):
        lattice_attention_triton(torch.zeros(96, 24).t(), bias, 2)
    with pytest.raises(ValueError, match="dtype torch.int32 unsupported"):
        lattice_attention_triton(qkv.int(), bias, 2)
    with pytest.raises(ValueError, match="power of two"):
        lattice_attention_triton(qkv, bias, 2, block_m=48)


_AOT = """
import sys
from sm90_build import build
from sglang_lilicorr.kernels import lattice_attention as la
from sglang_lilicorr.kernels.tuning import ATTENTION_BLOCK_M

types = ["*bf16", "i32", "*bf16", "i32", "i32", "*bf16", "i32", "i32", "i32", "fp32"] + ["constexpr"] * 6
for block_m, warps, dp in [(ATTENTION_BLOCK_M, la.NUM_WARPS, 128), (128, 8, 128), (ATTENTION_BLOCK_M, la.NUM_WARPS, 64),
                          (16, 4, 128), (16, 4, 64)]:
    consts = dict(LP=128, DP=dp, BLOCK_M=block_m, IEEE=False, F32_DOT=False, PDL=True)
    r = build(la._lattice_attention_kernel, types, consts,
              aligned=(0, 1, 2, 4, 5, 7, 8), num_warps=warps)  # pointers, strides, H, dh
    print(block_m, warps, dp, "registers", r["registers"], "spill bytes", r["spills"], "smem", r["shared"])
    if r["spills"]:
        sys.exit(f"BLOCK_M={block_m} num_warps={warps} spills {r['spills']} bytes")
    if block_m >= 64 and "wgmma.mma_async" not in r["ptx"]:  # (16-row blocks: mma.sync, below wgmma's 64 rows)
        sys.exit(f"BLOCK_M={block_m} num_warps={warps} does not use wgmma")
    if "griddepcontrol.wait" not in r["ptx"]:
        sys.exit("PDL=True does not wait on the previous grid")
    if "ld.global" not in r["ptx"][: r["ptx"].index("griddepcontrol.wait")]:
        sys.exit("the lattice bias (a constant) is not loaded before the wait")
print("compiled 3")
"""


def test_kernel_compiles_for_sm90_without_spills(sm90_triton):
    """The paper shape (L = 120 -> LP = 128, dh = 128, bf16) lowered to sm_90 in a fresh process:
    the default launch (BLOCK_M = 64, 4 warps) and the alternative (128, 8 warps) use wgmma and do
    not spill, and load the lattice bias before the PDL wait; so does the shipped SmolLM2 head's dh = 64."""
    assert "compiled 3" in check_in_fresh_process(_AOT, sm90_triton)


# --- GPU: paper shape in bf16, graph replay ---------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("launch", [{}, {"block_m": 128, "num_warps": 8}, {"block_m": 16}])
@pytest.mark.parametrize("b", [1, 4, 32])
def test_gpu_paper_shape_bf16_matches_sdpa_and_graph_replay(b, launch):
    """Default launch, the (128, 8 warps) alternative and 16-row blocks, against bf16 SDPA and fp32 SDPA;
    a CUDA-graph replay writes exactly the eager result."""
    heads, dh, length = 8, 128, 15 * 8
    g = torch.Generator(device="cuda").manual_seed(b)
    qkv = torch.randn(b * length, 3 * heads * dh, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = _padded_bias(heads, length, device="cuda", dtype=torch.bfloat16)
    eager = lattice_attention_triton(qkv, bias, heads, **launch)
    torch.testing.assert_close(eager, _sdpa(qkv, bias, heads), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(eager.float(), _sdpa(qkv.float(), bias.float(), heads), atol=2e-2, rtol=2e-2)

    assert torch.equal(graph_replay(lambda: lattice_attention_triton(qkv, bias, heads, **launch)), eager)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
def test_gpu_fp32_matches_sdpa_without_tf32(monkeypatch):
    """fp32 (IEEE FMAs in the kernel, TF32 off in the reference) agrees to ~1e-4: the fp32 path of
    FastLiLiCorrSelect stays exact once the kernel is wired in."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    heads, dh, length, b = 8, 128, 120, 4
    qkv = torch.randn(b * length, 3 * heads * dh, device="cuda")
    bias = _padded_bias(heads, length, device="cuda")
    torch.testing.assert_close(
        lattice_attention_triton(qkv, bias, heads), _sdpa(qkv, bias, heads), atol=1e-4, rtol=1e-4
    )
