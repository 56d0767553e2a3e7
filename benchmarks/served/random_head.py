"""Give a DFlash draft a randomly initialised LiLiCorr head, for smoke tests of the serving path
(no draft token is expected to be accepted: it exercises the plumbing, not the speed-up); `vanilla_copy` takes the
head off again.

  python -m benchmarks random-head DFLASH_DRAFT_DIR OUT_DIR [--seed 0]   (with sglang_lilicorr installed)
                [--topk 8] [--head-hidden 1024] [--layers 2] [--heads 8] [--factor-dim 1024]

Writes OUT_DIR in SGLang's LiLiCorrDraftModel format (add_random_head): the
drafter's tensors unchanged, the head under `lilicorr.`, config.json with architectures
["LiLiCorrDraftModel"] and the lilicorr_* keys.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from sglang_lilicorr.checkpoint import VANILLA_ARCH, block_size_of, dtype_of, read_config
from sglang_lilicorr.checkpoint import read_tensors, save_checkpoint, split_head, with_head
from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.train.heads import serving_tensors


def add_random_head(
    source: str | os.PathLike, target: str | os.PathLike, *, seed: int = 0, **geometry
) -> LiLiCorrConfig:
    """`target` = the DFlash draft at `source` with a random LiLiCorr head of `geometry` (LiLiCorrConfig fields):
    a checkpoint to time and smoke-test the serving path."""
    config = read_config(source)
    head_config = LiLiCorrConfig(
        block_size=block_size_of(config), rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), **geometry
    )
    torch.manual_seed(seed)
    head = LiLiCorrHead(head_config, model_hidden_size=int(config["hidden_size"])).to(dtype_of(config))
    drafter, _ = split_head(read_tensors(source))
    save_checkpoint(target, with_head(config, head_config), {**drafter, **serving_tensors(head)})
    return head_config


def vanilla_copy(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """The same drafter without its head: a DFlashDraftModel checkpoint (served by DFLASH beside LILICORR)."""
    config = read_config(source)
    drafter, _ = split_head(read_tensors(source))
    config["architectures"] = [VANILLA_ARCH]
    config["dflash_config"] = {k: v for k, v in config["dflash_config"].items() if not k.startswith("lilicorr_")}
    return save_checkpoint(target, config, drafter)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--head-hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--factor-dim", type=int, default=1024)
    a = p.parse_args(argv)
    cfg = add_random_head(
        a.src,
        a.out,
        seed=a.seed,
        candidate_topk=a.topk,
        hidden_size=a.head_hidden,
        num_layers=a.layers,
        num_heads=a.heads,
        factor_dim=a.factor_dim,
    )
    print(f"random LiLiCorr draft -> {a.out}: {cfg}")
