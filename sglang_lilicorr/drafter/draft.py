"""An exported draft directory loaded strictly: the DFlash drafter and, for a LiLiCorrDraftModel, its head."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint import CheckpointError, dtype_of, has_head, load_strict, new_head, read_config, read_tensors
from ..checkpoint import REEXPORT, split_head
from ..head import LiLiCorrHead
from .config import DrafterConfig
from .model import DFlashDrafter


def load_draft(directory: str | Path) -> tuple[DFlashDrafter, LiLiCorrHead | None]:
    """Strict reload of an exported draft: every tensor present with the config's shapes and dtype."""
    config = read_config(directory)
    drafter_t, head_t = split_head(read_tensors(directory))
    try:  # a config field that is missing or out of range: named with the file that holds it
        dtype = dtype_of(config)
        drafter = DFlashDrafter(DrafterConfig.from_hf_config(config)).to(dtype)
        head = new_head(config) if has_head(config) else None
    except CheckpointError as e:
        raise e.located(str(Path(directory) / "config.json")) from e
    where = f"{Path(directory) / 'model.safetensors'}"
    load_strict(drafter, drafter_t, f"{where} (drafter)", dtype)
    if head is not None:
        return drafter, load_strict(head, head_t, f"{where} (head)")
    if head_t:
        raise CheckpointError(
            "has `lilicorr.` tensors but config.json declares no LiLiCorrDraftModel", where=where, fix=REEXPORT
        )
    return drafter, None
