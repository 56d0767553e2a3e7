"""Vocabulary-parallel top-K + logsumexp (kernels/topk_shards.py) and the LILICORR proposal under tensor
parallelism (serving/vocab_parallel.py), against the unsharded ones.

Shards follow SGLang's vocabulary-parallel layout (VocabParallelEmbedding: the vocabulary padded, cut into equal
contiguous ranges, padding rows dropped), so small vocabularies give the last ranks fewer than K rows, or none.
The multi-rank tests start 2, 3 and 4 gloo processes (as torchrun would); the Triton kernel's sharded top-K runs
under the interpreter there, as on this CPU machine's other kernel tests, and the proposal around it on the PyTorch
path (the interpreter would take minutes over a 32,000-token vocabulary; the GPU test runs the kernels there).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from sglang_lilicorr.kernels import topk_lse
from sglang_lilicorr.kernels.topk_reference import topk_lse_reference
from sglang_lilicorr.kernels.topk_shards import SENTINEL, merge_partials, shard_partials
from sglang_lilicorr.walk import greedy_walk
from ranks import start_ranks
from topk_references import merge_topk_lse_reference, sharded_topk_lse_reference

NEG_INF = float("-inf")
K = 8
HIDDEN = 64


def shard_bounds(vocab: int, ranks: int) -> list[int]:
    """Start of each rank's real vocabulary rows, then V: SGLang 0.5.23's VocabParallelEmbedding layout (the padded
    vocabulary cut into equal ranges; ranks whose range starts past V hold no real row)."""
    from sglang.srt.layers.vocab_parallel_embedding import (
        DEFAULT_VOCAB_PADDING_SIZE,
        VocabParallelEmbedding,
        pad_vocab_size,
    )

    pad = DEFAULT_VOCAB_PADDING_SIZE
    if pad_vocab_size(vocab, pad) % ranks:
        pad *= ranks  # as VocabParallelEmbedding.__init__ widens the padding
    padded = pad_vocab_size(vocab, pad)
    shards = [VocabParallelEmbedding._get_indices(padded, padded, vocab, vocab, r, ranks) for r in range(ranks)]
    return [s.org_vocab_start_index for s in shards] + [vocab]


def adversarial_rows(vocab: int, bounds: list[int], seed: int) -> torch.Tensor:
    """fp32 [10, V]: normal; equal everywhere; all -inf; fewer than K finite (all in the last non-empty shard); the
    row maximum tied across every shard border; one shard with fewer than K finite values; +-0.0 ties; coarse ties;
    equal values on both sides of each border below the maximum; huge magnitudes."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(vocab, generator=g) * 4, torch.full((vocab,), 0.75), torch.full((vocab,), NEG_INF)]
    last = max(i for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i])
    sparse = torch.full((vocab,), NEG_INF)
    sparse[bounds[last] : bounds[last] + 3] = torch.tensor([1.0, 2.0, 1.0])[: bounds[last + 1] - bounds[last]]
    border = torch.randn(vocab, generator=g)
    few = torch.randn(vocab, generator=g)
    inner = [b for b in bounds[1:-1] if 0 < b < vocab]
    for b in inner:
        border[b - 1] = border[b] = 9.0  # the same maximum on both sides of each border
        few[b - 1] = few[b] = 0.5
    few[bounds[0] : bounds[1]] = NEG_INF
    few[bounds[0] : bounds[0] + 2] = 3.0  # rank 0: 2 finite values, tied
    zeros = torch.zeros(vocab)
    zeros[torch.randperm(vocab, generator=g)[: vocab // 2]] = -0.0
    coarse = torch.randint(-4, 2, (vocab,), generator=g).float()
    huge = torch.randn(vocab, generator=g) * 3e4
    return torch.stack([rows[0], rows[1], rows[2], sparse, border, few, zeros, coarse, huge, -rows[0]])


def assert_same_candidates(got, want, *, lse_exact: bool) -> None:
    """vals and ids equal bit for bit (-0.0 read as +0.0, as the ordering keys read it); lse within fp32 rounding."""
    (vals, ids, lse), (ref_vals, ref_ids, ref_lse) = got, want
    assert torch.equal(ids, ref_ids)
    assert torch.equal((vals + 0.0).view(torch.int32), (ref_vals + 0.0).view(torch.int32))  # -0.0 + 0.0 = +0.0
    if lse_exact:
        assert torch.equal(lse.view(torch.int32), ref_lse.view(torch.int32))
    else:
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        torch.testing.assert_close(lse, ref_lse, rtol=2e-6, atol=2e-6)


# --- one process: the partials and the merge ---------------------------------------------------


def sharded(logits: torch.Tensor, bounds: list[int], rank_order=slice(None)):
    """Every shard's partials, merged as a rank does after the all-gather (in rank order, or `rank_order`)."""
    parts = [shard_partials(logits[:, lo:hi], K, lo) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return merge_partials(torch.stack(parts[rank_order]), K)


@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sharded_kernel_equals_the_unsharded_kernel(seed, ranks, dtype):
    vocab = 196  # SGLang's layout: 3 ranks -> the last holds no row; 4 ranks -> the last holds 4 < K
    bounds = shard_bounds(vocab, ranks)
    logits = adversarial_rows(vocab, bounds, seed).to(dtype)
    merged = sharded(logits, bounds)
    assert_same_candidates(merged, topk_lse(logits, K), lse_exact=False)  # the Triton kernel on the whole rows
    assert_same_candidates(merged, sharded_topk_lse_reference(logits, K, bounds), lse_exact=False)
    assert_same_candidates(sharded(logits, bounds, slice(None, None, -1)), merged, lse_exact=False)  # any rank order


@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_served_merge_equals_the_reference_merge(monkeypatch, ranks, dtype):
    """On the same per-shard results (the PyTorch top-K here) the served merge and the reference merge agree bit
    for bit, lse included; and the merged reference is the unsharded reference."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # topk_lse takes the PyTorch definition
    vocab = 196
    bounds = shard_bounds(vocab, ranks)
    logits = adversarial_rows(vocab, bounds, seed=ranks).to(dtype)
    reference = sharded_topk_lse_reference(logits, K, bounds)
    assert_same_candidates(sharded(logits, bounds), reference, lse_exact=True)
    assert_same_candidates(reference, topk_lse_reference(logits, K), lse_exact=False)


def test_padding_columns_holding_minus_inf_change_nothing(seed):
    """A rank that keeps its padded range (padding logits set to -inf, ids past V) merges to the same result as one
    that drops the padding rows: padding keys rank below every real key."""
    vocab, ranks = 196, 4
    bounds = shard_bounds(vocab, ranks)
    width = 256 // ranks  # the padded range of each rank
    logits = adversarial_rows(vocab, bounds, seed)
    padded = torch.full((logits.shape[0], width * ranks), NEG_INF)
    padded[:, :vocab] = logits
    dropped = sharded(logits, bounds)
    kept = merge_partials(
        torch.stack([shard_partials(padded[:, r * width : (r + 1) * width], K, r * width) for r in range(ranks)]), K
    )
    assert_same_candidates(kept, dropped, lse_exact=True)
    assert int(kept[1].max()) < vocab


def test_partials_of_small_and_empty_shards():
    """K = 4 over ids 10..14: a shard of 3, an empty one, a shard of 2; row 1 all -inf."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0], [NEG_INF] * 5])
    first = shard_partials(logits[:, :3], 4, vocab_start=10)
    assert first.shape == (2, 5) and first.dtype == torch.int64
    assert (first[:, 3] == SENTINEL).all()  # 3 entries: the fourth slot is empty
    empty = shard_partials(logits[:, 3:3], 4, vocab_start=13)
    assert (empty[:, :4] == SENTINEL).all()
    last = shard_partials(logits[:, 3:], 4, vocab_start=13)
    vals, ids, lse = merge_partials(torch.stack([first, empty, last]), 4)
    assert ids.tolist() == [[11, 12, 14, 10], [10, 11, 12, 13]] and vals[0].tolist() == [3.0, 3.0, 3.0, 1.0]
    assert lse[1].item() == NEG_INF and torch.isclose(lse[0], torch.logsumexp(logits[0], 0))
    out = torch.empty(2, 5, dtype=torch.int64)
    assert shard_partials(logits[:, :3], 4, 10, out=out) is out and torch.equal(out, first)


def test_bad_partials_are_named():
    with pytest.raises(ValueError, match="float \\[N, n\\] shard"):
        shard_partials(torch.zeros(3, dtype=torch.int64), 2, 0)
    with pytest.raises(ValueError, match="out must be int64 \\[2, 3\\]"):
        shard_partials(torch.zeros(2, 5), 2, 0, out=torch.empty(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="int64 \\[ranks, N, 3\\]"):
        merge_partials(torch.zeros(2, 4, 5, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="do not split"):
        sharded_topk_lse_reference(torch.zeros(2, 10), 2, [0, 6, 4, 10])


def test_reference_merge_breaks_ties_by_global_id():
    shards = [
        (torch.tensor([[2.0, 1.0]]), torch.tensor([[7, 5]]), torch.tensor([0.0])),
        (torch.tensor([[2.0, 2.0]]), torch.tensor([[3, 9]]), torch.tensor([1.0])),
    ]
    vals, ids, lse = merge_topk_lse_reference(shards, 3)
    assert ids.tolist() == [[3, 7, 9]] and vals.tolist() == [[2.0, 2.0, 2.0]]
    assert torch.isclose(lse, torch.logsumexp(torch.tensor([0.0, 1.0]), 0))


# --- 2, 3 and 4 gloo ranks ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gather(out: torch.Tensor, inp: torch.Tensor) -> None:
    import torch.distributed as dist

    dist.all_gather_into_tensor(out, inp)


def _rank(rank: int, ranks: int, port: int, seed: int, bounds: list[int]) -> None:
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        _check_top_k_on_rank(rank, ranks, seed, bounds)  # the Triton kernel, under the interpreter
        os.environ.pop("TRITON_INTERPRET", None)  # the proposal on the PyTorch path (kernels.device.uses_triton)
        _check_proposal_on_rank(rank, ranks, seed, bounds)
    finally:
        dist.destroy_process_group()


def _check_top_k_on_rank(rank: int, ranks: int, seed: int, bounds: list[int]) -> None:
    """This rank's shard -> partials -> one all-gather -> merge: the unsharded top-K bit for bit, on every rank."""
    vocab = bounds[-1]
    lo, hi = bounds[rank], bounds[rank + 1]
    for dtype in (torch.float32, torch.bfloat16):
        logits = adversarial_rows(vocab, bounds, seed).to(dtype)  # the same rows on every rank (seeded)
        parts = shard_partials(logits[:, lo:hi], K, lo)
        gathered = torch.empty((ranks * parts.shape[0], K + 1), dtype=torch.int64)
        gather(gathered, parts)
        merged = merge_partials(gathered.view(ranks, -1, K + 1), K)
        assert_same_candidates(merged, topk_lse(logits, K), lse_exact=False)
        assert_same_candidates(merged, sharded_topk_lse_reference(logits, K, bounds), lse_exact=False)


NEAR_TIE = 0.05  # pair-score margin: 1-ulp (fp32) LSE differences move the served-geometry bf16 head's scores by up
#                  to 0.006 (seeds 0-3 on the CPU; at seed 3 two of 16 rows then draft another token at one slot)


def assert_walks_differ_only_at_near_ties(got: torch.Tensor, start, pair, ids) -> None:
    """got [b, S] against the greedy walk over (start, pair) of candidates ids [b, S, K]: in each row, up to its first
    differing slot the same tokens, and there the walk's best score within NEAR_TIE of the score of got's token."""
    path = greedy_walk(start, pair)  # [b, S] candidate ranks
    want = ids.gather(2, path.unsqueeze(-1)).squeeze(-1)
    for r in range(got.shape[0]):
        differ = (got[r] != want[r]).nonzero().flatten()
        if differ.numel() == 0:
            continue
        s = int(differ[0])
        scores = start[r] if s == 0 else pair[r, s - 1, path[r, s - 1]]  # [K]
        choice = (ids[r, s] == got[r, s]).nonzero().flatten()
        assert choice.numel() == 1, f"row {r} slot {s}: token {int(got[r, s])} is not one of the slot's candidates"
        margin = float(scores[path[r, s]] - scores[choice[0]])
        assert 0 <= margin < NEAR_TIE, f"row {r} slot {s}: the walk's choice leads by {margin:.4f}, not a near-tie"


def _check_proposal_on_rank(
    rank: int,
    ranks: int,
    seed: int,
    bounds: list[int],
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    hidden_size: int = HIDDEN,
    rows: int = 3,
    head_kw=None,
) -> None:
    """The served proposal with this rank's LM head shard (ShardedCandidates, its plans' merge, through
    LiLiCorrProposer): the TP = 1 candidates (ids and values bit for bit, the LSE merged in another order: within fp32
    rounding), the TP = 1 head's draft of those candidates bit for bit on every rank, and the TP = 1 proposal up to
    near-ties of its walk (the LSE's last bit moves a bf16 head's scores by up to ~0.006)."""
    import dataclasses

    import torch.nn.functional as F

    from sglang_lilicorr.config import LiLiCorrConfig
    from sglang_lilicorr.fast_path.pipeline import candidates
    from sglang_lilicorr.fast_path.select import FastLiLiCorrSelect
    from sglang_lilicorr.head import LiLiCorrHead
    from sglang_lilicorr.serving.proposer import LiLiCorrProposer
    from sglang_lilicorr.serving.vocab_parallel import VocabShard

    vocab, lo, hi = bounds[-1], bounds[rank], bounds[rank + 1]
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    head_kw = dict(hidden_size=0, num_layers=1, num_heads=4, factor_dim=32) if head_kw is None else head_kw
    head = (
        LiLiCorrHead(LiLiCorrConfig(block_size=16, candidate_topk=K, **head_kw), hidden_size).to(device, dtype).eval()
    )
    lm, embed = (torch.randn(vocab, hidden_size, generator=g).to(device, dtype) for _ in range(2))
    hidden = torch.randn(rows * 16, hidden_size, generator=g).to(device, dtype)
    anchors = torch.randn(rows, hidden_size, generator=g).to(device, dtype)
    whole = LiLiCorrProposer(head=head, lm_head_weight=lm, embed_weight=embed, block_size=16)
    shard = LiLiCorrProposer(
        head=head,
        lm_head_weight=lm[lo:hi],
        embed_weight=embed,
        block_size=16,
        vocab=VocabShard(lo, hi - lo, vocab, ranks, gather),
    )
    pass_hidden = hidden.view(rows, 16, hidden_size)[:, 1:]
    slots = torch.arange(rows, device=device)
    for p in (whole, shard):
        p.allocate(num_request_slots=rows + 1, max_rows=rows)
        p.publish_anchors(anchors, slots)
        p.stage_anchors(slots.roll(1))
        p(hidden)
    rows_of = pass_hidden.reshape(-1, hidden_size)
    logits = F.linear(rows_of, lm)  # the whole vocabulary's, as the TP = 1 proposer computes them
    vals, ids, lse = shard.sharded(F.linear(rows_of, lm[lo:hi]))
    want = candidates(logits, K, whole.select.plan(rows))
    assert torch.equal(ids, want[1])
    torch.testing.assert_close(vals, want[0], rtol=1e-6, atol=1e-6)  # the logits of a row shard: GEMM rounding
    torch.testing.assert_close(lse, want[2], rtol=2e-6, atol=2e-6)
    staged = whole.anchors[:rows]
    draft = shard.out.view(rows, -1)
    handed = whole.select.plans.map(lambda plan, _: dataclasses.replace(plan, merge=lambda _: (vals, ids, lse)))
    tp1_head = FastLiLiCorrSelect(head, token_table=whole.select.token_table, plans=handed)
    assert torch.equal(draft, tp1_head.propose(logits, pass_hidden, staged).draft)
    tp1 = whole.select.propose(logits, pass_hidden, staged)
    assert_walks_differ_only_at_near_ties(draft, tp1.start, tp1.pair, tp1.ids)
    every = torch.empty((ranks * shard.out.numel(),), dtype=shard.out.dtype, device=device)
    gather(every, shard.out)
    assert all(torch.equal(block, shard.out) for block in every.view(ranks, -1))


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_gloo_ranks_merge_to_the_unsharded_top_k_and_proposal(seed, ranks):
    start_ranks(_rank, (ranks, free_port(), seed, shard_bounds(196, ranks)), ranks)


# --- the served geometry: 2 gloo ranks on the CPU, 2 GPUs over NCCL ----------------------------------


def _served_geometry_rank(rank: int, ranks: int, port: int, seed: int, bounds: list[int], backend: str) -> None:
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    if backend == "nccl":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=ranks, device_id=torch.device("cuda", rank))
    else:
        torch.set_num_threads(1)
        os.environ.pop("TRITON_INTERPRET", None)  # the PyTorch path on the CPU (see the module's docstring)
        dist.init_process_group("gloo", rank=rank, world_size=ranks)
    gpu = backend == "nccl"
    # benchmarks/multi_gpu/tp_models.py's draft: bf16, Hm 1024, vocabulary 32,000, the default head; 16 requests
    # (4 on the CPU)
    try:
        _check_proposal_on_rank(
            rank,
            ranks,
            seed,
            bounds,
            device=f"cuda:{rank}" if gpu else "cpu",
            dtype=torch.bfloat16,
            hidden_size=1024,
            rows=16 if gpu else 4,
            head_kw={},
        )
    finally:
        dist.destroy_process_group()


def test_gloo_ranks_propose_at_the_served_geometry(seed):
    start_ranks(_served_geometry_rank, (2, free_port(), seed, shard_bounds(32000, 2), "gloo"), 2)


@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [2, 4])
def test_nccl_ranks_propose_with_the_gpu_kernels(seed, ranks):
    """On 2 and 4 GPUs, the Triton kernels and NCCL's all-gather, at the served geometry."""
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    mp.spawn(
        _served_geometry_rank,
        args=(ranks, free_port(), seed, shard_bounds(32000, ranks), "nccl"),
        nprocs=ranks,
        join=True,
    )
