"""SGLang's own parser reads the draft config checkpoint.py writes (apart from tests/test_checkpoint.py: importing
SGLang takes seconds, and that file is the one mutation testing of checkpoint.py runs)."""

import json

import pytest
import torch

from sglang_lilicorr import checkpoint as ckpt
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.train.heads import serving_tensors
from test_checkpoint import HEAD_CFG, VANILLA


@pytest.fixture
def saved(tmp_path):
    head = LiLiCorrHead(HEAD_CFG, model_hidden_size=24).to(torch.bfloat16)
    tensors = {"fc.weight": torch.randn(24, 48, dtype=torch.bfloat16), **serving_tensors(head)}
    return ckpt.save_checkpoint(tmp_path / "draft", ckpt.with_head(VANILLA, HEAD_CFG), tensors), head


def test_sglang_parses_our_config(saved):
    utils = pytest.importorskip("sglang.srt.speculative.lilicorr_utils")
    path, _ = saved
    parsed = utils.parse_lilicorr_draft_config(draft_hf_config=json.loads((path / "config.json").read_text()))
    assert (parsed.candidate_topk, parsed.hidden_size, parsed.factor_dim, parsed.logit_scale) == (4, 32, 16, 8.0)
