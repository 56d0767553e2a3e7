"""Checkpoint format: SGLang's LiLiCorrDraftModel layout, saved atomically, loaded strictly."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_lilicorr import checkpoint as ckpt
from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.head import LiLiCorrHead

HEAD_CFG = LiLiCorrConfig(block_size=6, candidate_topk=4, factor_dim=16, hidden_size=32, num_heads=4)
VANILLA = {
    "architectures": [ckpt.VANILLA_ARCH], "model_type": "qwen3", "hidden_size": 24, "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16", "block_size": 6,
    "dflash_config": {"block_size": 6, "target_layer_ids": [1, 3], "mask_token_id": 5},
}


@pytest.fixture
def saved(tmp_path):
    head = LiLiCorrHead(HEAD_CFG, model_hidden_size=24).to(torch.bfloat16)
    tensors = {"fc.weight": torch.randn(24, 48, dtype=torch.bfloat16), **ckpt.head_tensors_for_save(head)}
    path = ckpt.save_checkpoint(tmp_path / "draft", ckpt.with_head(VANILLA, HEAD_CFG), tensors)
    return path, head


def test_round_trip_is_exact(saved):
    path, head = saved
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LiLiCorrDraftModel"]
    assert config["dflash_config"]["lilicorr_candidate_topk"] == 4 and config["dflash_config"]["target_layer_ids"] == [1, 3]
    loaded = ckpt.load_head(path)
    for name, t in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    assert "fc.weight" in load_file(str(path / "model.safetensors"))
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_sglang_parses_our_config(saved):
    utils = pytest.importorskip("sglang.srt.speculative.lilicorr_utils")
    path, _ = saved
    parsed = utils.parse_lilicorr_draft_config(draft_hf_config=json.loads((path / "config.json").read_text()))
    assert (parsed.candidate_topk, parsed.hidden_size, parsed.factor_dim, parsed.logit_scale) == (4, 32, 16, 8.0)


def rewrite(path, mutate):
    tensors = load_file(str(path / "model.safetensors"))
    mutate(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda t: t.pop("lilicorr.in_head.weight"), "missing tensor 'in_head.weight'"),
        (lambda t: t.__setitem__("lilicorr.extra.weight", torch.zeros(2, dtype=torch.bfloat16)), "unexpected tensor 'extra.weight'"),
        (lambda t: t.__setitem__("lilicorr.out_head.bias", torch.zeros(15, dtype=torch.bfloat16)), r"'out_head.bias' has shape \(15,\), expected \(16,\)"),
        (lambda t: t.__setitem__("lilicorr.out_head.bias", torch.zeros(16)), "'out_head.bias' has dtype torch.float32"),
        (lambda t: t.__setitem__("lilicorr.same_slot_bias", torch.full((4,), float("nan"), dtype=torch.bfloat16)), "'same_slot_bias' holds NaN"),
    ],
)
def test_strict_load_names_the_bad_tensor(saved, mutate, message):
    path, _ = saved
    rewrite(path, mutate)
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.load_head(path)


def test_bad_files_and_fields(saved, tmp_path):
    path, _ = saved
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load_head(tmp_path / "nowhere")
    (path / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        ckpt.load_head(path)
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"]["lilicorr_candidate_topk"] = 6
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ckpt.CheckpointError, match="candidate_topk=6"):
        ckpt.load_head(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="not valid JSON"):
        ckpt.load_head(path)


def test_vanilla_draft_has_no_head(tmp_path):
    ckpt.save_checkpoint(tmp_path / "v", VANILLA, {"fc.weight": torch.zeros(24, 48, dtype=torch.bfloat16)})
    with pytest.raises(ckpt.CheckpointError, match="--speculative-algorithm DFLASH"):
        ckpt.load_head(tmp_path / "v")


def test_save_refuses_non_finite_and_leaves_nothing(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="NaN or Inf"):
        ckpt.save_checkpoint(tmp_path / "bad", VANILLA, {"fc.weight": torch.tensor([float("inf")])})
    assert not list(tmp_path.iterdir())


def test_block_size_mismatch_between_head_and_drafter():
    with pytest.raises(ckpt.CheckpointError, match="block_size"):
        ckpt.with_head(VANILLA, LiLiCorrConfig(block_size=16, candidate_topk=4, hidden_size=32, num_heads=4))


def test_vanilla_copy_keeps_the_drafter_and_drops_the_head(saved, tmp_path):
    path, _ = saved
    out = ckpt.vanilla_copy(path, tmp_path / "vanilla")
    config = ckpt.read_config(out)
    assert config["architectures"] == [ckpt.VANILLA_ARCH] and not ckpt.has_head(config)
    assert not [k for k in config["dflash_config"] if k.startswith("lilicorr_")]
    assert config["dflash_config"]["target_layer_ids"] == [1, 3]
    assert set(load_file(str(out / "model.safetensors"))) == {"fc.weight"}
