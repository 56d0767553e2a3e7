"""What a LiLiCorr draft must be for a LILICORR server to serve it on a target, from config.json and the safetensors
header, every problem collected: the server raises the first (`inspect_draft`), `lilicorr check-draft` prints all."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from ..checkpoint import HEAD_PREFIX, WEIGHTS_FILE, CheckpointError, dtype_of, has_head, lilicorr_config, read_config
from ..config import LiLiCorrConfig, json_number
from ..errors import LiLiCorrError
from ..head import LiLiCorrHead
from ..kernels.walk import MAX_BLOCK_SIZE
from . import ALGORITHM_NAME


class ServingConfigError(LiLiCorrError, ValueError):
    """A server option or the draft checkpoint cannot serve LILICORR; the message says the fix."""


def env_choice(name: str, choices, default: str, what: str) -> str:
    """Environment option `name` (`default` when unset); ServingConfigError when not one of `choices`."""
    value = os.environ.get(name, default)
    if value not in choices:
        raise ServingConfigError(f"{name}={value!r} is not {what}: set it to one of {', '.join(choices)}.")
    return value


@dataclass(frozen=True)
class DraftSpec:
    """A validated LiLiCorr draft checkpoint (config only; weights load in the scheduler)."""

    path: Path
    config: Mapping[str, Any]
    head: LiLiCorrConfig

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])


@dataclass(frozen=True)
class TargetShape:
    """What the draft must match in the target's text config (context_length None: no requirement)."""

    hidden_size: int
    vocab_size: int
    num_layers: int | None
    context_length: int | None = None

    @classmethod
    def of(cls, config: Any) -> "TargetShape":
        """From an HF config or config.json dict (its `text_config` if any); context: max_position_embeddings."""

        def get(name, optional=False):
            value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
            return None if optional and value is None else json_number(value, int, f"target {name}", ServingConfigError)

        if isinstance(config, Mapping) and isinstance(config.get("text_config"), Mapping):
            return cls.of(config["text_config"])
        hidden, vocab = get("hidden_size"), get("vocab_size")
        return cls(hidden, vocab, get("num_hidden_layers", True), get("max_position_embeddings", True))


@dataclass
class DraftReport:
    """The outcome of examine_draft: the spec when every check passed, else the problems found."""

    spec: DraftSpec | None = None
    problems: list[ServingConfigError] = field(default_factory=list)

    def problem(self, message: str) -> None:
        self.problems.append(ServingConfigError(message))


def inspect_draft(
    path: str | Path, target: TargetShape | None = None, option: str = "--speculative-draft-model-path"
) -> DraftSpec:
    """The validated draft, or its first problem raised (see examine_draft)."""
    report = examine_draft(path, target, option)
    if report.problems:
        raise report.problems[0]
    return report.spec


def examine_draft(
    path: str | Path, target: TargetShape | None = None, option: str = "--speculative-draft-model-path"
) -> DraftReport:
    """Every problem of the draft folder `path` (named `option` in messages): files, head geometry, dtype and head
    tensors, and against `target` its width, vocabulary and layers."""
    report = DraftReport()
    folder = Path(path)
    if not folder.is_dir():
        report.problem(
            f"{option} {str(path)!r} is not a local folder. {ALGORITHM_NAME} reads the draft "
            "from disk: download it first (e.g. `huggingface-cli download REPO --local-dir DIR`) and pass DIR."
        )
        return report
    try:
        config = read_config(folder)
    except CheckpointError as e:
        report.problem(f"{option}: {e}")
        return report
    head = None
    if not has_head(config):
        report.problem(
            f"{option} {str(path)!r} declares architectures={config.get('architectures')!r}: "
            f"a DFlash draft without a LiLiCorr head. Serve it with --speculative-algorithm DFLASH, or pass a "
            'draft with architectures ["LiLiCorrDraftModel"] and the lilicorr_* keys in dflash_config.'
        )
    else:
        try:
            head = lilicorr_config(config)
        except CheckpointError as e:
            report.problem(f"{option} {str(path)!r}: {e}")
    shapes = {key: config.get(key) for key in ("hidden_size", "num_attention_heads", "intermediate_size")}
    for key, value in shapes.items():  # what SGLang builds the draft with and shards over TP ranks
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            report.problem(
                f"{folder / 'config.json'} has no positive integer {key} (got {value!r:.40}): "
                "not a DFlash draft config."
            )
            shapes[key] = None
    hidden = shapes["hidden_size"]
    if head is not None and head.block_size > MAX_BLOCK_SIZE:
        report.problem(
            f"draft block_size={head.block_size} is unsupported: {ALGORITHM_NAME} serves blocks of 2..{MAX_BLOCK_SIZE} "
            "tokens (the paper uses 16); retrain or re-export the draft with a smaller block."
        )
    try:
        dtype_of(config)
    except CheckpointError as e:
        report.problem(f"{folder / 'config.json'}: {e}")
    if head is not None and hidden is not None:
        _check_head_tensors(report, folder / WEIGHTS_FILE, head, hidden)
    if target is not None:
        _check_target(report, config, hidden, target)
    if not report.problems:
        report.spec = DraftSpec(path=folder, config=config, head=head)
    return report


def _check_head_tensors(report: DraftReport, weights: Path, head: LiLiCorrConfig, hidden: int) -> None:
    """Names and shapes of the `lilicorr.` tensors against the geometry, from the safetensors header."""
    from safetensors import safe_open

    if not weights.is_file():
        report.problem(f"{weights} is missing: a draft checkpoint needs its weights beside config.json.")
        return
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in LiLiCorrHead(head, hidden).state_dict().items()}
    try:
        with safe_open(str(weights), framework="pt") as f:
            found = {
                k[len(HEAD_PREFIX) :]: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith(HEAD_PREFIX)
            }
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        report.problem(f"{weights} is not a readable safetensors file ({e}); re-export the draft.")
        return
    if not found:
        report.problem(
            f"{weights} holds no `{HEAD_PREFIX}` tensors although config.json declares a LiLiCorr head: "
            "re-export the draft with its head, or serve it with --speculative-algorithm DFLASH."
        )
        return
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(n for n in set(expected) & set(found) if expected[n] != found[n])
    if missing or extra or wrong:
        detail = f"missing {[HEAD_PREFIX + n for n in missing[:3]]}"
        if not missing:
            detail = f"unexpected {[HEAD_PREFIX + n for n in extra[:3]]}"
        if not missing and not extra:
            detail = f"{HEAD_PREFIX}{wrong[0]} has shape {found[wrong[0]]}, expected {expected[wrong[0]]}"
        report.problem(
            f"{weights}: the head tensors do not match the lilicorr_* geometry in config.json ({detail}); "
            "the config and weights come from different exports."
        )


def _check_target(report: DraftReport, config: Mapping[str, Any], hidden: int | None, target: TargetShape) -> None:
    """The draft's width (hidden or None), vocabulary, layers, mask token and positions against the target's."""
    if hidden is not None and hidden != target.hidden_size:
        report.problem(
            f"draft hidden_size={hidden} but the target has hidden_size={target.hidden_size}: the "
            "draft was trained for another target. Pass the target it was trained on, or a draft trained on this one."
        )
    vocab = config.get("vocab_size")
    if vocab is not None and vocab != target.vocab_size:
        report.problem(
            f"draft vocab_size={vocab} but the target has vocab_size={target.vocab_size}: the head scores "
            "target-vocabulary candidates, so draft and target must share a tokenizer. Use the matching target."
        )
    dflash = {**config, **config["dflash_config"]}  # SGLang reads these keys there, else at the top level
    layer_ids = dflash.get("target_layer_ids")
    if target.num_layers is not None:
        n = target.num_layers
        if not isinstance(layer_ids, list) or not layer_ids:
            report.problem(
                f"draft dflash_config.target_layer_ids={layer_ids!r:.60} is not a non-empty list of target layer ids."
            )
        else:
            bad = [i for i in layer_ids if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= n - 2)]
            if bad:
                report.problem(
                    f"draft dflash_config.target_layer_ids has {bad[:5]}, not capturable layers of the {n}-layer "
                    f"target (0..{n - 2}: the last layer's output is never captured): "
                    "the draft was trained for another target."
                )
    mask = dflash.get("mask_token_id")
    named = mask is None and isinstance(dflash.get("mask_token"), str) and dflash["mask_token"]  # SGLang looks it up
    if not named and not (isinstance(mask, int) and not isinstance(mask, bool) and 0 <= mask < target.vocab_size):
        report.problem(
            f"draft dflash_config.mask_token_id={mask!r:.40} is not a token id of the target's vocabulary "
            f"[0, {target.vocab_size}); re-export the draft for this target."
        )
    positions = config.get("max_position_embeddings")
    if target.context_length is not None and isinstance(positions, int) and positions < target.context_length:
        report.problem(
            f"draft max_position_embeddings={positions} is below the {target.context_length}-token context it would "
            "serve (--context-length, by default the target's max_position_embeddings): SGLang refuses to start such a "
            "draft. Re-export it with `lilicorr export` (it writes the target's max_position_embeddings), serve with "
            f"--context-length {positions}, or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 to serve it past that "
            "length (it still proposes there; acceptance drops, outputs stay exact)."
        )
