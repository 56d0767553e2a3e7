"""The reference speculative decoder on a tiny random Llama target (CPU, fp32)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.drafter import DFlashDrafter, DrafterConfig
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.reference import (
    BlockProposer,
    SpeculativeDecoder,
    check_greedy,
    greedy_verify,
    speculative_decoder,
)
from sglang_lilicorr.frozen_target import FrozenTarget

VOCAB, HIDDEN, BLOCK = 96, 32, 5
S = BLOCK - 1
PROMPT = [3, 17, 42, 8, 61, 23, 9]


def tiny_target(vocab: int = VOCAB):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float().eval()


def tiny_drafter(vocab: int = VOCAB):
    torch.manual_seed(1)
    return DFlashDrafter(
        DrafterConfig(
            hidden_size=HIDDEN,
            vocab_size=vocab,
            num_target_layers=4,
            target_layer_ids=(0, 2),
            mask_token_id=5,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=64,
            block_size=BLOCK,
        )
    ).eval()


def tiny_head():
    torch.manual_seed(2)
    cfg = LiLiCorrConfig(block_size=BLOCK, candidate_topk=4, factor_dim=16, num_layers=1, hidden_size=16, num_heads=2)
    return LiLiCorrHead(cfg, HIDDEN).eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def drafter():
    return tiny_drafter()


@pytest.fixture(scope="module")
def head():
    return tiny_head()


@torch.no_grad()
def plain_greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.fixture(scope="module")
def reference_output(target):
    return plain_greedy(target, PROMPT, 40)


def oracle(full, wrong_slot=None):
    """A proposer that drafts the target's true greedy continuation (optionally wrong at one slot)."""

    def propose(features, anchor):
        a = features.shape[1]
        block = torch.tensor(full[a + 1 : a + 1 + S] + [0] * S)[:S]
        if wrong_slot is not None:
            block[wrong_slot] = (block[wrong_slot] + 1) % VOCAB
        return {"oracle": block}

    return propose


@pytest.mark.parametrize("walk,commit", [("greedy", "lilicorr"), ("viterbi", "lilicorr_viterbi"), ("greedy", "argmax")])
def test_greedy_spec_output_equals_plain_greedy(target, drafter, head, reference_output, walk, commit):
    n = 24
    res = speculative_decoder(target, drafter, head, walk=walk, commit=commit).generate(PROMPT, n)
    assert res.output_ids == reference_output[:n]
    assert res.tau >= 1 and res.verify_count >= 1
    assert 1 + sum(len(b.emitted) for b in res.blocks) == n  # the first token comes from the prefill
    for b in res.blocks:
        names = {"argmax", "lilicorr" if walk == "greedy" else "lilicorr_viterbi"}
        assert set(b.drafts) == names and set(b.accepted) == names
        assert b.committed == commit and all(0 <= m <= S for m in b.accepted.values())
        assert all(len(d) == S for d in b.drafts.values())
    assert check_greedy(target, PROMPT, res.output_ids).ok


def test_bf16_draft_modules_stay_lossless(target, reference_output):
    """Drafter and head as exported (bf16) beside an fp32 target: drafts change, outputs do not."""
    head = tiny_head()  # 16 wide beside a 32-wide target: candidate embeddings go through token_proj
    res = speculative_decoder(target, tiny_drafter().bfloat16(), head.bfloat16()).generate(PROMPT, 12)
    assert res.output_ids == reference_output[:12]


def test_without_head_commits_the_argmax_block(target, drafter, reference_output):
    res = speculative_decoder(target, drafter).generate(PROMPT, 12)
    assert res.output_ids == reference_output[:12]
    assert all(b.committed == "argmax" and set(b.drafts) == {"argmax"} for b in res.blocks)


def test_accepted_counts_match_the_greedy_continuation(target, drafter, head, reference_output):
    """Each draft's recorded acceptance = its common prefix with the target's greedy continuation."""
    full = PROMPT + reference_output
    res = speculative_decoder(target, drafter, head).generate(PROMPT, 24)
    for b in res.blocks:
        truth = full[b.anchor_pos + 1 : b.anchor_pos + 1 + S]
        for name, draft in b.drafts.items():
            m = 0
            while m < S and draft[m] == truth[m]:
                m += 1
            assert b.accepted[name] == m, (name, b)


def test_oracle_drafts_are_accepted_whole(target, reference_output):
    full = PROMPT + reference_output
    dec = SpeculativeDecoder(FrozenTarget(target, (0, 2)), oracle(full), "oracle")
    n = 1 + 4 * (S + 1)
    res = dec.generate(PROMPT, n)
    assert res.output_ids == reference_output[:n]
    assert [b.accepted["oracle"] for b in res.blocks] == [S] * 4
    assert res.tau == n / 4 and res.block_tau("oracle") == S + 1


def test_rejection_at_a_slot_stops_there(target, reference_output):
    full = PROMPT + reference_output
    dec = SpeculativeDecoder(FrozenTarget(target, (0, 2)), oracle(full, wrong_slot=2), "oracle")
    res = dec.generate(PROMPT, 1 + 5 * 3)
    assert res.output_ids == reference_output[:16]
    assert [b.accepted["oracle"] for b in res.blocks] == [2] * 5  # 2 drafts + the target's correction


def test_uncommitted_draft_is_scored_past_the_end_of_the_output(target, reference_output):
    """The perfect draft rides along uncommitted; blocks near the end need their own target pass."""
    full = PROMPT + reference_output
    wrong, right = oracle(full, wrong_slot=1), oracle(full)

    def propose(features, anchor):
        return {"committed": wrong(features, anchor)["oracle"], "other": right(features, anchor)["oracle"]}

    res = SpeculativeDecoder(FrozenTarget(target, (0, 2)), propose, "committed").generate(PROMPT, 1 + 3 * 2)
    assert res.output_ids == reference_output[:7]
    assert [b.accepted for b in res.blocks] == [{"committed": 1, "other": S}] * 3
    assert res.block_tau("other") == S + 1 and res.block_tau("committed") == 2


def test_stop_token_ends_decoding(target, drafter, reference_output):
    stop = reference_output[5]
    first = reference_output.index(stop)
    res = speculative_decoder(target, drafter).generate(PROMPT, 30, stop_ids=[stop])
    assert res.output_ids == reference_output[: first + 1]


def test_sampling_decode_is_seeded_and_well_formed(target, drafter, head):
    runs = [
        speculative_decoder(target, drafter, head).generate(
            PROMPT, 20, temperature=1.0, generator=torch.Generator().manual_seed(7)
        )
        for _ in range(2)
    ]
    assert runs[0].output_ids == runs[1].output_ids and len(runs[0].output_ids) == 20
    for b in runs[0].blocks:
        assert set(b.accepted) == {"lilicorr"}  # at T > 0 only the committed draft is verified
        m = b.accepted["lilicorr"]
        assert b.emitted[:m] == b.drafts["lilicorr"][: min(m, len(b.emitted))]


def test_greedy_verify_rule():
    logits = torch.full((4, 6), -1.0)
    for s, tok in enumerate([2, 4, 1, 5]):
        logits[s, tok] = 1.0
    assert greedy_verify(logits, torch.tensor([2, 4, 1])) == (3, [2, 4, 1, 5])  # full accept + bonus
    assert greedy_verify(logits, torch.tensor([2, 3, 1])) == (1, [2, 4])  # correction at slot 2
    assert greedy_verify(logits, torch.tensor([0, 4, 1])) == (0, [2])
    with pytest.raises(ValueError, match=r"\[S\+1, V\]"):
        greedy_verify(logits, torch.tensor([2, 4]))


def test_check_greedy_flags_a_non_argmax_token(target, reference_output):
    out = list(reference_output[:10])
    assert check_greedy(target, PROMPT, out).ok
    logits = target(input_ids=torch.tensor([PROMPT + out])).logits[0, len(PROMPT) + 2]
    out[3] = int(logits.argmin())  # the least likely token at output position 3
    report = check_greedy(target, PROMPT, out)
    assert not report.ok and report.failures[0].position == 3  # later tokens now follow a changed context
    assert check_greedy(target, PROMPT, out, tol=1e9).ok  # a huge tolerance forgives it
    assert check_greedy(target, PROMPT, out[:4], dtype=torch.float64).failures[0].position == 3


def test_bad_configuration_is_reported(target, drafter, head):
    with pytest.raises(ValueError, match="commit='lilicorr'"):
        speculative_decoder(target, drafter, commit="lilicorr")
    other = LiLiCorrHead(
        LiLiCorrConfig(block_size=BLOCK + 1, candidate_topk=4, factor_dim=8, num_layers=1, hidden_size=16, num_heads=2),
        HIDDEN,
    )
    with pytest.raises(ValueError, match="block_size"):
        BlockProposer(FrozenTarget(target, (0, 2)), drafter, other)
    with pytest.raises(ValueError, match="walk="):
        speculative_decoder(target, drafter, head, walk="beam")
    with pytest.raises(ValueError, match="prompt is empty"):
        speculative_decoder(target, drafter).generate([], 4)


@pytest.mark.gpu
def test_decoder_on_cuda():
    torch.backends.cuda.matmul.allow_tf32 = False
    target, drafter, head = tiny_target().cuda(), tiny_drafter().cuda(), tiny_head().cuda()
    dec = speculative_decoder(target, drafter, head)
    res = dec.generate(PROMPT, 16)
    assert check_greedy(target, PROMPT, res.output_ids).ok
    sampled = dec.generate(PROMPT, 16, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert len(sampled.output_ids) == 16
