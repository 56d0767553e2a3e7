"""serving/vocab_parallel.py in one process (no gloo ranks: fast): the served candidates of one rank's logits, the other
ranks' partials put in by its gather, against the unsharded top-K; each shard and head refusal."""

from __future__ import annotations

import pytest
import torch

from sglang_lilicorr.kernels.topk_shards import shard_partials
from sglang_lilicorr.serving.vocab_parallel import ShardedCandidates, VocabShard


def test_served_candidates_in_one_process_equal_the_unsharded_top_k():
    """ShardedCandidates of the last of 3 ranks (a start above 0), the other ranks' partials put in by its gather:
    vals and ids equal the unsharded top-K, lse the full logsumexp; then the buffers are reused for fewer slots."""
    g = torch.Generator().manual_seed(5)
    vocab, hm, b, s, k = 37, 16, 2, 3, 5
    head = torch.randn(vocab, hm, generator=g)
    bounds = [0, 13, 26, vocab]

    def run(hidden, rank, max_slots=b * s):
        n = hidden.shape[0] * hidden.shape[1]
        logits = hidden.reshape(n, hm) @ head.T
        others = [shard_partials(logits[:, bounds[r] : bounds[r + 1]].contiguous(), k, bounds[r]) for r in range(3)]

        def gather(out, inp):
            for r in range(3):
                out[r * n : (r + 1) * n] = inp if r == rank else others[r]

        lo, hi = bounds[rank], bounds[rank + 1]
        cands = ShardedCandidates(head[lo:hi].clone(), VocabShard(lo, hi - lo, vocab, 3, gather), k)
        cands.allocate(max_slots)
        vals, ids, lse = cands(logits[:, lo:hi].contiguous())
        top = logits.topk(k, dim=-1)
        assert torch.equal(ids, top.indices)
        torch.testing.assert_close(vals, top.values)
        torch.testing.assert_close(lse, logits.logsumexp(-1))
        assert vals.shape == (n, k) and lse.shape == (n,)
        return cands

    for rank in (2, 1):
        run(torch.randn(b, s, hm, generator=g), rank)
    cands = run(torch.randn(1, s, hm, generator=g), 1)  # fewer slots than allocated
    with pytest.raises(RuntimeError, match="7 slots, but allocate\\(\\) sized it for 6"):
        cands(torch.randn(7, 13))
    fresh = ShardedCandidates(head[:13], VocabShard(0, 13, vocab, 3, None), k)
    with pytest.raises(RuntimeError, match="1 slots, but allocate\\(\\) sized it for 0"):
        fresh(torch.randn(1, 13))


@pytest.mark.parametrize("start,size,vocab,ranks", [(-1, 5, 10, 2), (0, -1, 10, 2), (6, 5, 10, 2), (0, 10, 10, 0)])
def test_each_shard_refusal(start, size, vocab, ranks):
    with pytest.raises(ValueError, match="is not a shard of it"):
        VocabShard(start, size, vocab, ranks, None)


def test_shard_edges_and_head_refusals():
    VocabShard(0, 0, 10, 1, None)  # an empty shard
    VocabShard(5, 5, 10, 2, None)  # the last rows, exactly
    shard = VocabShard(5, 5, 10, 2, None)
    with pytest.raises(ValueError, match=r"is \(4, 3\), expected \[5, Hm\]"):
        ShardedCandidates(torch.zeros(4, 3), shard, 3)
    with pytest.raises(ValueError, match=r"is \(5,\), expected"):
        ShardedCandidates(torch.zeros(5), shard, 3)
    with pytest.raises(ValueError, match="K=11 candidates from a 10-token vocabulary"):
        ShardedCandidates(torch.zeros(5, 3), shard, 11)
    assert ShardedCandidates(torch.zeros(5, 3), shard, 10).topk == 10


def test_a_shard_is_frozen():
    """The buffers and the merge are sized from the shard when ShardedCandidates is built: it cannot change after."""
    import dataclasses

    shard = VocabShard(5, 5, 10, 2, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        shard.start = 0
    assert (shard.start, shard.size, shard.vocab_size, shard.ranks) == (5, 5, 10, 2)


def test_buffers_sized_for_more_slots_than_k_plus_1():
    """allocate(max_slots) with max_slots far from K + 1 (the two sizes of the buffers): calls of up to max_slots slots
    merge to the unsharded top-K, one more is refused."""
    g = torch.Generator().manual_seed(9)
    vocab, hm, k, max_slots = 20, 8, 3, 10
    head = torch.randn(vocab, hm, generator=g)

    for hidden in (
        torch.randn(2, 3, hm, generator=g),
        torch.randn(2, 5, hm, generator=g),
        torch.randn(1, 2, hm, generator=g),
    ):
        n = hidden.shape[0] * hidden.shape[1]
        logits = hidden.reshape(n, hm) @ head.T
        other = shard_partials(logits[:, :11].contiguous(), k, 0)

        def gather(out, inp):
            assert out.shape == (2 * n, k + 1)
            out[:n], out[n:] = other, inp

        cands = ShardedCandidates(head[11:].clone(), VocabShard(11, vocab - 11, vocab, 2, gather), k)
        cands.allocate(max_slots)
        assert cands.partials.shape == (max_slots, k + 1) and cands.gathered.shape == (2 * max_slots, k + 1)
        vals, ids, lse = cands(logits[:, 11:].contiguous())
        top = logits.topk(k, dim=-1)
        assert torch.equal(ids, top.indices)
        torch.testing.assert_close(vals, top.values)
        torch.testing.assert_close(lse, logits.logsumexp(-1))
    with pytest.raises(RuntimeError, match="11 slots, but allocate\\(\\) sized it for 10"):
        cands(torch.randn(11, vocab - 11))


def test_the_static_buffers_are_what_the_gather_sees():
    """The partials are written into the buffer allocate() made and the gather fills the other (a CUDA graph replays
    them); both live on the LM head's device, None before allocate()."""
    vocab, hm, k = 12, 4, 3
    head = torch.randn(vocab, hm, generator=torch.Generator().manual_seed(2))
    seen = []

    def gather(out, inp):
        seen.append((out.data_ptr(), inp.data_ptr()))
        out.copy_(inp)

    cands = ShardedCandidates(head, VocabShard(0, vocab, vocab, 1, gather), k)
    assert cands.partials is None and cands.gathered is None
    cands.allocate(4)
    logits = torch.randn(2, hm, generator=torch.Generator().manual_seed(3)) @ head.T
    vals, ids, _ = cands(logits)
    assert seen == [(cands.gathered.data_ptr(), cands.partials.data_ptr())]
    assert torch.equal(ids, logits.topk(k, dim=-1).indices) and vals.dtype == torch.float32
    on_meta = ShardedCandidates(torch.empty(vocab, hm, device="meta"), VocabShard(0, vocab, vocab, 2, None), k)
    on_meta.allocate(4)
    assert on_meta.partials.device.type == on_meta.gathered.device.type == "meta"


def test_a_shard_refusal_in_full():
    with pytest.raises(ValueError) as refused:
        VocabShard(6, 5, 10, 2, None)
    assert str(refused.value) == "VocabShard: ids 6..10 of a 10-token vocabulary over 2 ranks is not a shard of it."
