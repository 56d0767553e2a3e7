"""`lilicorr export`: a training checkpoint -> an SGLang draft folder (config.json + model.safetensors): a vanilla
`DFlashDraftModel` without a head, a `LiLiCorrDraftModel` with one, a Domino or DSpark head as stock SGLang serves it.

Export writes a new or empty folder or an earlier export; with --force a folder of other files, which are kept. Never a
run, data set or report of ours, a checkpoint, the source, the current folder or a folder holding one of them, nor a
mount point. The draft replaces the folder in one rename (ownership.atomic_directory), one export at a time."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from ..baselines import DSparkConfig
from ..checkpoint import CONFIG_FILE, DTYPES, WEIGHTS_FILE, architecture_of, save_checkpoint, with_head
from ..config import LiLiCorrConfig
from ..ownership import NotOursError, held, marked_kind, remove_temporaries, sole_writer, space_for
from ..drafter import DFlashDrafter, DrafterConfig
from ..errors import UsageError
from ..jsonl import loads
from .heads import HeadConfig, build_head, serving_tensors
from .state import LATEST, STATE_FILE, complete_checkpoints, load_trainable, read_training_checkpoint

METRICS_FILE = "metrics.jsonl"  # the training log beside `latest` and checkpoints/


def is_training_output(folder: Path) -> bool:
    """A training run (its marker, `latest`, metrics.jsonl or checkpoints/step-*) or one of its checkpoints."""
    files = (folder / LATEST, folder / METRICS_FILE, folder / STATE_FILE)
    return (
        marked_kind(folder) == "run" or any(f.is_file() for f in files) or any((folder / "checkpoints").glob("step-*"))
    )


def is_draft_config(path: Path) -> bool:
    try:
        config = loads(path.read_bytes().decode("utf-8"))
        if DSparkConfig.of_serving_config(config) is None:
            architecture_of(config)
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, not an object, not a draft's architectures
        return False
    return True


def is_earlier_export(folder: Path) -> bool:
    """Exactly config.json + model.safetensors, the config a draft's, the weights a file."""
    return (
        set(held(folder)) == {CONFIG_FILE, WEIGHTS_FILE}
        and is_draft_config(folder / CONFIG_FILE)
        and (folder / WEIGHTS_FILE).is_file()
    )


def check_destination(out_dir: str | Path, source: str | Path, force: bool = False) -> str:
    """Whether export may write out_dir: "new", "replace" (empty, earlier export), "keep" (`force`); else UsageError."""
    if not str(out_dir).strip():
        raise UsageError("OUT_DIR is empty", where="OUT_DIR", fix="pass the folder the draft goes to, e.g. my-draft")
    out, src = Path(out_dir).resolve(), Path(source).resolve()
    blocking = next((p for p in (out, *out.parents) if p.exists()), None)
    if blocking is not None and blocking != out and not blocking.is_dir():
        raise NotOursError(
            f"{blocking} is a file, so {out_dir} cannot be a folder", where="OUT_DIR", fix="pass a folder path"
        )
    if out == src or out in src.parents:
        raise UsageError(
            f"{out_dir} is or contains the checkpoint being exported ({source})",
            where="OUT_DIR",
            fix="write the draft to a folder outside the training run",
        )
    inside = next((p for p in (out, *out.parents) if p.is_dir() and is_training_output(p)), None)
    if inside is not None:
        what = (
            "is a training run or checkpoint" if inside == out else f"is inside a training run or checkpoint, {inside}"
        )
        raise NotOursError(
            f"{out_dir} {what}",
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
    here = Path.cwd().resolve()
    if out == here or out in here.parents:
        raise UsageError(
            f"{out_dir} is {'the current folder' if out == here else 'a folder that holds the current one'}, which "
            "an export replaces with a new folder (your shell would stay in the old one)",
            where="OUT_DIR",
            fix=f"pass it from outside: cd {shlex.quote(str(out.parent))} and export to {shlex.quote(out.name)}",
        )
    if os.path.ismount(out):
        raise UsageError(
            f"{out_dir} is a mount point, which an export cannot replace with a new folder",
            where="OUT_DIR",
            fix="write the draft to a folder inside it",
        )
    if not held(out) or is_earlier_export(out):
        return "replace"
    if not force:
        raise NotOursError(
            f"{out_dir} is not empty and is not an earlier export, it holds {held(out)[:5]}",
            where="OUT_DIR",
            fix="pick a new or empty folder, or pass --force to write the draft's config.json and "
            "model.safetensors beside those files (--force keeps them as they are)",
        )
    foreign = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if os.path.lexists(out / n)]
    if foreign and (not is_draft_config(out / CONFIG_FILE) or (out / WEIGHTS_FILE).is_dir()):
        raise NotOursError(
            f"{out_dir} holds a {' and '.join(foreign)} that is not a draft's (a model folder?)",
            where="OUT_DIR",
            fix="pick a new or empty folder; --force never replaces files that are not a draft's",
        )
    return "keep"


def check_source(source: str | Path) -> None:
    """CHECKPOINT names a run with a complete checkpoint or one of its checkpoints, else UsageError (exit 2)."""
    src = Path(source)
    if not ((src / LATEST).is_file() or (src / STATE_FILE).is_file() or complete_checkpoints(src)):
        found = "not a training run or checkpoint"
        if not src.is_dir():
            found = "not an existing folder"
        elif is_draft_config(src / CONFIG_FILE):
            found = "a draft, not a training run"
        elif marked_kind(src) == "run":
            found = "a training run without a complete checkpoint yet"
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


def export_checkpoint(
    source: str | Path, out_dir: str | Path, dtype: str = "bfloat16", force: bool = False, legacy: bool = False
) -> Path:
    """Training checkpoint (OUTPUT or OUTPUT/checkpoints/step-N) -> draft directory. `legacy`: unchecksummed, warned."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not a draft dtype", fix=f"choose one of {sorted(DTYPES)}")
    check_source(source)
    check_destination(out_dir, source, force)
    with sole_writer(out_dir, "OUT_DIR", "draft"):
        config, tensors = draft_of(source, dtype, legacy)
        final = Path(out_dir).resolve()
        with space_for(final, sum(t.nbytes for t in tensors.values()), "OUT_DIR"):
            remove_temporaries(final.parent, of=final.name)  # what a killed export of this folder left beside it
            return save_checkpoint(final, config, tensors, keep_others=True)


def draft_of(source: str | Path, dtype: str, legacy: bool) -> tuple[dict, dict]:
    """A training checkpoint's draft -> (config.json, tensors in `dtype`), each checked as a resume checks it."""
    _, drafter_cfg, head_cfg, tensors = read_training_checkpoint(source, legacy)
    drafter, head = DFlashDrafter(drafter_cfg), build_head(head_cfg, drafter_cfg)
    load_trainable(tensors, drafter, head, str(source))
    out = dict(drafter.state_dict()) if head is None else {**drafter.state_dict(), **serving_tensors(head)}
    return draft_config(drafter_cfg, head_cfg, dtype), {k: v.to(DTYPES[dtype]) for k, v in out.items()}
