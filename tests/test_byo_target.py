"""Bring your own target: `lilicorr train --init-from` a DFlash drafter as z-lab publishes it (config keys and tensor
names as published, random small weights: benchmarks/training/zlab_draft.py), its geometry taken from the draft, and
`--train head` (the drafter frozen: bit-identical, no optimizer state, no graph) against `--train joint`; each export
loads in our loader, stock SGLang's LiLiCorrDraftModel and the LILICORR plugin's draft model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_train import TINY_FLAGS, make_target, make_tokenizer, write_conversations

from benchmarks.training import train_8b
from benchmarks.training.zlab_draft import write_zlab_draft, zlab_config, zlab_tensor_shapes
from sglang_lilicorr import checkpoint as ckpt
from sglang_lilicorr.cli import main
from sglang_lilicorr.drafter import DFlashDrafter, DrafterConfig, DrafterConfigError, load_draft
from sglang_lilicorr.train.state import draft_geometry, read_training_checkpoint
from test_serving import draft_model_env  # noqa: F401  (fixture: CPU server args for SGLang's draft layers)

PADDED_VOCAB = 8  # the target's embedding rows past its tokenizer's tokens (Qwen3: 151936 rows, 151669 tokens)


def tiny_zlab(vocab: int, **overrides) -> dict:
    """config.json of the lab's tiny drafter in z-lab's layout (2 layers, FFN 48 where the target's is 64: the run
    must take the draft's) for a target of `vocab` rows, its mask id on a row the tokenizer has no token for."""
    return zlab_config(**{**train_8b.TINY["draft"], "vocab_size": vocab, "mask_token_id": vocab - 2, **overrides})


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    from transformers import AutoConfig

    root = tmp_path_factory.mktemp("byo")
    target = make_target(root / "target", "qwen3", extra_rows=PADDED_VOCAB)
    vocab = AutoConfig.from_pretrained(target).vocab_size
    return {
        "target": target,
        "data": write_conversations(root / "train.jsonl", 10),
        "draft": write_zlab_draft(root / "zlab", tiny_zlab(vocab)),
        "vocab": vocab,
        "root": root,
    }


def train_argv(byo, out, *extra, init_from=True) -> list[str]:
    return [
        "train",
        "--target",
        byo["target"],
        "--data",
        byo["data"],
        "--output-dir",
        str(out),
        *(["--init-from", str(byo["draft"])] if init_from else []),
        *TINY_FLAGS,
        "--max-steps",
        "2",
        "--save-every",
        "2",
        "--log-every",
        "2",
        *extra,
    ]


def test_a_zlab_draft_is_read_as_published(byo):
    """Our drafter's tensors are z-lab's names and shapes; the published config gives the geometry, which SGLang's
    own parser reads alike; the weights load strictly, bf16, unchanged."""
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    config = json.loads((byo["draft"] / "config.json").read_text())
    geometry = draft_geometry(byo["draft"])
    assert {k: tuple(v.shape) for k, v in DFlashDrafter(geometry).state_dict().items()} == zlab_tensor_shapes(config)
    assert (geometry.num_hidden_layers, geometry.intermediate_size, geometry.block_size) == (2, 48, 4)
    assert (geometry.target_layer_ids, geometry.mask_token_id) == ((1, 3), byo["vocab"] - 2)
    parsed = parse_dflash_draft_config(draft_hf_config=config)
    assert (parsed.block_size, parsed.target_layer_ids, parsed.mask_token_id) == (4, [1, 3], byo["vocab"] - 2)
    assert parsed.mask_token == geometry.mask_token  # neither config names one: both take the same default
    drafter, head = load_draft(byo["draft"])
    published = load_file(str(byo["draft"] / "model.safetensors"))
    assert head is None and all(torch.equal(drafter.state_dict()[k], v) for k, v in published.items())


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda c: c.update(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
        (lambda c: c.update(is_causal=True), "is_causal"),
        (lambda c: c["dflash_config"].update(conv_kernel_size=2, conv_group_size=16), "conv_kernel_size"),
        (lambda c: c["dflash_config"].update(attention_sink_bias=True), "attention_sink_bias"),
    ],
)
def test_a_dflash_variant_this_drafter_does_not_compute_is_refused_by_name(edit, named):
    config = tiny_zlab(300)
    edit(config)
    with pytest.raises(DrafterConfigError, match=f"declares (dflash_config.)?{named}.*does not implement"):
        DrafterConfig.from_hf_config(config)


def sglang_loads(draft, plugin_model) -> None:
    """Stock SGLang 0.5.23's draft class of the export (its LiLiCorr loader checks coverage) and the LILICORR plugin's
    draft model take every tensor."""
    from test_shipped_checkpoints import stock_sglang_model

    config = ckpt.read_config(draft)
    tensors = load_file(str(draft / ckpt.WEIGHTS_FILE))
    for model in (stock_sglang_model(config["architectures"][0], draft), plugin_model(config)):
        model.load_weights(iter(tensors.items()))
        assert torch.equal(model.fc.weight.to(tensors["fc.weight"].dtype), tensors["fc.weight"])


@pytest.mark.sglang
def test_joint_training_from_a_zlab_draft_takes_its_geometry_and_serves(byo, tmp_path, draft_model_env):  # noqa: F811
    """`--init-from` the published layout as is: the run's drafter is the draft's (its layers, FFN, layer ids, mask
    id, none of them passed), step 0 its weights; the export serves in our loader and stock SGLang."""
    assert main(train_argv(byo, tmp_path / "run")) == 0
    state, _, _, _ = read_training_checkpoint(tmp_path / "run")
    assert DrafterConfig.from_hf_config(state["drafter_config"]) == draft_geometry(byo["draft"])
    assert state["run"]["draft_layers"] == 2 and state["run"]["train"] == "joint"
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "draft")]) == 0
    drafter, head = load_draft(tmp_path / "draft")
    assert head is not None and drafter.config == draft_geometry(byo["draft"])
    assert not torch.equal(drafter.fc.weight, load_draft(byo["draft"])[0].fc.weight)  # joint: the drafter moved
    sglang_loads(tmp_path / "draft", draft_model_env)


@pytest.mark.sglang
def test_head_only_keeps_the_drafter_bit_identical_allocates_it_nothing_and_serves(
    byo,
    tmp_path,
    capsys,
    draft_model_env,  # noqa: F811
):
    from sglang_lilicorr.train.state import OPTIMIZER_FILE, complete_checkpoints

    published = load_file(str(byo["draft"] / "model.safetensors"))
    assert main(train_argv(byo, tmp_path / "run", "--train", "head")) == 0
    state, _, _, tensors = read_training_checkpoint(tmp_path / "run")
    assert state["step"] == 2 and state["run"]["train"] == "head"
    for name, value in published.items():  # bf16 -> fp32 masters, never updated
        assert torch.equal(tensors[name], value.float()), name
    head_tensors = [k for k in tensors if k.startswith(ckpt.HEAD_PREFIX)]
    optimizer = torch.load(complete_checkpoints(tmp_path / "run")[-1] / OPTIMIZER_FILE, weights_only=False)
    groups = optimizer["optimizer"]["param_groups"]
    assert [g["name"] for g in groups] == ["head"]  # no drafter group, no drafter state
    assert len(optimizer["optimizer"]["state"]) == len(groups[0]["params"]) == len(head_tensors) > 0

    assert main(["export", str(tmp_path / "run"), str(tmp_path / "draft")]) == 0
    drafter, head = load_draft(tmp_path / "draft")
    assert head is not None
    assert all(torch.equal(drafter.state_dict()[k], v) for k, v in published.items())  # the published drafter
    sglang_loads(tmp_path / "draft", draft_model_env)
    # resuming it as a joint run is refused by name
    capsys.readouterr()
    assert main(train_argv(byo, tmp_path / "run", "--train", "joint", "--max-steps", "3")) == 2
    assert "cannot resume: this run's ['train'] differ" in capsys.readouterr().err


def test_a_frozen_drafter_builds_no_graph_and_gets_no_gradient(byo):
    """JointModel with a frozen drafter (--train head): its forward keeps no graph, the backward reaches the head and
    stops there."""
    from test_train import TINY

    from sglang_lilicorr.drafter import sample_anchors
    from sglang_lilicorr.frozen_target import FrozenTarget
    from sglang_lilicorr.train.config import TrainConfig
    from sglang_lilicorr.train.data import collate, load_conversations
    from sglang_lilicorr.train.heads import build_head
    from sglang_lilicorr.train.joint import JointModel
    from sglang_lilicorr.train.trainer import build_optimizer, drafter_config_for, load_target

    model, tok = load_target(byo["target"], torch.device("cpu"), bf16=False)
    cfg = TrainConfig(
        **{**TINY, "target": byo["target"], "data": byo["data"], "output_dir": "unused"},
        init_from=str(byo["draft"]),
        train="head",
    )
    dcfg = drafter_config_for(model, tok, cfg)
    drafter = DFlashDrafter(dcfg).requires_grad_(False)
    head = build_head(cfg.head_config(dcfg.block_size, dcfg.rms_norm_eps, dcfg.hidden_size), dcfg)
    joint = JointModel(drafter, head, FrozenTarget(model, dcfg.target_layer_ids))
    assert not joint.trains_drafter
    assert [g["name"] for g in build_optimizer(drafter, head, cfg).param_groups] == ["head"]
    seen = []
    drafter.register_forward_hook(lambda _m, _a, out: seen.append(out.requires_grad))
    batch = collate(load_conversations(byo["data"], tok, 64, {})[:2], tok.pad_token_id)
    anchors, valid = sample_anchors(batch["loss_mask"], 4, torch.Generator().manual_seed(0))
    out = joint(batch["input_ids"], batch["attention_mask"], batch["loss_mask"], anchors, valid, cfg.objective())
    out.terms.total.backward()
    assert seen == [False] and all(p.grad is None for p in drafter.parameters())
    assert all(p.grad is not None for p in head.parameters())  # the backward reaches every head parameter


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--draft-layers", "3"], "--draft-layers 3 differs from the draft's num_hidden_layers 2"),
        (["--draft-intermediate-size", "64"], "--draft-intermediate-size 64 differs"),
    ],
)
def test_a_geometry_option_the_draft_contradicts_is_refused(byo, tmp_path, capsys, extra, named):
    assert main(train_argv(byo, tmp_path / "run", *extra)) == 2
    err = capsys.readouterr().err
    assert named in err and "drop --" in err and not (tmp_path / "run" / "checkpoints").exists()


def test_a_draft_for_another_target_or_tokenizer_is_refused(byo, tmp_path, capsys):
    other = write_zlab_draft(tmp_path / "other", tiny_zlab(byo["vocab"], num_target_layers=8))
    assert main([*train_argv(byo, tmp_path / "a"), "--init-from", str(other)]) == 2
    assert "num_target_layers 8 is not the target's 6" in capsys.readouterr().err
    # a tokenizer that names the draft's mask token with another id (SGLang would refuse to serve the pair)
    masked = tmp_path / "masked"
    make_tokenizer(mask_token="<|MASK|>").save_pretrained(masked)
    for weights in (byo["root"] / "target").glob("*.safetensors"):
        (masked / weights.name).write_bytes(weights.read_bytes())
    (masked / "config.json").write_bytes((byo["root"] / "target" / "config.json").read_bytes())
    assert main([*train_argv(byo, tmp_path / "b"), "--target", str(masked)]) == 2
    assert "mask token '<|MASK|>' is id" in capsys.readouterr().err


def test_head_only_needs_a_drafter_to_start_from_and_a_head(byo, tmp_path, capsys):
    assert main(train_argv(byo, tmp_path / "run", "--train", "head", init_from=False)) == 2
    assert "--train head trains a head on a trained drafter" in capsys.readouterr().err
    assert main(train_argv(byo, tmp_path / "run", "--train", "head", "--head", "none")) == 2
    assert "needs --init-from DRAFT and a head" in capsys.readouterr().err
