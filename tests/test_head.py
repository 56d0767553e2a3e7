"""The head: shapes, unit vectors, score bounds, batching, gradients, and equivalence with
SGLang 0.5.23's own LiLiCorrHead (the upstream module as test oracle)."""

import dataclasses

import pytest
import torch

from sglang_lilicorr.config import ConfigError, LiLiCorrConfig
from sglang_lilicorr.head import LiLiCorrHead, confidence_features

SMALL = LiLiCorrConfig(block_size=6, candidate_topk=4, factor_dim=16, hidden_size=32, num_heads=4, num_layers=2)


def lattice_inputs(head, b, s=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = head.config
    s = s or cfg.num_slots
    k, hm = cfg.candidate_topk, head.model_hidden_size
    logits = torch.randn(b, s, 50, generator=g)
    log_probs = logits.log_softmax(-1).topk(k, dim=-1).values
    tokens = head.project_tokens(torch.randn(b, s, k, hm, generator=g))
    return tokens, log_probs, torch.randn(b, s, hm, generator=g), torch.randn(b, hm, generator=g)


def randomise(module, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def test_paper_defaults():
    cfg = LiLiCorrConfig()
    assert (cfg.block_size, cfg.candidate_topk, cfg.factor_dim, cfg.logit_scale) == (16, 8, 1024, 8.0)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.ffn_width(4096)) == (2, 1024, 8, 2048)


@pytest.mark.parametrize(
    "field,value",
    [
        ("block_size", 1),
        ("candidate_topk", 6),
        ("candidate_topk", 32),
        ("factor_dim", 0),
        ("num_layers", 0),
        ("num_heads", 0),
        ("hidden_size", 30),
        ("logit_scale", 0.0),
        ("mlp_ratio", float("nan")),
        ("vector_eps", -1.0),
        ("block_size", 16.0),
        ("num_layers", True),
    ],
)
def test_config_rejects_out_of_range(field, value):
    with pytest.raises(ConfigError, match=field):
        dataclasses.replace(LiLiCorrConfig(), **{field: value})


def test_config_round_trips_through_dflash_keys():
    cfg = dataclasses.replace(SMALL, logit_scale=6.0)
    back = LiLiCorrConfig.from_dflash_config(cfg.to_dflash_keys(), block_size=6, rms_norm_eps=cfg.rms_norm_eps)
    assert back == cfg
    keys = dict(cfg.to_dflash_keys())
    del keys["lilicorr_vector_eps"]
    with pytest.raises(ConfigError, match="lilicorr_vector_eps"):
        LiLiCorrConfig.from_dflash_config(keys, block_size=6, rms_norm_eps=1e-6)
    with pytest.raises(ConfigError, match="lilicorr_num_layers"):
        LiLiCorrConfig.from_dflash_config(
            {**cfg.to_dflash_keys(), "lilicorr_num_layers": 2.5}, block_size=6, rms_norm_eps=1e-6
        )


def test_confidence_features():
    lp = torch.tensor([[[-0.5, -1.0, -3.0, -9.0]]])
    f = confidence_features(lp)
    assert torch.allclose(f[..., 0], lp) and torch.allclose(f[..., 1], lp.exp())
    assert torch.allclose(f[..., 2], lp + 0.5)
    assert torch.allclose(f[..., 3], torch.tensor([0, 1 / 3, 2 / 3, 1.0]))
    assert f[..., 4].tolist() == [[[1.0, 0.0, 0.0, 0.0]]]


def test_scores_are_scaled_cosines_with_unit_vectors():
    head = LiLiCorrHead(SMALL, model_hidden_size=24)
    inputs = lattice_inputs(head, b=3)
    out_vec, in_vec, anchor_out = head.vectors(*inputs)
    for v in (out_vec, in_vec, anchor_out):
        assert torch.allclose(v.norm(dim=-1), torch.ones(()), atol=1e-5)
    start, pair = head(*inputs)
    assert start.shape == (3, 4) and pair.shape == (3, 4, 4, 4)
    assert start.dtype == pair.dtype == torch.float32
    assert pair.abs().max() <= SMALL.logit_scale + 1e-4
    expect = SMALL.logit_scale * (out_vec[1, 2, 3] * in_vec[1, 3, 0]).sum()
    assert torch.allclose(pair[1, 2, 3, 0], expect, atol=1e-5)


def test_requests_are_independent_in_a_batch():
    head = LiLiCorrHead(SMALL, model_hidden_size=24)
    inputs = lattice_inputs(head, b=4)
    start, pair = head(*inputs)
    one_start, one_pair = head(*(x[2:3] for x in inputs))
    assert torch.allclose(start[2:3], one_start, atol=1e-5) and torch.allclose(pair[2:3], one_pair, atol=1e-5)


def test_nodes_see_the_whole_lattice():
    # Changing a candidate at the last slot moves the scores of the first pair (App. A: the
    # factorisation is local, the information is not).
    head = LiLiCorrHead(SMALL, model_hidden_size=24)
    randomise(head)
    tokens, lp, ph, anchor = lattice_inputs(head, b=1)
    start, pair = head(tokens, lp, ph, anchor)
    tokens2 = tokens.clone()
    tokens2[0, -1] += 1.0
    start2, pair2 = head(tokens2, lp, ph, anchor)
    assert not torch.allclose(pair[0, 0], pair2[0, 0])


def test_gradients_reach_every_input_and_parameter():
    head = LiLiCorrHead(SMALL, model_hidden_size=24)
    randomise(head)
    tokens, lp, ph, anchor = lattice_inputs(head, b=2)
    lp.requires_grad_(True)
    ph.requires_grad_(True)
    start, pair = head(tokens, lp, ph, anchor)
    (start.sum() + pair.square().sum()).backward()
    assert lp.grad.abs().sum() > 0 and ph.grad.abs().sum() > 0
    dead = [n for n, p in head.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not dead


def test_shorter_active_block_uses_a_prefix_of_the_slots():
    head = LiLiCorrHead(SMALL, model_hidden_size=24)
    start, pair = head(*lattice_inputs(head, b=2, s=3))
    assert pair.shape == (2, 2, 4, 4)
    with pytest.raises(ValueError, match="at most 5 slots"):
        head(*lattice_inputs(head, b=2, s=6))


def test_token_table_matches_projection():
    head = LiLiCorrHead(SMALL, model_hidden_size=24)
    emb = torch.randn(10, 24)
    table = head.token_table(emb)
    assert torch.allclose(table[3], head.project_tokens(emb[3]), atol=1e-6)
    same_width = LiLiCorrHead(dataclasses.replace(SMALL, hidden_size=0), model_hidden_size=24)
    assert same_width.token_proj is None and torch.equal(same_width.token_table(emb), emb)


# --- equivalence with SGLang's own head -------------------------------------------------------


def sglang_head(cfg, model_hidden):
    lilicorr = pytest.importorskip("sglang.srt.models.lilicorr", reason="sglang not installed")
    utils = pytest.importorskip("sglang.srt.speculative.lilicorr_utils")
    keys = {k[len("lilicorr_") :]: v for k, v in cfg.to_dflash_keys().items()}
    return lilicorr.LiLiCorrHead(
        model_hidden_size=model_hidden,
        block_size=cfg.block_size,
        rms_norm_eps=cfg.rms_norm_eps,
        config=utils.LiLiCorrConfig(**keys),
    )


@pytest.mark.sglang
@pytest.mark.parametrize("hidden_size", [32, 0])
def test_matches_sglang_lilicorr_head(hidden_size):
    cfg = dataclasses.replace(SMALL, hidden_size=hidden_size)
    model_hidden = 24 if hidden_size else 32
    ours = LiLiCorrHead(cfg, model_hidden_size=model_hidden)
    randomise(ours, seed=7)
    theirs = sglang_head(cfg, model_hidden)
    assert set(theirs.state_dict()) == set(ours.state_dict())  # the checkpoint names
    theirs.load_state_dict(ours.state_dict(), strict=True)
    theirs.materialize_inference_buffers(torch.device("cpu"), torch.float32)

    emb = torch.randn(3, cfg.num_slots, cfg.candidate_topk, model_hidden)
    _, lp, ph, anchor = lattice_inputs(ours, b=3)
    start, pair = ours(ours.project_tokens(emb), lp, ph, anchor)
    with torch.no_grad():
        t_start, t_pair = theirs.score(
            token_embeddings=emb[:, None],
            candidate_log_probs=lp[:, None],
            pass_hidden=ph[:, None],
            anchor_hidden=anchor[:, None],
            anchor_valid=torch.ones(3, 1, dtype=torch.bool),
        )
    sigma = cfg.logit_scale
    torch.testing.assert_close(start, sigma * t_start[:, 0].float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pair, sigma * t_pair[:, 0].float(), atol=1e-4, rtol=1e-4)
