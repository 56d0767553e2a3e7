"""Draft checkpoints in SGLang 0.5.23's DFlash / LiLiCorr format, saved and loaded strictly: config.json
(`architectures`, `torch_dtype`, `dflash_config` with the `lilicorr_*` keys, `lilicorr_weights_sha256`) and
model.safetensors (the head under `lilicorr.`, its checksum in the metadata). Checks raise CheckpointError."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .config import ConfigError, LiLiCorrConfig, json_number
from .errors import LiLiCorrError
from .head import LiLiCorrHead
from .jsonl import loads
from .ownership import atomic_directory, atomic_file  # noqa: F401 (atomic_directory: re-exported)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HEAD_PREFIX = "lilicorr."
VANILLA_ARCH = "DFlashDraftModel"
LILICORR_ARCH = "LiLiCorrDraftModel"
ARCHITECTURES = (VANILLA_ARCH, LILICORR_ARCH)
CHECKSUM_KEY = "lilicorr_sha256"  # safetensors metadata: tensor_digest of the file's tensors
PAIR_KEY = "lilicorr_weights_sha256"  # config.json: the CHECKSUM_KEY of the model.safetensors written with it
LEGACY_FLAG = "--accept-legacy-checkpoints"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EXPORTED = "pass the folder written by `lilicorr export`"  # the fix for a folder that is not a draft
REEXPORT = "re-export the draft"


class CheckpointError(LiLiCorrError, ValueError):
    """A draft checkpoint is missing, corrupt or does not match what is being built."""


class UncheckedError(CheckpointError):
    """A file that must carry its checksum carries none (a training checkpoint written before they did)."""


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"draft checkpoint directory {str(path)!r} does not exist", where=str(path), fix=EXPORTED)
    cfg_path = path / CONFIG_FILE
    try:
        config = loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise CheckpointError(
            f"config.json is missing: a draft checkpoint needs it beside {WEIGHTS_FILE}",
            where=str(cfg_path),
            fix=EXPORTED,
        ) from e
    except OSError as e:
        raise CheckpointError(
            f"cannot be read ({e})", where=str(cfg_path), fix="check the file and its permissions"
        ) from e
    except ValueError as e:  # not UTF-8, not JSON, an integer of more digits than Python parses, too deep
        raise CheckpointError(f"not valid JSON ({e})", where=str(cfg_path), fix="re-export the checkpoint") from e
    if not isinstance(config, dict) or not isinstance(config.get("dflash_config"), dict):
        raise CheckpointError("no `dflash_config` object: not a DFlash draft config", where=str(cfg_path), fix=REEXPORT)
    architecture_of(config, str(cfg_path))
    return config


def architecture_of(config: Mapping[str, Any], where: str = "draft config") -> str:
    """The architecture a draft config declares: DFlashDraftModel or LiLiCorrDraftModel (with a head)."""
    declared = config.get("architectures")
    if not (isinstance(declared, list) and len(declared) == 1 and declared[0] in ARCHITECTURES):
        raise CheckpointError(
            f"`architectures`={declared!r:.80} is not [{VANILLA_ARCH!r}] or [{LILICORR_ARCH!r}]",
            where=where,
            fix="a draft config declares one of them (`lilicorr export` writes it); re-export the draft",
        )
    return declared[0]


def block_size_of(config: Mapping[str, Any]) -> int:
    size = config["dflash_config"].get("block_size", config.get("block_size"))
    if not isinstance(size, int) or isinstance(size, bool):
        raise CheckpointError(f"no integer block_size ({size!r})", where="dflash_config.block_size", fix=REEXPORT)
    return size


def dtype_of(config: Mapping[str, Any]) -> torch.dtype:
    name = config.get("torch_dtype", config.get("dtype", "bfloat16"))
    if not isinstance(name, str) or name not in DTYPES:
        raise CheckpointError(f"torch_dtype={name!r} is not one of {sorted(DTYPES)}", where="torch_dtype", fix=REEXPORT)
    return DTYPES[name]


def has_head(config: Mapping[str, Any]) -> bool:
    return architecture_of(config) == LILICORR_ARCH


def lilicorr_config(config: Mapping[str, Any]) -> LiLiCorrConfig:
    """The head geometry declared by a draft config (raises if the draft has no LiLiCorr head)."""
    if not has_head(config):
        raise CheckpointError(
            f"draft declares architectures={config.get('architectures')!r}, "
            f"not [{LILICORR_ARCH!r}]: it has no LiLiCorr head",
            where="architectures",
            fix="serve it with --speculative-algorithm DFLASH, or export one with a head",
        )
    try:
        return LiLiCorrConfig.from_dflash_config(
            config["dflash_config"], block_size=block_size_of(config), rms_norm_eps=config.get("rms_norm_eps", 1e-6)
        )
    except ConfigError as e:
        raise CheckpointError(f"draft config: {e}", where="dflash_config", fix=REEXPORT) from e


def with_head(config: Mapping[str, Any], head_config: LiLiCorrConfig) -> dict[str, Any]:
    """A copy of a vanilla DFlash draft config that declares a LiLiCorr head."""
    out = json.loads(json.dumps(dict(config)))
    if head_config.block_size != block_size_of(out):
        raise CheckpointError(
            f"head block_size={head_config.block_size} differs from the drafter's {block_size_of(out)}."
        )
    out["architectures"] = [LILICORR_ARCH]
    out["dflash_config"].update(head_config.to_dflash_keys())
    return out


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order (independent of the file layout)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's bytes, not copied
    return h.hexdigest()


def save_tensors(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor]) -> Path:
    """A safetensors file, atomically, with its tensor_digest in the metadata (which SGLang ignores)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata={CHECKSUM_KEY: tensor_digest(tensors)})
    return Path(path)


def load_tensors(path: str | os.PathLike, fix: str, unchecked: str = "accept") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, checked against the digest in its metadata (else CheckpointError). Without
    a digest, `unchecked`: "accept" (stock drafts), "refuse" (UncheckedError) or "warn" (on stderr)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError("the file is missing", where=str(path), fix=fix)
    try:
        stored = stored_digest(path)
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"truncated, corrupt or not a safetensors file ({' '.join(str(e).split())[:200]})", where=str(path), fix=fix
        ) from e
    if stored is None and unchecked == "refuse":
        raise UncheckedError(
            f"carries no checksum ({CHECKSUM_KEY} in its metadata): written before checkpoints carried one, or not by "
            "lilicorr",
            where=str(path),
            fix=f"pass {LEGACY_FLAG} to load it without one (said with a warning), or use a checkpoint that has one",
        )
    if stored is None and unchecked == "warn":
        print(f"warning: {path} carries no checksum; loaded unchecked ({LEGACY_FLAG}).", file=sys.stderr)
    if stored is not None and stored != tensor_digest(tensors):
        raise CheckpointError(
            f"does not match its checksum ({CHECKSUM_KEY} in its metadata): its bytes changed after it was written",
            where=str(path),
            fix=fix,
        )
    return tensors


def stored_digest(path: str | os.PathLike) -> str | None:
    """The tensor_digest a safetensors file's metadata records (its header alone is read), or None."""
    with safe_open(str(path), "pt") as f:
        return (f.metadata() or {}).get(CHECKSUM_KEY)


def read_tensors(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A draft's model.safetensors, checked against its checksum and config.json's (another export's: refused)."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{WEIGHTS_FILE} is missing: a draft checkpoint needs its weights beside {CONFIG_FILE}",
            where=str(path),
            fix="re-export the checkpoint",
        )
    tensors = load_tensors(path, fix="re-export the checkpoint")
    try:
        paired = loads((Path(directory) / CONFIG_FILE).read_bytes()).get(PAIR_KEY)
    except (OSError, ValueError, AttributeError):  # read_config names what is wrong with it
        paired = None
    stored = stored_digest(path)
    if paired is not None and stored is not None and paired != stored:  # weights written by another tool: not paired
        raise CheckpointError(
            f"{CONFIG_FILE} and {WEIGHTS_FILE} are of two different exports ({PAIR_KEY} in {CONFIG_FILE} is not the "
            "weights' checksum): an export into this folder was stopped between its two files",
            where=str(directory),
            fix="export the draft again",
        )
    return tensors


def check_tensors(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor], where: str) -> None:
    """Strict match of a checkpoint's tensors against a module's state dict."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing:
        raise CheckpointError(
            f"missing tensor {missing[0]!r} ({len(missing)} missing in all: {missing[:5]})", where=where, fix=REEXPORT
        )
    if extra:
        raise CheckpointError(
            f"unexpected tensor {extra[0]!r} ({len(extra)} extra in all: {extra[:5]})",
            where=where,
            fix="the config's geometry does not describe these weights: re-export the draft",
        )
    for name, ref in expected.items():
        got = found[name]
        if tuple(got.shape) != tuple(ref.shape):
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(got.shape)}, expected {tuple(ref.shape)}", where=where, fix=REEXPORT
            )
        if got.dtype != ref.dtype:
            raise CheckpointError(
                f"tensor {name!r} has dtype {got.dtype}, expected {ref.dtype} (config torch_dtype)",
                where=where,
                fix=REEXPORT,
            )
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            raise CheckpointError(
                f"tensor {name!r} holds NaN or Inf values", where=where, fix="export an earlier checkpoint"
            )


def split_head(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(drafter tensors, head tensors without the `lilicorr.` prefix)."""
    drafter = {k: v for k, v in tensors.items() if not k.startswith(HEAD_PREFIX)}
    head = {k[len(HEAD_PREFIX) :]: v for k, v in tensors.items() if k.startswith(HEAD_PREFIX)}
    return drafter, head


def new_head(config: Mapping[str, Any]) -> LiLiCorrHead:
    """An untrained LiLiCorrHead of the geometry and dtype a draft config declares."""
    width = json_number(config.get("hidden_size"), int, "hidden_size", CheckpointError)
    return LiLiCorrHead(lilicorr_config(config), model_hidden_size=width).to(dtype_of(config))


def expected_tensors(module: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Meta tensors of `module`'s names and shapes, floating ones of `dtype` (default: their own)."""
    return {
        k: torch.empty(v.shape, dtype=dtype if dtype is not None and v.is_floating_point() else v.dtype, device="meta")
        for k, v in module.state_dict().items()
    }


def load_strict(
    head: torch.nn.Module, head_tensors: Mapping[str, torch.Tensor], where: str, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """Strict load: every tensor named, shaped, of `dtype` (default: the module's) and finite, else CheckpointError."""
    check_tensors(expected_tensors(head, dtype), head_tensors, where)
    state = head.state_dict()
    head.load_state_dict({k: v.to(state[k].dtype) for k, v in head_tensors.items()}, strict=True)
    return head


def save_checkpoint(
    directory: str | os.PathLike,
    config: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    keep_others: bool = False,
) -> Path:
    """config.json + model.safetensors as one new folder in `directory`'s place; `keep_others`: keep the rest."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"refusing to save tensor {name!r}: it holds NaN or Inf values.")
    with atomic_directory(directory, keep_all_but=(CONFIG_FILE, WEIGHTS_FILE) if keep_others else None) as tmp:
        write_checkpoint_files(tmp, config, tensors)
    return Path(directory)


def write_checkpoint_files(
    directory: str | os.PathLike, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]
) -> None:
    """config.json + model.safetensors into an existing folder, each atomically, weights first."""
    digest = stored_digest(save_tensors(Path(directory) / WEIGHTS_FILE, tensors))
    with atomic_file(Path(directory) / CONFIG_FILE) as tmp:
        tmp.write_text(json.dumps({**config, PAIR_KEY: digest}, indent=2, sort_keys=True) + "\n")
