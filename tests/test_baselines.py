"""The Domino and DSpark heads against SGLang 0.5.23's own serving modules, on CPU: a small random draft of each kind,
exported with our code (train.export.draft_config + train.heads.serving_tensors), loaded by SGLang's draft model
(`load_weights`), proposes the same tokens (and DSpark the same confidences) as our reference."""

import json

import pytest
import torch
from safetensors.torch import load_file
from test_drafter import publish_tiny_target, stub_vllm_rotary_op, tiny_config

from sglang_lilicorr.baselines import DominoConfig, DominoHead, DSparkConfig, DSparkHead
from sglang_lilicorr.checkpoint import save_checkpoint
from sglang_lilicorr.config import ConfigError
from sglang_lilicorr.drafter import DFlashDrafter
from sglang_lilicorr.losses import ObjectiveWeights, corrector_objective
from sglang_lilicorr.train.export import draft_config
from sglang_lilicorr.train.heads import load_corrector_draft, serving_tensors

R, VOCAB, HIDDEN, BLOCK = 5, 64, 32, 6


def randomise(module, seed, scale=0.5):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return module


def export_tiny(tmp_path, head_config):
    """A random drafter + head exported as SGLang serves it -> (draft dir, our drafter, our head)."""
    cfg = tiny_config(block_size=BLOCK)
    drafter = randomise(DFlashDrafter(cfg), 1, 0.05)
    head = randomise(
        (DominoHead if isinstance(head_config, DominoConfig) else DSparkHead)(head_config, HIDDEN, VOCAB), 2
    )
    draft = tmp_path / "draft"
    save_checkpoint(draft, draft_config(cfg, head_config, "float32"), {**drafter.state_dict(), **serving_tensors(head)})
    return draft, drafter, head


def sglang_draft(tmp_path, draft, model_cls):
    """SGLang's draft model built from our config.json and loaded from our model.safetensors by its load_weights."""
    stub_vllm_rotary_op()
    from transformers import AutoConfig

    publish_tiny_target(tmp_path)
    theirs = model_cls(AutoConfig.from_pretrained(draft)).float()
    theirs.load_weights(iter(load_file(str(draft / "model.safetensors")).items()))
    return theirs


def block_inputs(seed=3):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(R, BLOCK, HIDDEN, generator=gen)  # the draft's rows: anchor, then slots 1..S
    lm_head = torch.randn(VOCAB, HIDDEN, generator=gen) * 0.3
    embedding = torch.nn.Embedding(VOCAB, HIDDEN)
    embedding.weight.data = torch.randn(VOCAB, HIDDEN, generator=gen)
    anchor = torch.randint(0, VOCAB, (R,), generator=gen)
    return hidden, lm_head, embedding, anchor


@pytest.mark.sglang
def test_domino_proposes_what_sglangs_rollout_proposes(tmp_path):
    pytest.importorskip("sglang")
    draft, drafter, ours = export_tiny(tmp_path, DominoConfig(gru_hidden_dim=24, emb_dim=40))
    config = json.loads((draft / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["dflash_config"]["projector_type"] == "domino"
    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.speculative.domino_utils import domino_greedy_rollout

    theirs = sglang_draft(tmp_path, draft, DFlashDraftModel)
    assert not theirs.shift_label
    for name, tensor in ours.state_dict().items():  # every head tensor landed where SGLang reads it
        assert torch.equal(theirs.state_dict()[name], tensor), name
    hidden, lm_head, embedding, anchor = block_inputs()
    with torch.no_grad():
        want = domino_greedy_rollout(
            draft_hidden=hidden,
            bonus_tokens=anchor,
            target_embedding=embedding,
            lm_head_weight=lm_head,
            prefix_gru=theirs.prefix_gru,
            embed_proj=theirs.embed_proj,
            vocab_size=VOCAB,
            shift_label=False,
            candidate_pool_size=0,
            in_cuda_graph=False,
        )
        got = ours(hidden[:, 1:], hidden[:, 1:] @ lm_head.T, anchor, embedding)
    assert torch.equal(got.ids, want)
    # teacher-forced on its own picks, the step logits are the free rollout's
    forced = ours(hidden[:, 1:], hidden[:, 1:] @ lm_head.T, anchor, embedding, forced=got.ids)
    torch.testing.assert_close(forced.logits, got.logits, rtol=1e-5, atol=1e-5)
    drafter_back, head_back = load_corrector_draft(draft)
    assert isinstance(head_back, DominoHead) and drafter_back.config == drafter.config


@pytest.mark.sglang
@pytest.mark.parametrize("markov", ["vanilla", "gated", "rnn"])
def test_dspark_proposes_and_scores_what_sglangs_markov_block_does(tmp_path, markov, monkeypatch):
    pytest.importorskip("sglang")
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "cap-accept")  # the ragged verification that reads the confidences
    draft, drafter, ours = export_tiny(tmp_path, DSparkConfig(markov_rank=12, markov_head_type=markov))
    config = json.loads((draft / "config.json").read_text())
    assert config["architectures"] == ["DSparkDraftModel"] and config["block_size"] == BLOCK - 1
    from sglang.srt.models.dspark import DSparkDraftModel
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config
    from sglang.srt.speculative.dspark_components.dspark_draft import DraftNoise, draft_markov_block

    parsed = parse_dspark_draft_config(draft_hf_config=config)
    assert (parsed.gamma, parsed.markov_rank, parsed.markov_head_type, parsed.mask_token_id) == (
        BLOCK - 1,
        12,
        markov,
        5,
    )
    theirs = sglang_draft(tmp_path, draft, DSparkDraftModel)
    assert theirs.sample_from_anchor is False and theirs.gamma == BLOCK - 1
    hidden, lm_head, _, anchor = block_inputs()
    slots = hidden[:, 1:]  # select_draft_hidden_without_anchor
    base = slots @ lm_head.T

    class NoTensorParallel:
        def sync(self, site, values):
            return values

    with torch.no_grad():
        want, _ = draft_markov_block(
            markov_head=theirs.markov_head,
            base_logits=base,
            anchor_tokens=anchor,
            draft_hidden=slots,
            step_temperatures=torch.zeros(R),
            noise=DraftNoise(key=0, offset=torch.zeros(1, dtype=torch.int64)),
            tp_sync=NoTensorParallel(),
            greedy_draft=True,
        )
        confidence, raw = theirs.confidence_head.predict(
            slots.reshape(R * (BLOCK - 1), -1), anchor_tokens=anchor, draft_tokens=want, markov_head=theirs.markov_head
        )
        got = ours(slots, base, anchor)
    assert torch.equal(got.ids, want)
    torch.testing.assert_close(got.confidence, raw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.sigmoid(got.confidence), confidence, rtol=1e-5, atol=1e-5)
    _, head_back = load_corrector_draft(draft)
    assert isinstance(head_back, DSparkHead) and head_back.config == ours.config


def test_corrector_objective_terms():
    gen = torch.Generator().manual_seed(0)
    draft = torch.randn(3, 4, 10, generator=gen, requires_grad=True)
    step = torch.randn(3, 4, 10, generator=gen, requires_grad=True)
    targets = torch.randint(0, 10, (3, 4), generator=gen)
    valid = torch.ones(3, 4, dtype=torch.bool)
    valid[2, 2:] = False
    w = ObjectiveWeights(gamma=0.5)
    plain = corrector_objective(draft, step, targets, valid, w)
    first_skipped = corrector_objective(draft, step, targets, valid, w, corrected_from=1)
    assert float(first_skipped.ce.detach()) < float(plain.ce.detach()) and plain.confidence is None
    torch.testing.assert_close(plain.total, plain.dflash + 0.5 * plain.ce)
    conf = torch.zeros(3, 4, requires_grad=True)
    with_conf = corrector_objective(draft, step, targets, valid, w, confidence=conf)
    torch.testing.assert_close(with_conf.confidence, torch.log(torch.tensor(2.0)))  # sigmoid(0) = 1/2 on any label
    with_conf.total.backward()
    assert conf.grad is not None and float(conf.grad[2, 3]) == 0.0  # an invalid slot teaches nothing


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: DominoConfig(gru_hidden_dim=0, emb_dim=4), "gru_hidden_dim=0"),
        (lambda: DSparkConfig(markov_rank=4, markov_head_type="lstm"), "markov_head_type='lstm'"),
        (lambda: DSparkConfig.from_keys({"kind": "dspark", "markov_rank": "8"}), "markov_rank='8'"),
    ],
)
def test_bad_corrector_configs_are_named(bad, match):
    with pytest.raises(ConfigError, match=match):
        bad()
