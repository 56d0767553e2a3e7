"""`lilicorr export`: a training checkpoint -> an SGLang draft directory (config.json +
model.safetensors), reloaded strictly by `drafter.load_draft`.

Without a head the draft is a vanilla `DFlashDraftModel` (serve with --speculative-algorithm
DFLASH); with one it declares `LiLiCorrDraftModel` and carries the head under `lilicorr.`.
"""
from __future__ import annotations

from pathlib import Path

from ..checkpoint import CheckpointError, DTYPES, head_tensors_for_save, save_checkpoint, split_head, with_head
from ..drafter import DFlashDrafter, DrafterConfig, load_drafter_tensors
from ..head import LiLiCorrHead
from .state import read_training_checkpoint


def draft_config(drafter: DrafterConfig, head, dtype: str) -> dict:
    config = drafter.to_hf_config()
    config["torch_dtype"] = dtype
    return config if head is None else with_head(config, head)


def export_checkpoint(source: str | Path, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    """Training checkpoint (OUTPUT or OUTPUT/checkpoints/step-N) -> draft directory."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {sorted(DTYPES)}.")
    _, drafter_cfg, head_cfg, tensors = read_training_checkpoint(source)
    drafter_t, head_t = split_head(tensors)
    drafter = DFlashDrafter(drafter_cfg)
    load_drafter_tensors(drafter, drafter_t, f"{source} (drafter)")
    out = {k: v.to(DTYPES[dtype]) for k, v in drafter.state_dict().items()}
    if head_cfg is not None:
        head = LiLiCorrHead(head_cfg, drafter_cfg.hidden_size)
        head.load_state_dict(head_t, strict=True)
        out.update({k: v.to(DTYPES[dtype]) for k, v in head_tensors_for_save(head).items()})
    elif head_t:
        raise CheckpointError(f"{source}: holds head tensors but no head config; the checkpoint is inconsistent.")
    return save_checkpoint(out_dir, draft_config(drafter_cfg, head_cfg, dtype), out)
