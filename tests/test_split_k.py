"""kernels/split_k.py: the split-K GEMM, its parts reduced in the launch by the last to arrive, equals
x @ weight.T, under the CPU interpreter (small shapes, the part plan shrunk so that several parts and a
short last part run) and on the GPU (the paper's pass projection, eager and graph replay, counters left
zero); sm_90 build without spills."""
from __future__ import annotations

import pytest
import torch

from sglang_lilicorr.kernels import split_k
from sglang_lilicorr.kernels.split_k import linear_split_k_reference, linear_split_k_triton, output_tiles, part_plan

from sm90_build import check_in_fresh_process
from triton_mode import CUDA, graph_replay, needs_interpreter


def test_part_plan_covers_k_in_block_multiples():
    assert part_plan(4096) == (8, 512)  # the paper's pass projection: 8 parts of 512
    assert part_plan(576) == (1, 640)  # the testbed's: one part (its K loop masked past 576)
    for k in (1, 100, 513, 1000, 3000, 4096, 9999):
        parts, k_part = part_plan(k)
        assert k_part % split_k.BLOCK_K == 0 and (parts - 1) * k_part < k <= parts * k_part and parts <= split_k.MAX_PARTS


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, k, n", [(15, 300, 140), (5, 256, 64), (70, 96, 8)])
def test_split_k_equals_the_product(seed, monkeypatch, dtype, m, k, n):
    monkeypatch.setattr(split_k, "MIN_K_PER_PART", 64)
    monkeypatch.setattr(split_k, "BLOCK_K", 32)  # 300 -> 4 parts of 96 (the last 12); 256 -> 4 of 64; 96 -> 1
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k + 3, generator=g)[:, :k].to(dtype)  # a strided x (row stride > K)
    weight = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    counters = torch.zeros(output_tiles(m, n) + 1, dtype=torch.int32)
    out = linear_split_k_triton(x, weight, counters)
    assert out.dtype == dtype and out.shape == (m, n) and (part_plan(k)[0] > 1) == (k > 96)
    assert not counters.any()  # every tile's last part reset its counter
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out.float(), linear_split_k_reference(x, weight), **tol)
    assert torch.equal(linear_split_k_triton(x, weight, counters), out)  # the parts summed in order: deterministic


def test_bad_inputs_are_named():
    dev = "cuda" if CUDA else "cpu"
    ok = torch.zeros(16, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match=r"must be \[M, K\] and \[N, K\] with the same K"):
        linear_split_k_triton(torch.zeros(4, 8, device=dev), torch.zeros(3, 9, device=dev), ok)
    with pytest.raises(ValueError, match="cast / move one"):
        linear_split_k_triton(torch.zeros(4, 8, device=dev), torch.zeros(3, 8, device=dev, dtype=torch.float16), ok)
    with pytest.raises(ValueError, match="unit stride along K"):
        linear_split_k_triton(torch.zeros(8, 4, device=dev).t(), torch.zeros(3, 8, device=dev), ok)
    with pytest.raises(ValueError, match=r"counters must be int32 zeros with >= 2 entries"):
        linear_split_k_triton(torch.zeros(4, 8, device=dev), torch.zeros(100, 8, device=dev), ok[:1])


_AOT = """
from sm90_build import build
from sglang_lilicorr.kernels import split_k as sk

for m in (16, 64):  # bs 1 (15 rows) and bs 4 (60) of the paper head
    r = build(sk._linear_split_k_kernel, ["*bf16", "*bf16", "*fp32", "*bf16", "*i32"] + ["i32"] * 6 + ["constexpr"] * 6,
              dict(PARTS=8, BLOCK_M=m, BLOCK_N=sk.BLOCK_N, BLOCK_K=sk.BLOCK_K, EVEN_K=True, IEEE_F32=False),
              aligned=(0, 1, 2, 3, 4, 6, 7, 8, 9, 10), num_warps=4, num_stages=3)
    print("split_k", m, "registers", r["registers"], "spill bytes", r["spills"])
    assert not r["spills"] and ("wgmma.mma_async" in r["ptx"] or "mma.sync" in r["ptx"]), r["ptx"][-500:]
    assert "atom.global.gpu.acq_rel.add" in r["ptx"], "the parts do not count in with an acq_rel atomic at GPU scope"
print("compiled")
"""


def test_kernel_compiles_for_sm90_without_spills(sm90_triton):
    assert check_in_fresh_process(_AOT, sm90_triton).rstrip().endswith("compiled")


@pytest.mark.gpu
def test_gpu_paper_pass_projection_bf16_and_graph_replay():
    g = torch.Generator(device="cuda").manual_seed(0)
    counters = torch.zeros(256, dtype=torch.int32, device="cuda")
    for m in (15, 60):
        x = torch.randn(m, 4096, device="cuda", generator=g).bfloat16()
        weight = (torch.randn(1024, 4096, device="cuda", generator=g) / 64).bfloat16()
        eager = linear_split_k_triton(x, weight, counters)
        torch.testing.assert_close(eager.float(), linear_split_k_reference(x, weight), atol=2e-2, rtol=1e-2)
        for _ in range(3):  # deterministic, counters back to zero after each launch and replay
            assert torch.equal(linear_split_k_triton(x, weight, counters), eager)
            assert torch.equal(graph_replay(lambda: linear_split_k_triton(x, weight, counters)), eager)
        assert not counters.any()
