"""The acceptance replay reproduces the reference decoder's blocks exactly, at T = 0 and T = 1."""

import pytest
import torch

from sglang_lilicorr.frozen_target import FrozenTarget
from sglang_lilicorr.reference import speculative_decoder
from sglang_lilicorr.reference.propose import BlockProposer
from sglang_lilicorr.reference.replay import Replayer, matched_prefix, pooled_tau, walk_blocks
from test_reference import S, tiny_drafter, tiny_head, tiny_target


PROMPT = [3, 1, 4, 1, 5, 2, 6]
SMALL_VOCAB = 8  # random drafts then match the target's tokens often enough to exercise acceptance


@pytest.fixture(scope="module")
def models():
    drafter = tiny_drafter(SMALL_VOCAB)
    torch.manual_seed(2)
    drafter.reset_parameters(std=0.3)  # wide enough that drafts follow the context, not the mask token
    return tiny_target(SMALL_VOCAB), drafter, tiny_head()


def test_matched_prefix_counts_leading_matches_and_stops_at_the_end():
    output = torch.tensor([5, 6, 7, 8, 9])
    drafts = torch.tensor([[6, 7, 0], [7, 8, 9], [8, 9, 9], [9, 4, 4]])  # anchors 0..3, S = 3
    assert matched_prefix(drafts, output).tolist() == [2, 3, 2, 1]


def test_walk_blocks_emits_accepted_plus_one_and_stops_at_the_length():
    # anchors 0..6 of a 8-token output
    assert walk_blocks([2, 0, 0, 5, 0, 0, 1], 8) == [
        2,
        3,
    ]  # 0 -> 3 -> 7 = the end (the block at 3 is capped: 4 tokens left)
    assert walk_blocks([0] * 4, 5) == [0, 0, 0, 0]
    assert walk_blocks([], 1) == []


@pytest.mark.parametrize("commit,walk", [("lilicorr", "greedy"), ("argmax", "greedy"), ("lilicorr_viterbi", "viterbi")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replay_equals_the_decoder_block_for_block(models, commit, walk, temperature):
    target, drafter, head = models
    gen = torch.Generator().manual_seed(11)
    res = speculative_decoder(target, drafter, head, walk=walk, commit=commit).generate(PROMPT, 40, temperature, gen)
    frozen = FrozenTarget(target, drafter.config.target_layer_ids)
    replay = Replayer(frozen, {"x": BlockProposer(frozen, drafter, head, ("greedy", "viterbi"))}).turn(
        PROMPT, res.output_ids
    )["x"]
    assert replay.completion_tokens == len(res.output_ids)
    assert sum(b.accepted[commit] for b in res.blocks) >= 3  # the case is not trivial
    assert replay.accepted[commit] == [b.accepted[commit] for b in res.blocks]
    assert pooled_tau([replay], commit) == pytest.approx(res.tau)


def test_batched_drafts_equal_one_anchor_drafts(models):
    """One pass over many anchors drafts exactly what the decoder drafts one block at a time."""
    target, drafter, head = models
    res = speculative_decoder(target, drafter, head).generate(PROMPT, 30)
    frozen = FrozenTarget(target, drafter.config.target_layer_ids)
    proposer = BlockProposer(frozen, drafter, head, ("greedy",))
    tokens = torch.tensor([PROMPT + res.output_ids])
    features, _ = frozen.run(tokens, torch.ones_like(tokens))
    anchors = torch.tensor([b.anchor_pos for b in res.blocks])
    drafts = proposer.blocks(features, anchors, tokens[0, anchors])
    for i, b in enumerate(res.blocks):
        assert drafts["lilicorr"][i].tolist() == b.drafts["lilicorr"]
        assert drafts["argmax"][i].tolist() == b.drafts["argmax"]


def test_oracle_drafts_are_accepted_in_full_blocks():
    output = torch.arange(20)
    drafts = torch.stack([torch.arange(i + 1, i + 1 + S) for i in range(19)])  # the true continuation everywhere
    assert walk_blocks(matched_prefix(drafts, output).tolist(), 20) == [S] * (19 // (S + 1)) + [19 % (S + 1) - 1]


def test_short_outputs_run_no_block(models):
    target, drafter, head = models
    frozen = FrozenTarget(target, drafter.config.target_layer_ids)
    out = Replayer(frozen, {"x": BlockProposer(frozen, drafter)}).turn(PROMPT, [4])["x"]
    assert out.completion_tokens == 1 and out.blocks("argmax") == 0
    with pytest.raises(ValueError, match="prompt is empty"):
        Replayer(frozen, {"x": BlockProposer(frozen, drafter)}).turn([], [1, 2])
