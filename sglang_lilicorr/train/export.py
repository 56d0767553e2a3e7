"""`lilicorr export`: a training checkpoint -> an SGLang draft directory (config.json +
model.safetensors), reloaded strictly by `drafter.load_draft`.

Without a head the draft is a vanilla `DFlashDraftModel` (serve with --speculative-algorithm
DFLASH); with a LiLiCorr head it declares `LiLiCorrDraftModel` and carries the head under `lilicorr.`; a Domino
or DSpark head is written as stock SGLang serves it (train/heads.py).

Export writes only what it may replace (`check_destination`, the rule of ownership.py): a missing or
empty folder, or an earlier export (config.json + model.safetensors of a draft, nothing else). A folder holding
anything else only with force=True, and then export writes its two files beside what is there and deletes
nothing: it still refuses a folder whose config.json or model.safetensors are not a draft's (a model folder).
Never a training run, a data set or a report of ours, a checkpoint, nor a folder inside one, nor the source or a
folder that contains it, whatever `force` says. A new folder appears whole (one rename); in an existing one each
file is replaced whole (weights, then config). The source's checksums are checked first.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..baselines import DSparkConfig
from ..checkpoint import (
    CONFIG_FILE,
    DTYPES,
    WEIGHTS_FILE,
    CheckpointError,
    architecture_of,
    load_strict,
    save_checkpoint,
    split_head,
    with_head,
    write_checkpoint_files,
)
from ..config import LiLiCorrConfig
from ..ownership import NotOursError, held, marked_kind, remove_temporaries
from ..drafter import DFlashDrafter, DrafterConfig, load_drafter_tensors
from ..errors import UsageError
from .heads import HeadConfig, build_head, serving_tensors
from .state import LATEST, STATE_FILE, read_training_checkpoint

METRICS_FILE = "metrics.jsonl"  # the training log beside `latest` and checkpoints/


def is_training_output(folder: Path) -> bool:
    """A training run (its marker, `latest`, metrics.jsonl or checkpoints/step-*) or one of its checkpoints."""
    return (
        marked_kind(folder) == "run"
        or (folder / LATEST).is_file()
        or (folder / METRICS_FILE).is_file()
        or (folder / STATE_FILE).is_file()
        or any((folder / "checkpoints").glob("step-*"))
    )


def is_draft_config(path: Path) -> bool:
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
        if DSparkConfig.of_serving_config(config) is None:
            architecture_of(config)
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, not an object, not a draft's architectures
        return False
    return True


def is_earlier_export(folder: Path) -> bool:
    """Exactly config.json + model.safetensors, the config a draft's."""
    return set(held(folder)) == {CONFIG_FILE, WEIGHTS_FILE} and is_draft_config(folder / CONFIG_FILE)


def check_destination(out_dir: str | Path, source: str | Path, force: bool = False) -> str:
    """Raises UsageError unless export may write out_dir (see the module docstring) -> "new" (it does not exist)
    or "existing" (write the two files into it)."""
    out, src = Path(out_dir).resolve(), Path(source).resolve()
    if out == src or out in src.parents:
        raise UsageError(
            f"{out_dir} is or contains the checkpoint being exported ({source})",
            where="OUT_DIR",
            fix="write the draft to a folder outside the training run",
        )
    inside = next((p for p in (out, *out.parents) if p.is_dir() and is_training_output(p)), None)
    if inside is not None:
        raise NotOursError(
            f"{out_dir} is a training run or checkpoint"
            if inside == out
            else f"{out_dir} is inside a training run or checkpoint, {inside}",
            where="OUT_DIR",
            fix="write the draft to a folder outside any training run (--force does not change this)",
        )
    if not out.exists():
        return "new"
    if not out.is_dir():
        raise NotOursError(f"{out_dir} is a file", where="OUT_DIR", fix="pass a folder path for the draft")
    kind = marked_kind(out)
    if kind is not None:
        raise NotOursError(
            f"{out_dir} is a {kind} folder written by lilicorr, not a draft",
            where="OUT_DIR",
            fix="pick a new or empty folder (--force does not change this)",
        )
    if not held(out) or is_earlier_export(out):
        return "existing"
    if not force:
        raise NotOursError(
            f"{out_dir} is not empty and is not an earlier export, it holds {held(out)[:5]}",
            where="OUT_DIR",
            fix="pick a new or empty folder, or pass --force to write the draft's config.json and "
            "model.safetensors beside those files (--force deletes nothing)",
        )
    foreign = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if (out / n).exists()]
    if foreign and not is_draft_config(out / CONFIG_FILE):
        raise NotOursError(
            f"{out_dir} holds a {' and '.join(foreign)} that is not a draft's (a model folder?)",
            where="OUT_DIR",
            fix="pick a new or empty folder; --force never replaces files that are not a draft's",
        )
    return "existing"


def check_source(source: str | Path) -> None:
    """CHECKPOINT must name a training run or one of its checkpoints (an argument that cannot work otherwise: exit 2;
    a damaged one is a CheckpointError, exit 1, when it is read)."""
    src = Path(source)
    if not ((src / LATEST).is_file() or (src / STATE_FILE).is_file()):
        found = (
            "not an existing folder"
            if not src.is_dir()
            else "a draft, not a training run"
            if is_draft_config(src / CONFIG_FILE)
            else "not a training run or checkpoint"
        )
        raise UsageError(
            f"{str(source)!r} is {found}",
            where="CHECKPOINT",
            fix="pass a `lilicorr train` --output-dir (its latest checkpoint) or OUTPUT/checkpoints/step-N",
        )


def draft_config(drafter: DrafterConfig, head: HeadConfig | None, dtype: str) -> dict:
    config = drafter.to_hf_config()
    config["torch_dtype"] = dtype
    if head is None:
        return config
    return with_head(config, head) if isinstance(head, LiLiCorrConfig) else head.serving_config(config)


def export_checkpoint(source: str | Path, out_dir: str | Path, dtype: str = "bfloat16", force: bool = False) -> Path:
    """Training checkpoint (OUTPUT or OUTPUT/checkpoints/step-N) -> draft directory."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not a draft dtype", fix=f"choose one of {sorted(DTYPES)}")
    check_source(source)
    where = check_destination(out_dir, source, force)
    _, drafter_cfg, head_cfg, tensors = read_training_checkpoint(source)
    drafter_t, head_t = split_head(tensors)
    drafter = DFlashDrafter(drafter_cfg)
    load_drafter_tensors(drafter, drafter_t, f"{source} (drafter)")
    out = {k: v.to(DTYPES[dtype]) for k, v in drafter.state_dict().items()}
    if head_cfg is not None:
        # strict, as for the drafter: a missing, extra or mis-shaped head tensor is a CheckpointError naming it
        head = load_strict(build_head(head_cfg, drafter_cfg), head_t, f"{source} (head)")
        out.update({k: v.to(DTYPES[dtype]) for k, v in serving_tensors(head).items()})
    elif head_t:
        raise CheckpointError(f"{source}: holds head tensors but no head config; the checkpoint is inconsistent.")
    config = draft_config(drafter_cfg, head_cfg, dtype)
    final = Path(out_dir).resolve()
    if where == "new":
        remove_temporaries(final.parent, of=final.name)  # what a killed export of this folder left beside it
        return save_checkpoint(final, config, out)
    remove_temporaries(final)
    write_checkpoint_files(final, config, out)
    return final
