"""Training checkpoints and the run's files: checkpoints/step-XXXXXXXX/ (train_state.json, trainable.safetensors with
fp32 tensors, optimizer.pt; checksummed), `latest`, snapshots/ (bf16) and metrics.jsonl, each written under a temporary
name and renamed whole, `latest` last. Resume removes a kill's temporaries, falls back to the newest checkpoint that
loads, and drops metrics rows past it; unchecksummed checkpoints load only with `legacy`."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

import torch

from ..checkpoint import CONFIG_FILE, HEAD_PREFIX, WEIGHTS_FILE, LEGACY_FLAG, CheckpointError, UncheckedError
from ..checkpoint import atomic_directory, dtype_of, has_head, lilicorr_config, load_strict, load_tensors, read_config
from ..checkpoint import read_tensors, save_tensors, split_head
from ..jsonl import loads
from ..ownership import remove_temporaries, write_atomic
from ..drafter import DrafterConfig
from .heads import HeadConfig, corrector_draft_config, head_config_from_keys, head_keys, read_corrector_draft

STATE_FILE, TENSORS_FILE, OPTIMIZER_FILE, LATEST = "train_state.json", "trainable.safetensors", "optimizer.pt", "latest"
FORMAT = "lilicorr-train-v1"
EARLIER = "use an earlier checkpoint"
# how a run in a folder makes way for a new one (it is never deleted)
START_OVER = (
    "pass --no-resume --move-aside to start a new run in this folder (the old one is moved beside it, whole), "
    "or a new --output-dir"
)


class IncompatibleCheckpointError(CheckpointError):
    """A training checkpoint does not match the run that resumes (or starts) from it (exit 2)."""

    exit_code = 2


def save_training_checkpoint(
    output_dir: str | Path,
    step: int,
    progress: Mapping[str, int],
    drafter_config: DrafterConfig,
    head_config: HeadConfig | None,
    tensors: Mapping[str, torch.Tensor],
    optimizer_state: Mapping[str, Any],
    run: Mapping[str, Any] | None = None,
) -> Path:
    """`run`: what the run trains on and how (`trainer.run_identity`), compared when it resumes."""
    final = Path(output_dir) / "checkpoints" / f"step-{step:08d}"
    with atomic_directory(final) as tmp:
        save_tensors(tmp / TENSORS_FILE, {k: v.float() for k, v in tensors.items()})
        buffer = io.BytesIO()
        torch.save(dict(optimizer_state), buffer)
        (tmp / OPTIMIZER_FILE).write_bytes(buffer.getvalue())
        state = {
            "format": FORMAT,
            "step": step,
            "progress": dict(progress),
            "drafter_config": drafter_config.to_hf_config(),
            "head_config": head_keys(head_config),
            "run": None if run is None else dict(run),
            "sha256": {OPTIMIZER_FILE: hashlib.sha256(buffer.getvalue()).hexdigest()},
        }
        # last: its presence marks a complete checkpoint
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    point_latest(output_dir, final)
    return final


def point_latest(output_dir: str | Path, checkpoint: Path) -> None:
    """`latest` names `checkpoint`, replaced atomically."""
    pointer = Path(output_dir) / LATEST
    if not pointer.is_file() or pointer.read_text().strip() != checkpoint.name:
        write_atomic(pointer, checkpoint.name + "\n")


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    pointer = Path(output_dir) / LATEST
    if not pointer.is_file():
        return None
    path = Path(output_dir) / "checkpoints" / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(
            f"`latest` names {path.name}, which is not a complete training checkpoint",
            where=str(pointer),
            fix="pass OUTPUT/checkpoints/step-N of a complete one",
        )
    return path


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints (their state file written), newest first."""
    root = Path(output_dir) / "checkpoints"
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / STATE_FILE).is_file()] if root.is_dir() else []
    return sorted(found, key=lambda p: p.name, reverse=True)


def remove_orphans(output_dir: str | Path) -> list[Path]:
    """Remove the temporaries an interrupted save left in a run (older runs' names too) -> what was removed."""
    out = Path(output_dir)
    found = [p for folder in (out, out / "checkpoints", out / "snapshots") for p in remove_temporaries(folder)]
    legacy = list((out / "checkpoints").glob(".step-*")) + list((out / "snapshots").glob(".step-*.safetensors.tmp"))
    legacy += [p for p in [out / f".{LATEST}.tmp", out / ".metrics.jsonl.tmp"] if p.exists()]
    for p in legacy:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return found + legacy


def resume_point(
    output_dir: str | Path, warn=print, map_location="cpu", legacy: bool = False
) -> tuple[Path, tuple, dict] | None:
    """The newest checkpoint that loads -> (path, `read_training_checkpoint`, optimizer state), or None without any; one
    that does not load is skipped with a warning, none loading raises CheckpointError. Reads only."""
    found = complete_checkpoints(output_dir)
    for i, path in enumerate(found):
        try:
            return path, read_training_checkpoint(path, legacy), read_optimizer_state(path, map_location, legacy)
        except CheckpointError as e:
            if i + 1 < len(found):
                warn(f"warning: {e} Falling back to the checkpoint before it, {found[i + 1].name}.")
            else:
                raise CheckpointError(
                    f"no checkpoint of this run loads ({len(found)} tried; {e.where or path.name}: {e.what})",
                    where=str(output_dir),
                    fix=f"nothing was changed; {e.fix if isinstance(e, UncheckedError) else START_OVER}",
                ) from e
    return None


def read_optimizer_state(path: str | Path, map_location="cpu", legacy: bool = False) -> dict:
    """optimizer.pt, checked against its sha256 in train_state.json (none: refused unless `legacy`)."""
    path = Path(path)
    where = path / OPTIMIZER_FILE
    try:
        data = where.read_bytes()
        expected = loads((path / STATE_FILE).read_text()).get("sha256", {}).get(OPTIMIZER_FILE)
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"cannot be read ({e})", where=str(where), fix=EARLIER) from e
    if expected is None and not legacy:
        raise UncheckedError(
            f"has no sha256 in {STATE_FILE}: written before checkpoints carried checksums, or not by lilicorr",
            where=str(where),
            fix=f"pass {LEGACY_FLAG} to load it without one (said with a warning), or use a checkpoint that has one",
        )
    if expected is None:
        print(f"warning: {where} has no sha256; loaded unchecked ({LEGACY_FLAG}).", file=sys.stderr)
    elif hashlib.sha256(data).hexdigest() != expected:
        raise CheckpointError(
            f"does not match the sha256 in {STATE_FILE}: it changed after it was written", where=str(where), fix=EARLIER
        )
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for a truncated or foreign pickle
        raise CheckpointError(
            f"truncated or not an optimizer state ({type(e).__name__})", where=str(where), fix=EARLIER
        ) from e
    if not (isinstance(state, dict) and "optimizer" in state and "scheduler" in state):
        raise CheckpointError("holds no optimizer and scheduler state", where=str(where), fix=EARLIER)
    return state


def set_aside_newer(output_dir: str | Path, resumed: Path) -> list[Path]:
    """Checkpoints newer than the one resumed (they did not load) renamed `bad-step-N` -> their new paths."""
    moved = []
    for path in complete_checkpoints(output_dir):
        if path.name > resumed.name:
            target, n = path.with_name(f"bad-{path.name}"), 1
            while target.exists():
                target, n = path.with_name(f"bad-{path.name}.{n}"), n + 1
            path.rename(target)
            moved.append(target)
    return moved


def prune_checkpoints(output_dir: str | Path, keep: int) -> None:
    """Keep the `keep` newest complete checkpoints."""
    for path in complete_checkpoints(output_dir)[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def save_snapshot(output_dir: str | Path, step: int, tensors: Mapping[str, torch.Tensor]) -> Path:
    """bf16 trainable tensors at an eval step (what the curves are evaluated from), atomically."""
    path = Path(output_dir) / "snapshots" / f"step-{step:08d}.safetensors"
    return save_tensors(path, {k: v.detach().to(torch.bfloat16) for k, v in tensors.items()})


def trim_metrics(path: str | Path, step: int) -> None:
    """Drop metrics rows past `step` (re-run after a resume) and a torn last line."""
    path = Path(path)
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # a torn or foreign line
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            keep.append(line + "\n")
    write_atomic(path, "".join(keep))


def read_training_checkpoint(
    path: str | Path, legacy: bool = False
) -> tuple[dict[str, Any], DrafterConfig, HeadConfig | None, dict[str, torch.Tensor]]:
    """A checkpoint, or a run's newest -> (state, drafter config, head config or None, float32 finite tensors)."""
    path = Path(path)
    if not (path / STATE_FILE).is_file() and (path / LATEST).is_file():
        path = latest_checkpoint(path)
    elif not (path / STATE_FILE).is_file() and complete_checkpoints(path):
        newest = complete_checkpoints(path)[0]
        print(
            f"warning: {path / LATEST} is missing; reading the newest complete checkpoint, {newest}.", file=sys.stderr
        )
        path = newest
    try:
        state = loads((path / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError) as e:  # missing, not UTF-8, not JSON, too deep
        raise CheckpointError(
            f"not a training checkpoint ({e})", where=str(path), fix="pass OUTPUT or OUTPUT/checkpoints/step-N"
        ) from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"format {state.get('format') if isinstance(state, dict) else state!r}, expected {FORMAT!r}",
            where=str(path / STATE_FILE),
            fix="pass a checkpoint written by `lilicorr train`",
        )
    missing = [k for k in ("step", "drafter_config", "head_config") if k not in state]
    if missing:
        raise CheckpointError(
            f"lacks {missing}",
            where=str(path / STATE_FILE),
            fix="it was not written by `lilicorr train` (or was cut short): use an earlier checkpoint",
        )
    try:
        drafter = DrafterConfig.from_hf_config(state["drafter_config"])
        head = head_config_from_keys(state["head_config"], drafter)
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"drafter_config / head_config: {e}", where=str(path / STATE_FILE), fix=EARLIER) from e
    fix = "use an earlier checkpoint (OUTPUT/checkpoints/step-N)"
    tensors = load_tensors(path / TENSORS_FILE, fix=fix, unchecked="warn" if legacy else "refuse")
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise CheckpointError(
                f"tensor {name!r} is {t.dtype}: a training checkpoint holds float32 masters",
                where=str(path / TENSORS_FILE),
                fix=fix,
            )
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"tensor {name!r} holds NaN or Inf", where=str(path / TENSORS_FILE), fix=fix)
    return state, drafter, head, tensors


def check_resume_compatible(
    state: Mapping[str, Any],
    drafter: DrafterConfig,
    head: HeadConfig | None,
    where: str,
    run: Mapping[str, Any] | None = None,
    added: Mapping[str, Any] | None = None,
) -> None:
    """The checkpoint's geometry must be this run's; with `run` its data and settings too (`added`: later settings with
    the value older checkpoints had)."""
    check_same_geometry(state["drafter_config"], state["head_config"], drafter, head, where, "resume")
    saved = state.get("run")
    if run is None or not isinstance(saved, dict):
        return
    saved = {**(added or {}), **saved}
    current = json.loads(json.dumps(dict(run)))
    diff = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    if diff:
        shown = ", ".join(f"{k}: {_short(saved.get(k))} -> {_short(current.get(k))}" for k in diff[:3])
        raise IncompatibleCheckpointError(
            f"cannot resume: this run's {diff} differ from the checkpoint's "
            f"({shown}{', ...' if len(diff) > 3 else ''})",
            where=where,
            fix="pass the run's own --data and settings, a new --output-dir, or --resume-with-changes to "
            "continue this run with the new ones",
        )


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_same_geometry(
    saved_drafter: Mapping[str, Any],
    saved_head: Mapping[str, Any] | None,
    drafter: DrafterConfig,
    head: HeadConfig | None,
    where: str,
    action: str,
    rope_may_differ: bool = False,
) -> None:
    """IncompatibleCheckpointError unless the saved drafter config and head keys are this run's."""
    saved_d = DrafterConfig.from_hf_config(saved_drafter)
    if rope_may_differ:
        saved_d = dataclasses.replace(saved_d, rope_scaling=drafter.rope_scaling)
    if saved_d != drafter:
        diff = [f.name for f in dataclasses.fields(drafter) if getattr(saved_d, f.name) != getattr(drafter, f.name)]
        raise IncompatibleCheckpointError(
            f"cannot {action}, the drafter differs in {diff} (checkpoint "
            f"{[getattr(saved_d, n) for n in diff]} vs this run {[getattr(drafter, n) for n in diff]})",
            where=where,
            fix="use the same settings or a new --output-dir",
        )
    run_h = head_keys(head)
    if saved_head != run_h:
        raise IncompatibleCheckpointError(
            f"cannot {action}, the head differs (checkpoint {saved_head}, this run {run_h})",
            where=where,
            fix="use the same --head and head settings (gamma = 0 and --head none have none) or a new --output-dir",
        )


def draft_geometry(directory: str | Path) -> DrafterConfig:
    """The drafter a draft folder's config.json declares: an export, or a published DFlash draft (z-lab's layout)."""
    corrector = corrector_draft_config(directory)
    if corrector is not None:
        return corrector[0]
    config = read_config(directory)
    try:
        return DrafterConfig.from_hf_config(config)
    except CheckpointError as e:
        raise e.located(str(Path(directory) / CONFIG_FILE)) from e


def load_draft_weights(
    directory: str | Path, drafter, head, drafter_cfg: DrafterConfig, head_cfg: HeadConfig | None
) -> None:
    """A draft's weights into a new run: same drafter geometry (rope may differ), its head or none (a fresh head)."""
    corrector = read_corrector_draft(directory)
    if corrector is not None:
        config, saved_head, drafter_t, head_t = corrector
        config, saved_head = config.to_hf_config(), head_keys(saved_head)
        dtype = next(iter(drafter_t.values())).dtype  # read_corrector_draft checked: every tensor its torch_dtype
    else:
        config = read_config(directory)
        saved_head = lilicorr_config(config).to_dflash_keys() if has_head(config) else None
        drafter_t, head_t = split_head(read_tensors(directory))
        dtype = dtype_of(config)
    fresh_head = saved_head is None and head is not None  # the head starts fresh: only the drafter must match
    option = f"--init-from {directory}"
    run_head = None if fresh_head else head_cfg
    check_same_geometry(config, saved_head, drafter_cfg, run_head, option, "start from it", rope_may_differ=True)
    where = str(Path(directory) / WEIGHTS_FILE)
    load_strict(drafter, drafter_t, f"{where} (drafter)", dtype)
    if head is not None and not fresh_head:
        load_strict(head, head_t, f"{where} (head)", dtype)


def load_trainable(tensors: Mapping[str, torch.Tensor], drafter, head, where: str) -> None:
    """A training checkpoint's tensors into a drafter and head, strictly (named, shaped, float32, finite)."""
    drafter_t, head_t = split_head(tensors)
    fix = "use an earlier checkpoint (OUTPUT/checkpoints/step-N)"
    try:
        load_strict(drafter, drafter_t, f"{where} (drafter)", torch.float32)
        if head is not None:
            load_strict(head, head_t, f"{where} (head)", torch.float32)
    except CheckpointError as e:  # named as a checkpoint's, not a draft's
        raise CheckpointError(e.what, where=e.where, fix=fix) from e
    if head is None and head_t:
        raise CheckpointError("holds head tensors but its train_state.json records no head", where=where, fix=fix)


def trainable_tensors(
    drafter_state: Mapping[str, torch.Tensor], head_state: Mapping[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    out = dict(drafter_state)
    if head_state is not None:
        out.update({HEAD_PREFIX + k: v for k, v in head_state.items()})
    return out
