"""The shipped SmolLM2 drafts (checkpoints/) load strictly in our loaders, in the LILICORR plugin's draft
model, and in stock SGLang 0.5.23's own draft classes (DFlashDraftModel, LiLiCorrDraftModel)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draft_heads import load_head
from sglang_lilicorr import checkpoint as ckpt
from sglang_lilicorr.drafter import load_draft
from test_serving import draft_model_env  # noqa: F401  (fixture: CPU server args for SGLang's draft layers)

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
LILICORR, DFLASH = CHECKPOINTS / "smollm2-lilicorr", CHECKPOINTS / "smollm2-dflash"


def stock_sglang_model(arch: str, folder: Path):
    from transformers import AutoConfig

    if arch == ckpt.LILICORR_ARCH:
        from sglang.srt.models.lilicorr import LiLiCorrDraftModel as model_class
    else:
        from sglang.srt.models.dflash import DFlashDraftModel as model_class
    return model_class(AutoConfig.from_pretrained(folder))


def test_our_loaders_take_both_drafts_strictly():
    drafter, head = load_draft(LILICORR)
    assert head is not None and head.config.candidate_topk == 8 and head.config.block_size == 16
    drafter, head = load_draft(DFLASH)
    assert head is None
    assert load_head(LILICORR).width == 256


@pytest.mark.sglang
@pytest.mark.parametrize("folder", [LILICORR, DFLASH], ids=["lilicorr", "dflash"])
def test_stock_sglang_draft_classes_load_every_tensor(draft_model_env, folder):  # noqa: F811
    config = ckpt.read_config(folder)
    model = stock_sglang_model(config["architectures"][0], folder)
    tensors = load_file(str(folder / ckpt.WEIGHTS_FILE))
    model.load_weights(iter(tensors.items()))  # SGLang's LiLiCorr loader checks head coverage itself
    assert torch.equal(model.fc.weight.to(tensors["fc.weight"].dtype), tensors["fc.weight"])
    if ckpt.has_head(config):
        head = load_head(folder)
        for name, value in head.state_dict().items():
            assert torch.equal(model.lilicorr.state_dict()[name].to(value.dtype), value), name


@pytest.mark.sglang
def test_plugin_draft_model_loads_the_shipped_lilicorr_draft(draft_model_env):  # noqa: F811
    model = draft_model_env(ckpt.read_config(LILICORR))
    model.load_weights(iter(load_file(str(LILICORR / ckpt.WEIGHTS_FILE)).items()))
    assert model.lilicorr_head.config.factor_dim == 256
