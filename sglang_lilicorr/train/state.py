"""Training checkpoints (resumable) and their strict reload.

  OUTPUT/checkpoints/step-XXXXXXXX/
      train_state.json       step, epoch position, drafter config (SGLang config.json form),
                             head geometry (dflash `lilicorr_*` keys or null)
      trainable.safetensors  drafter tensors (fp32 masters) and the head under `lilicorr.`
      optimizer.pt           optimizer + LR schedule state
  OUTPUT/latest              name of the newest complete checkpoint

Every directory is written under a temporary name and renamed when complete; `latest` is
replaced atomically after it, so an interrupted save never looks like a checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file, save_file

from ..checkpoint import HEAD_PREFIX, CheckpointError, atomic_directory
from ..config import LiLiCorrConfig
from ..drafter import DrafterConfig

STATE_FILE, TENSORS_FILE, OPTIMIZER_FILE, LATEST = "train_state.json", "trainable.safetensors", "optimizer.pt", "latest"
FORMAT = "lilicorr-train-v1"


class IncompatibleCheckpointError(CheckpointError):
    """A training checkpoint does not match the run that tries to resume from it."""


def head_config_from_keys(keys: Mapping[str, Any] | None, drafter: DrafterConfig) -> LiLiCorrConfig | None:
    if keys is None:
        return None
    return LiLiCorrConfig.from_dflash_config(keys, block_size=drafter.block_size, rms_norm_eps=drafter.rms_norm_eps)


def save_training_checkpoint(
    output_dir: str | Path,
    step: int,
    progress: Mapping[str, int],
    drafter_config: DrafterConfig,
    head_config: LiLiCorrConfig | None,
    tensors: Mapping[str, torch.Tensor],
    optimizer_state: Mapping[str, Any],
) -> Path:
    final = Path(output_dir) / "checkpoints" / f"step-{step:08d}"
    with atomic_directory(final) as tmp:
        state = {
            "format": FORMAT, "step": step, "progress": dict(progress),
            "drafter_config": drafter_config.to_hf_config(),
            "head_config": None if head_config is None else head_config.to_dflash_keys(),
        }
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        save_file({k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}, str(tmp / TENSORS_FILE))
        torch.save(dict(optimizer_state), tmp / OPTIMIZER_FILE)
    pointer = Path(output_dir) / LATEST
    pointer_tmp = pointer.with_name(f".{LATEST}.tmp")
    pointer_tmp.write_text(final.name + "\n")
    os.replace(pointer_tmp, pointer)
    return final


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    pointer = Path(output_dir) / LATEST
    if not pointer.is_file():
        return None
    path = Path(output_dir) / "checkpoints" / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(f"{pointer} names {path}, which is not a complete training checkpoint; delete {pointer} to start over.")
    return path


def read_training_checkpoint(path: str | Path) -> tuple[dict[str, Any], DrafterConfig, LiLiCorrConfig | None, dict[str, torch.Tensor]]:
    """-> (state json, drafter config, head config or None, tensors)."""
    path = Path(path)
    if (path / LATEST).is_file() and not (path / STATE_FILE).is_file():
        path = latest_checkpoint(path)
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a training checkpoint ({e}); pass OUTPUT or OUTPUT/checkpoints/step-N.") from e
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path / STATE_FILE}: format {state.get('format')!r}, expected {FORMAT!r}.")
    drafter = DrafterConfig.from_hf_config(state["drafter_config"])
    head = head_config_from_keys(state["head_config"], drafter)
    try:
        tensors = load_file(str(path / TENSORS_FILE))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path / TENSORS_FILE}: unreadable ({e}).") from e
    return state, drafter, head, tensors


def check_resume_compatible(state: Mapping[str, Any], drafter: DrafterConfig, head: LiLiCorrConfig | None, where: str) -> None:
    saved_d = DrafterConfig.from_hf_config(state["drafter_config"])
    if saved_d != drafter:
        diff = [f.name for f in dataclasses.fields(drafter) if getattr(saved_d, f.name) != getattr(drafter, f.name)]
        raise IncompatibleCheckpointError(
            f"{where}: cannot resume, the drafter differs in {diff} (checkpoint "
            f"{[getattr(saved_d, n) for n in diff]} vs this run {[getattr(drafter, n) for n in diff]}); "
            "use the same settings or a new --output-dir."
        )
    saved_h = state["head_config"]
    run_h = None if head is None else head.to_dflash_keys()
    if saved_h != run_h:
        raise IncompatibleCheckpointError(
            f"{where}: cannot resume, the LiLiCorr head differs (checkpoint {saved_h}, this run {run_h}); "
            "gamma > 0 needs the same head geometry, gamma = 0 has none. Use a new --output-dir."
        )


def trainable_tensors(drafter_state: Mapping[str, torch.Tensor], head_state: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    out = dict(drafter_state)
    if head_state is not None:
        out.update({HEAD_PREFIX + k: v for k, v in head_state.items()})
    return out
