"""The heads `lilicorr train --head` trains (a checkpoint keeps their tensors under `lilicorr.`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from ..baselines import DominoConfig, DominoHead, DSparkConfig, DSparkHead, corrector_config_from_keys
from ..checkpoint import CONFIG_FILE, HEAD_PREFIX, REEXPORT, WEIGHTS_FILE, CheckpointError, dtype_of, load_strict
from ..checkpoint import read_tensors
from ..config import ConfigError, LiLiCorrConfig
from ..drafter import DFlashDrafter, DrafterConfig, load_draft
from ..head import LiLiCorrHead
from ..jsonl import loads

HEADS = ("lilicorr", "domino", "dspark", "none")
HeadConfig = LiLiCorrConfig | DominoConfig | DSparkConfig
Head = LiLiCorrHead | DominoHead | DSparkHead


def build_head(config: HeadConfig | None, drafter: DrafterConfig) -> Head | None:
    if config is None:
        return None
    if isinstance(config, LiLiCorrConfig):
        return LiLiCorrHead(config, drafter.hidden_size)
    cls = DominoHead if isinstance(config, DominoConfig) else DSparkHead
    return cls(config, drafter.hidden_size, drafter.vocab_size)


def head_keys(config: HeadConfig | None) -> dict[str, Any] | None:
    """What a training checkpoint records of the head: LiLiCorr's `lilicorr_*` keys, a baseline's `to_keys()`, None."""
    if config is None:
        return None
    return config.to_dflash_keys() if isinstance(config, LiLiCorrConfig) else config.to_keys()


def head_config_from_keys(keys: Mapping[str, Any] | None, drafter: DrafterConfig) -> HeadConfig | None:
    if keys is None:
        return None
    return corrector_config_from_keys(keys) or LiLiCorrConfig.from_dflash_config(
        keys, block_size=drafter.block_size, rms_norm_eps=drafter.rms_norm_eps
    )


def serving_tensors(head: Head) -> dict[str, torch.Tensor]:
    """The head's tensors under the names SGLang loads them by."""
    prefix = HEAD_PREFIX if isinstance(head, LiLiCorrHead) else ""
    return {prefix + k: v for k, v in head.state_dict().items()}


def corrector_draft_config(
    directory: str | Path,
) -> tuple[DrafterConfig, DominoConfig | DSparkConfig, torch.dtype] | None:
    """An exported Domino or DSpark draft's config.json -> (drafter config, head config, dtype), else None."""
    try:
        raw = loads((Path(directory) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("dflash_config"), dict):
        return None
    try:
        dspark = DSparkConfig.of_serving_config(raw)
        head_cfg = dspark or DominoConfig.of_serving_config(raw)
    except ConfigError as e:
        raise CheckpointError(f"draft config: {e}", where=str(Path(directory) / CONFIG_FILE), fix=REEXPORT) from e
    if head_cfg is None:
        return None
    config = DSparkConfig.drafter_config(raw) if dspark else raw
    return DrafterConfig.from_hf_config(config), head_cfg, dtype_of(config)


def read_corrector_draft(directory: str | Path) -> tuple[DrafterConfig, DominoConfig | DSparkConfig, dict, dict] | None:
    """An exported Domino or DSpark draft -> (drafter config, head config, drafter tensors, head tensors); else None."""
    found = corrector_draft_config(directory)
    if found is None:
        return None
    drafter_cfg, head_cfg, dtype = found
    tensors = read_tensors(directory)
    bad = [k for k, v in tensors.items() if v.dtype != dtype]
    if bad:
        raise CheckpointError(
            f"tensor {bad[0]!r} is {tensors[bad[0]].dtype}, config torch_dtype says {dtype}",
            where=str(Path(directory) / WEIGHTS_FILE),
            fix=REEXPORT,
        )
    names = set(build_head(head_cfg, drafter_cfg).state_dict())
    head_t = {k: v for k, v in tensors.items() if k in names}
    return drafter_cfg, head_cfg, {k: v for k, v in tensors.items() if k not in names}, head_t


def load_corrector_draft(directory: str | Path) -> tuple[DFlashDrafter, DominoHead | DSparkHead]:
    """Strict reload of an exported Domino or DSpark draft: every tensor present, shaped as its config says."""
    found = read_corrector_draft(directory)
    if found is None:
        raise CheckpointError(
            "not a Domino or DSpark draft", where=str(directory), fix="read it with drafter.load_draft"
        )
    drafter_cfg, head_cfg, drafter_t, head_t = found
    dtype = next(iter(drafter_t.values())).dtype
    drafter = DFlashDrafter(drafter_cfg).to(dtype)
    where = str(Path(directory) / WEIGHTS_FILE)
    load_strict(drafter, drafter_t, f"{where} (drafter)")
    return drafter, load_strict(build_head(head_cfg, drafter_cfg).to(dtype), head_t, f"{where} (head)")


def load_exported_draft(directory: str | Path) -> tuple[DFlashDrafter, Head | None]:
    """Strict reload of any export: a Domino or DSpark draft with its corrector, else drafter.load_draft's."""
    return load_corrector_draft(directory) if read_corrector_draft(directory) is not None else load_draft(directory)
