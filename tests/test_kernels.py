"""The Triton kernels agree exactly with their PyTorch references.

On a CPU-only machine the kernels run under Triton's interpreter (tests/conftest.py selects it
before anything imports triton); with CUDA, the `gpu` cases run compiled. Inputs are drawn
from the session's seed (LILICORR_TEST_SEED, tests/conftest.py).
"""

from __future__ import annotations


import pytest
import torch

from sglang_lilicorr import walk
from sglang_lilicorr.kernels import (
    greedy_walk_triton,
    topk_lse,
    topk_lse_reference,
    topk_lse_triton,
    viterbi_triton,
)
from sglang_lilicorr.kernels.tuning import TopKLaunch

from triton_mode import CUDA, INTERPRETER

DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(not INTERPRETER, reason="triton is in compiled mode (no CUDA here?)"),
    ),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")]
    ),
]
NEG_INF = float("-inf")


def _logit_rows(gen: torch.Generator, vocab: int) -> torch.Tensor:
    """[6, V] fp32 rows: normal; heavy ties; mostly -inf with 3 finite; all -inf; +-0.0; one value."""
    normal = torch.randn(vocab, generator=gen) * 4
    ties = torch.randint(-6, 3, (vocab,), generator=gen).float() / 2
    sparse = torch.full((vocab,), NEG_INF)
    sparse[torch.randperm(vocab, generator=gen)[:3]] = torch.randn(3, generator=gen)
    zeros = torch.zeros(vocab)
    zeros[torch.randperm(vocab, generator=gen)[: vocab // 2]] = -0.0
    return torch.stack([normal, ties, sparse, torch.full((vocab,), NEG_INF), zeros, torch.full((vocab,), 1.5)])


def _assert_topk_lse(got, logits: torch.Tensor, k: int) -> None:
    vals, ids, lse = got
    ref_vals, ref_ids, ref_lse = topk_lse_reference(logits.cpu(), k)
    assert vals.dtype == torch.float32 and ids.dtype == torch.int64 and lse.dtype == torch.float32
    assert vals.shape == ids.shape == (logits.shape[0], k) and lse.shape == (logits.shape[0],)
    torch.testing.assert_close(ids.cpu(), ref_ids, rtol=0, atol=0)
    torch.testing.assert_close(vals.cpu(), ref_vals, rtol=0, atol=0)
    torch.testing.assert_close(lse.cpu(), ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "vocab, k, dtype, splits, block",
    [
        (100, 1, torch.float32, None, 2048),  # V below one tile
        (16, 16, torch.bfloat16, None, 2048),  # k == V
        (4099, 8, torch.bfloat16, None, 2048),  # default plan: several splits + merge kernel
        (3001, 4, torch.float16, 1, 512),  # one split: the split kernel finishes the row
        (2500, 2, torch.float32, 3, 256),  # several tiles per split
        (1537, 16, torch.bfloat16, 2, 1024),
    ],
)
def test_topk_lse_matches_reference(gen, device, vocab, k, dtype, splits, block):
    logits = _logit_rows(gen, vocab).to(dtype)
    got = topk_lse_triton(logits.to(device), k, splits=splits, launch=TopKLaunch(block=block))
    _assert_topk_lse(got, logits, k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "vocab, splits, launch",
    [
        (4099, None, TopKLaunch(block=256)),  # several splits + the merge kernel
        (6000, 2, TopKLaunch(block=256, collect_tiles=1)),  # most of each chunk through the K-best buffer
        (
            70000,
            1,
            TopKLaunch(block=2048),
        ),  # one chunk longer than NARROW_SPAN: the split kernel on wide keys, no merge
        (70000, 2, TopKLaunch(block=2048, group=32)),  # two chunks of 34816 logits: narrow split and merge
    ],
)
def test_topk_lse_narrow_keys_equal_wide(gen, device, vocab, splits, launch):
    """bf16 logits rank on int32 keys (TopKLaunch.narrow_keys, the default): the same bits as the int64 keys and the
    reference, on rows of ties (across chunks too: the lower index wins), -inf, +-0.0, one value, all negative."""
    rows = torch.cat([_logit_rows(gen, vocab), -(torch.randn(1, vocab, generator=gen) * 4).abs()]).to(torch.bfloat16)
    narrow = topk_lse_triton(rows.to(device), 8, splits=splits, launch=launch)
    wide = topk_lse_triton(rows.to(device), 8, splits=splits, launch=launch._replace(narrow_keys=False))
    _assert_topk_lse(narrow, rows, 8)
    for a, b in zip(narrow, wide):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_lse_dispatch_on_strided_rows(gen, device):
    wide = _logit_rows(gen, 1500).to(torch.bfloat16)
    got = topk_lse(wide.to(device)[:, 3:1203], 8)  # rows 1500 apart, unaligned start
    _assert_topk_lse(got, wide[:, 3:1203], 8)


def test_topk_lse_reference_definition():
    logits = torch.tensor([[1.0, 3.0, 3.0, NEG_INF, 2.0], [NEG_INF] * 5], dtype=torch.bfloat16)
    vals, ids, lse = topk_lse_reference(logits, 4)
    assert ids.tolist() == [[1, 2, 4, 0], [0, 1, 2, 3]]
    assert vals[0].tolist() == [3.0, 3.0, 2.0, 1.0]
    torch.testing.assert_close(lse[0], torch.logsumexp(logits[0].float(), 0))
    assert lse[1].item() == NEG_INF


@pytest.mark.parametrize(
    "logits, k, error, words",
    [
        (torch.zeros(3), 1, ValueError, "2-D"),
        (torch.zeros(2, 5, dtype=torch.int64), 1, TypeError, "floating point"),
        (torch.zeros(2, 5), 0, ValueError, "[1, 16]"),
        (torch.zeros(2, 40), 17, ValueError, "[1, 16]"),
        (torch.zeros(2, 5), 8, ValueError, "exceeds the vocabulary"),
    ],
)
def test_topk_lse_rejects_bad_input(logits, k, error, words):
    with pytest.raises(error) as info:
        topk_lse(logits, k)
    assert words in str(info.value)


def _lattice(gen: torch.Generator, b: int, slots: int, k: int, dtype: torch.dtype):
    """Integer-valued scores (many ties) with -inf entries, a fully -inf request and a -inf row."""
    start = torch.randint(-3, 3, (b, k), generator=gen).float()
    pair = torch.randint(-3, 3, (b, slots - 1, k, k), generator=gen).float()
    holes = torch.rand(pair.shape, generator=gen) < 0.2
    pair[holes] = NEG_INF
    start[0, : k // 2] = NEG_INF
    start[-1] = NEG_INF
    pair[-1] = NEG_INF
    if slots > 2:
        pair[0, 1, :, :] = NEG_INF  # every continuation out of slot 2 is -inf
    return start.to(dtype), pair.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decoder", ["greedy_walk", "viterbi"])
@pytest.mark.parametrize(
    "b, slots, k, dtype",
    [
        (3, 15, 8, torch.float32),
        (2, 1, 4, torch.float32),
        (3, 2, 1, torch.float32),
        (2, 6, 2, torch.bfloat16),
        (4, 9, 16, torch.float32),
        (3, 5, 3, torch.float16),
    ],
)
def test_walk_kernels_match_reference(gen, device, decoder, b, slots, k, dtype):
    start, pair = _lattice(gen, b, slots, k, dtype)
    kernel = {"greedy_walk": greedy_walk_triton, "viterbi": viterbi_triton}[decoder]
    got = kernel(start.to(device), pair.to(device))
    want = getattr(walk, decoder)(start, pair)
    assert got.dtype == torch.int64 and got.shape == (b, slots)
    assert torch.equal(got.cpu(), want), (got, want)
    # with candidate ids: the path's candidates' ids, from the same kernel
    ids = torch.randint(0, 1000, (b, slots, 2 * k), generator=gen)[..., ::2]  # strided [b, S, K]
    tokens = kernel(start.to(device), pair.to(device), ids.to(device))
    assert torch.equal(tokens.cpu(), ids.gather(2, want.unsqueeze(-1)).squeeze(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_walk_kernels_on_transposed_pair(gen, device):
    start, pair = _lattice(gen, 3, 7, 8, torch.float32)
    pair_t = pair.transpose(2, 3).contiguous().transpose(2, 3)  # same values, j-major storage
    for decoder, kernel in (("greedy_walk", greedy_walk_triton), ("viterbi", viterbi_triton)):
        assert torch.equal(kernel(start.to(device), pair_t.to(device)).cpu(), getattr(walk, decoder)(start, pair))


def test_walk_kernels_reject_bad_input(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    start = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="does not match start"):
        viterbi_triton(start, torch.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"expected start \[b, K\]"):
        greedy_walk_triton(start[0], torch.zeros(2, 3, 4, 4))
    with pytest.raises(ValueError, match="CUDA device"):
        greedy_walk_triton(start, torch.zeros(2, 3, 4, 4))
    for kernel in (greedy_walk_triton, viterbi_triton):
        with pytest.raises(ValueError, match=rf"{kernel.__name__}: ids \(2, 4, 3\).*must be \[b, S, K\]"):
            kernel(start, torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 3, dtype=torch.int64))
    from sglang_lilicorr.kernels.walk import MAX_BLOCK_SIZE

    with pytest.raises(ValueError, match=f"S={MAX_BLOCK_SIZE} slots; the kernel serves 1..{MAX_BLOCK_SIZE - 1}"):
        greedy_walk_triton(start, torch.zeros(2, MAX_BLOCK_SIZE - 1, 4, 4))  # a block of B + 1 tokens


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETER, reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows, vocab", [(15, 151936), (480, 151936), (64, 49152), (7, 151937)])
def test_topk_lse_cuda_graph_full_vocab(gen, rows, vocab):
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(torch.bfloat16).cuda()
    logits[0, ::7] = NEG_INF
    out = topk_lse(logits, 8)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = topk_lse(logits, 8)
    logits.copy_((torch.randn(rows, vocab, generator=gen) * 3).to(torch.bfloat16).cuda())
    graph.replay()
    _assert_topk_lse(out, logits, 8)
