"""A draft's LiLiCorr head alone, reloaded strictly from its folder (the product reads a draft whole: load_draft)."""

from __future__ import annotations

import os
from pathlib import Path

from sglang_lilicorr.checkpoint import WEIGHTS_FILE, load_strict, new_head, read_config, read_tensors, split_head
from sglang_lilicorr.head import LiLiCorrHead


def load_head(directory: str | os.PathLike) -> LiLiCorrHead:
    config = read_config(directory)
    head = new_head(config)  # the config is validated before any tensor is read
    _, head_tensors = split_head(read_tensors(directory))
    return load_strict(head, head_tensors, f"{Path(directory) / WEIGHTS_FILE} (head)")
