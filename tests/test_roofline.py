"""The training roofline (benchmarks/training/roofline.py): its FLOP counts against hand counts on tiny shapes and
against what torch's FlopCounterMode counts when the drafter and the head run; MFU and the recipe's wall time."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.training import roofline
from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.drafter import DFlashDrafter, DrafterConfig
from sglang_lilicorr.head import LiLiCorrHead

# target: 2 layers, H 8, 2 heads / 1 KV head of 4, FFN 16, V 32; drafter: 1 layer, H 8, FFN 12, 2 context features,
# B 3 (S 2); head: width 4 (a token projection from 8), 2 heads, FFN 8, K 2, d_e 4, 1 layer; T 6 tokens, N 2 anchors
TARGET = dict(
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    intermediate_size=16,
    vocab_size=32,
)
DRAFTER = DrafterConfig(
    hidden_size=8,
    vocab_size=32,
    num_target_layers=4,
    target_layer_ids=(1, 2),
    mask_token_id=3,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    intermediate_size=12,
    block_size=3,
)
HEAD = LiLiCorrConfig(block_size=3, candidate_topk=2, factor_dim=4, num_layers=1, hidden_size=4, num_heads=2)
TINY = roofline.Shapes(TARGET, DRAFTER, HEAD, seq=6, anchors=2)


def test_target_forward_by_hand():
    layer = 768 + 768 + 768 + 4608  # q 2*6*8*8, k+v 2*(2*6*8*4), o 2*6*8*8, gated FFN 3*2*6*8*16
    layer += 4 * 6 * 3.5 * 2 * 4  # causal attention: 6 queries over (6 + 1) / 2 keys on average, 2 heads of 4
    slots = 2 * 4 * 8 * 32 + 2 * 4 * 2 * 8  # LM head at R S = 4 slot rows; the 4 x K = 8 candidates' logits
    assert roofline.target_forward(TINY) == 2 * layer + slots == 17344


def test_drafter_by_hand():
    fc = 2 * 6 * 16 * 8  # 6 context rows, 2 features of 8 -> 8
    layer = 2 * (2 * 6 * 8 * 4)  # the context's keys and values
    layer += 768 + 768 + 768 + 3 * 2 * 6 * 8 * 12  # Q = 2 x 3 block tokens: q, k + v, o, gated FFN
    layer += 4 * 6 * (6 / 2 + 3) * 2 * 4  # each block token over half the context and its block
    lm_head = 2 * 4 * 8 * 32
    assert roofline.drafter_cost(TINY, trains=True) == (fc + layer + lm_head, fc + lm_head + 2 * layer)
    assert roofline.drafter_cost(TINY, trains=False) == (fc + layer + lm_head, 0.0) == (11264, 0.0)


def test_head_by_hand():
    token_proj = 2 * 8 * 8 * 4  # 8 nodes, 8 -> 4: weight gradient alone (frozen embeddings)
    of_drafter = 2 * 4 * 8 * 4 + 2 * 2 * 8 * 4  # pass_hidden_proj (4 slots), context_proj (2 anchors)
    full = 2 * 8 * 5 * 4 + 2 * 8 * 4 * 4  # feature MLP
    full += 2 * 8 * 4 * 12 + 2 * 8 * 4 * 4 + 2 * 8 * 4 * 8 + 2 * 8 * 8 * 4 + 4 * 8 * 4 * 2 * 2  # one lattice layer
    full += 2 * (2 * 8 * 4 * 4) + 2 * 2 * 4 * 4  # fusion
    full += 2 * (2 * 8 * 4 * 4) + 2 * 2 * 4 * 4  # out, in, anchor out
    full += 2 * 2 * 1 * 2 * 2 * 4 + 2 * 2 * 2 * 4  # pair, start
    forward = token_proj + of_drafter + full
    assert roofline.head_cost(TINY, trains_drafter=False) == (forward, token_proj + of_drafter + 2 * full)
    assert roofline.head_cost(TINY, trains_drafter=True) == (forward, token_proj + 2 * (of_drafter + full))


@pytest.mark.parametrize("trains_drafter", [False, True], ids=["head", "joint"])
def test_head_flops_are_what_torch_counts(trains_drafter):
    """The head's forward and backward as torch's FlopCounterMode counts them: the drafter's states need a gradient
    in a joint run only."""
    head = LiLiCorrHead(HEAD, model_hidden_size=8)
    r, s, k = 2, 2, 2
    embeddings = torch.randn(r, s, k, 8)
    log_probs = torch.randn(r, s, k).sort(-1, descending=True).values
    pass_hidden = torch.randn(r, s, 8, requires_grad=trains_drafter)
    anchor = torch.randn(r, 8, requires_grad=trains_drafter)
    with FlopCounterMode(display=False) as forward:
        start, pair = head(head.project_tokens(embeddings), log_probs, pass_hidden, anchor)
    with FlopCounterMode(display=False) as backward:
        (start.sum() + pair.sum()).backward()
    assert roofline.head_cost(TINY, trains_drafter) == (forward.get_total_flops(), backward.get_total_flops())


def test_drafter_flops_are_what_torch_counts_but_its_attention():
    """The drafter module's forward and backward as FlopCounterMode counts them, less the LM head (the target's, run
    apart) and the attention (the roofline counts the keys a block may see; the counter, no fused CPU attention)."""
    drafter = DFlashDrafter(DRAFTER)
    features = torch.randn(1, 6, 16)
    blocks = torch.randn(1, 6, 8)
    with FlopCounterMode(display=False) as forward:
        context = drafter.project_target_hidden(features)
        hidden = drafter(blocks, torch.arange(6)[None], context, torch.arange(6)[None], torch.ones(1, 6, 12).bool())
    with FlopCounterMode(display=False) as backward:
        hidden.sum().backward()
    fwd, bwd = roofline.drafter_cost(TINY, trains=True)
    lm_head, attention = roofline.linear(4, 8, 32), roofline.attention(6, 6 / 2 + 3, 2, 4)
    assert forward.get_total_flops() == fwd - lm_head - attention
    assert backward.get_total_flops() == bwd - lm_head - 2 * attention


def test_per_token_mfu_and_wall_time():
    joint, head = roofline.flops_per_token(TINY, "joint"), roofline.flops_per_token(TINY, "head")
    assert joint["target_forward"] == 17344 / 6 and head["drafter_backward"] == 0
    assert joint["total"] == pytest.approx(sum(v for k, v in joint.items() if k != "total"))
    assert roofline.card_peak("NVIDIA H100 80GB HBM3") == roofline.card_peak("NVIDIA H200") == 989e12
    assert roofline.card_peak("cpu") is None
    assert roofline.four_gpu_scaling() == 3.76  # benchmarks/results/multi-gpu/summary.json
    wall = roofline.wall_time(tok_s=1e6 / 3600, scaling=4.0, epochs=6)  # 1M tokens an hour
    assert wall == {
        "hours_per_1m_tokens_1gpu": pytest.approx(1.0),
        "hours_per_1m_tokens_4gpu": pytest.approx(0.25),
        "recipe_hours_per_1m_data_tokens_1gpu": pytest.approx(6.0),
        "recipe_hours_per_1m_data_tokens_4gpu": pytest.approx(1.5),
    }
    report = roofline.report(TINY, "joint", peak=1e6, scaling=4.0, tok_s=10.0, at_mfu=0.5)
    assert report["mfu"] == pytest.approx(joint["total"] * 10 / 1e6)
    assert report["tok_s_at_mfu"] == pytest.approx(0.5e6 / joint["total"])


def test_the_step_prints_the_8b_roofline(tmp_path, capsys):
    assert roofline.main(["--tok-s", "joint=18000", "--json", str(tmp_path / "r.json")]) == 0
    out = json.loads((tmp_path / "r.json").read_text())
    shapes = roofline.qwen3_8b_shapes()
    assert (shapes.drafter.num_hidden_layers, shapes.drafter.target_layer_ids) == (5, (1, 9, 17, 25, 33))
    assert (shapes.head.hidden_size, shapes.head.ffn_width(4096), shapes.head.candidate_topk) == (1024, 2048, 8)
    joint = out["joint"]["flops_per_token"]
    assert 14e9 < joint["target_forward"] < 16e9  # ~2 x 7B non-embedding parameters + attention at 3,072 tokens
    assert joint["total"] > out["head"]["flops_per_token"]["total"] and "mfu" not in out["head"]
    assert "| target_forward |" in capsys.readouterr().out
