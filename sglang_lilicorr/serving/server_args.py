"""LILICORR's share of SGLang's ServerArgs resolution: every check that can fail before a process
starts, and the DFlash-style defaults.

SGLang calls both hooks in the launcher, during `ServerArgs.resolve_once()`, with a recording
stand-in `args` (reads see the resolution so far; plain attribute writes become declared
resolutions):
  validate_server_args(args)  (CustomSpecAlgo.validate_server_args) runs first: raises
                               ServingConfigError naming the option or file and the fix;
  resolve_server_args(args)   (CustomSpecAlgo.handle_server_args) then fixes the block size,
                               num_steps / eagle_topk = 1 and the max-running-requests default.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from ..checkpoint import (
    HEAD_PREFIX,
    WEIGHTS_FILE,
    CheckpointError,
    has_head,
    lilicorr_config,
    read_config,
)
from ..config import LiLiCorrConfig
from ..head import LiLiCorrHead
from . import ALGORITHM_NAME

logger = logging.getLogger(__name__)

MAX_BLOCK_SIZE = 32  # B: the walk kernel unrolls S = B-1 slots; the head attends over S*K nodes
DEFAULT_MAX_RUNNING_REQUESTS = 48  # SGLang's default for DFLASH, kept for LILICORR
# Draft attention backends that run the DFlash drafter's non-causal block attention.
DRAFT_ATTENTION_BACKENDS = ("flashinfer", "fa3", "fa4", "triton")


class ServingConfigError(ValueError):
    """A server option or the draft checkpoint cannot serve LILICORR; the message says the fix."""


@dataclass(frozen=True)
class DraftSpec:
    """A validated LiLiCorr draft checkpoint (config only; weights load in the scheduler)."""

    path: Path
    config: Mapping[str, Any]
    head: LiLiCorrConfig

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])


# --- the draft checkpoint -------------------------------------------------------------------


def inspect_draft(path: str | None) -> DraftSpec:
    """Read and validate the draft folder: a DFlash draft with a LiLiCorr head in SGLang's format."""
    if path is None:
        raise ServingConfigError(
            f"--speculative-algorithm {ALGORITHM_NAME} needs --speculative-draft-model-path: the folder of a "
            'LiLiCorr draft (config.json with architectures ["LiLiCorrDraftModel"] + model.safetensors), '
            "as written by `lilicorr export`."
        )
    folder = Path(path)
    if not folder.is_dir():
        raise ServingConfigError(
            f"--speculative-draft-model-path {path!r} is not a local folder. {ALGORITHM_NAME} reads the draft "
            "from disk: download it first (e.g. `huggingface-cli download REPO --local-dir DIR`) and pass DIR."
        )
    try:
        config = read_config(folder)
    except CheckpointError as e:
        raise ServingConfigError(f"--speculative-draft-model-path: {e}") from e
    if not has_head(config):
        raise ServingConfigError(
            f"--speculative-draft-model-path {path!r} declares architectures={config.get('architectures')!r}: "
            f"a DFlash draft without a LiLiCorr head. Serve it with --speculative-algorithm DFLASH, or pass a "
            'draft with architectures ["LiLiCorrDraftModel"] and the lilicorr_* keys in dflash_config.'
        )
    try:
        head = lilicorr_config(config)
    except CheckpointError as e:
        raise ServingConfigError(f"--speculative-draft-model-path {path!r}: {e}") from e
    if "hidden_size" not in config:
        raise ServingConfigError(f"{folder / 'config.json'} has no hidden_size: not a DFlash draft config.")
    if head.block_size > MAX_BLOCK_SIZE:
        raise ServingConfigError(
            f"draft block_size={head.block_size} is unsupported: {ALGORITHM_NAME} serves blocks of 2..{MAX_BLOCK_SIZE} "
            "tokens (the paper uses 16); retrain or re-export the draft with a smaller block."
        )
    spec = DraftSpec(path=folder, config=config, head=head)
    check_head_tensors(spec)
    return spec


def check_head_tensors(spec: DraftSpec) -> None:
    """Names and shapes of the `lilicorr.` tensors against the declared geometry, from the
    safetensors header alone (no weights are read)."""
    from safetensors import safe_open

    weights = spec.path / WEIGHTS_FILE
    if not weights.is_file():
        raise ServingConfigError(f"{weights} is missing: a draft checkpoint needs its weights beside config.json.")
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in LiLiCorrHead(spec.head, spec.hidden_size).state_dict().items()}
    try:
        with safe_open(str(weights), framework="pt") as f:
            found = {
                k[len(HEAD_PREFIX):]: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith(HEAD_PREFIX)
            }
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise ServingConfigError(f"{weights} is not a readable safetensors file ({e}); re-export the draft.") from e
    if not found:
        raise ServingConfigError(
            f"{weights} holds no `{HEAD_PREFIX}` tensors although config.json declares a LiLiCorr head: "
            "re-export the draft with its head, or serve it with --speculative-algorithm DFLASH."
        )
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(n for n in set(expected) & set(found) if expected[n] != found[n])
    if missing or extra or wrong:
        detail = (
            f"missing {[HEAD_PREFIX + n for n in missing[:3]]}" if missing
            else f"unexpected {[HEAD_PREFIX + n for n in extra[:3]]}" if extra
            else f"{HEAD_PREFIX}{wrong[0]} has shape {found[wrong[0]]}, expected {expected[wrong[0]]}"
        )
        raise ServingConfigError(
            f"{weights}: the head tensors do not match the lilicorr_* geometry in config.json ({detail}); "
            "the config and weights come from different exports."
        )


# --- the target ------------------------------------------------------------------------------


def target_text_config(args) -> Any:
    from sglang.srt.utils.hf_transformers.common import get_hf_text_config
    from sglang.srt.utils.hf_transformers.config import get_config

    config = get_config(
        args.model_path,
        trust_remote_code=args.trust_remote_code,
        revision=args.revision,
        model_override_args=json.loads(args.json_model_override_args or "{}"),
    )
    return get_hf_text_config(config)


def check_draft_matches_target(spec: DraftSpec, target: Any) -> None:
    hidden = int(getattr(target, "hidden_size"))
    if spec.hidden_size != hidden:
        raise ServingConfigError(
            f"draft hidden_size={spec.hidden_size} but the target (--model-path) has hidden_size={hidden}: the "
            "draft was trained for another target. Pass the target it was trained on, or a draft trained on this one."
        )
    vocab = int(getattr(target, "vocab_size"))
    draft_vocab = spec.config.get("vocab_size")
    if draft_vocab is not None and int(draft_vocab) != vocab:
        raise ServingConfigError(
            f"draft vocab_size={draft_vocab} but the target (--model-path) has vocab_size={vocab}: the head scores "
            "target-vocabulary candidates, so draft and target must share a tokenizer. Use the matching target."
        )


# --- server options --------------------------------------------------------------------------

# (option, test on the resolving view, what to do). Each names a path the LILICORR worker
# has not been built or tested for; SGLang's own checks would fail later and less clearly.
_UNSUPPORTED = (
    ("--attn-dp-size > 1 / --enable-dp-attention", lambda a: bool(a.enable_dp_attention) or (a.attn_dp_size or 1) > 1,
     "serve without DP attention (one server per GPU behind a router scales out instead)"),
    ("--tp-size > 1", lambda a: a.tp_size != 1,
     "the fused top-K reads the whole LM head on one GPU; serve with --tp-size 1 (or use DFLASH)"),
    ("--pp-size > 1", lambda a: a.pp_size != 1, "serve with --pp-size 1"),
    ("--attn-cp-size > 1", lambda a: a.attn_cp_size != 1, "serve with --attn-cp-size 1"),
    ("--disaggregation-mode", lambda a: a.disaggregation_mode not in (None, "null"),
     "serve LILICORR without prefill/decode disaggregation"),
    ("--enable-unified-memory", lambda a: bool(a.enable_unified_memory), "drop --enable-unified-memory"),
    ("--enable-mixed-chunk", lambda a: bool(a.enable_mixed_chunk), "drop --enable-mixed-chunk"),
    ("--enable-two-batch-overlap", lambda a: bool(a.enable_two_batch_overlap), "drop --enable-two-batch-overlap"),
    ("--speculative-adaptive", lambda a: bool(a.speculative_adaptive),
     "drop it: the head is trained for one block size"),
    ("--speculative-use-block-verification", lambda a: bool(a.speculative_use_block_verification),
     "drop it: the drafted block is a deterministic proposal, where token-wise verification is already exact"),
    ("--speculative-draft-window-size", lambda a: a.speculative_draft_window_size is not None,
     "drop it: LILICORR keeps the full draft KV cache"),
    ("--speculative-draft-model-quantization", lambda a: a.speculative_draft_model_quantization is not None,
     "drop it: LILICORR serves unquantized drafts"),
    ("--enable-lora / --lora-paths", lambda a: bool(a.enable_lora) or bool(a.lora_paths),
     "serve LILICORR without LoRA adapters"),
    ("--speculative-accept-threshold-single/-acc != 1",
     lambda a: a.speculative_accept_threshold_single != 1.0 or a.speculative_accept_threshold_acc != 1.0,
     "drop them: LILICORR verifies exactly (greedy or rejection sampling)"),
)


def check_options(args) -> None:
    device = str(args.device or "")
    if not device.startswith("cuda"):
        raise ServingConfigError(
            f"--speculative-algorithm {ALGORITHM_NAME} runs on CUDA GPUs only, got --device {device or None!r}: "
            "serve on a CUDA device (--device cuda), or without speculative decoding."
        )
    for option, unsupported, fix in _UNSUPPORTED:
        if unsupported(args):
            raise ServingConfigError(f"{option} is not supported with --speculative-algorithm {ALGORITHM_NAME}: {fix}.")
    for option, value in (("--speculative-num-steps", args.speculative_num_steps),
                          ("--speculative-eagle-topk", args.speculative_eagle_topk)):
        if value not in (None, 1):
            raise ServingConfigError(
                f"{option} {value} is not supported with --speculative-algorithm {ALGORITHM_NAME}: it drafts one "
                "linear block per step; drop the option (it resolves to 1)."
            )


def check_draft_attention_backend(args) -> None:
    backend = args.speculative_draft_attention_backend
    if backend is not None and backend not in DRAFT_ATTENTION_BACKENDS:
        raise ServingConfigError(
            f"--speculative-draft-attention-backend {backend} is not supported with --speculative-algorithm "
            f"{ALGORITHM_NAME}: the drafter attends bidirectionally within its block; pick one of "
            f"{', '.join(DRAFT_ATTENTION_BACKENDS)}."
        )


def check_block_size(spec: DraftSpec, args) -> None:
    for option, value in (("--speculative-num-draft-tokens", args.speculative_num_draft_tokens),
                          ("--speculative-dflash-block-size", args.speculative_dflash_block_size)):
        if value is not None and int(value) != spec.head.block_size:
            raise ServingConfigError(
                f"{option} {value} differs from the draft's block_size={spec.head.block_size}: the LiLiCorr head "
                f"is trained for {spec.head.block_size}-token blocks. Drop {option} or set it to {spec.head.block_size}."
            )


# --- the two hooks ---------------------------------------------------------------------------


def validate_server_args(args) -> None:
    check_options(args)
    check_draft_attention_backend(args)
    spec = inspect_draft(args.speculative_draft_model_path)
    check_block_size(spec, args)
    check_draft_matches_target(spec, target_text_config(args))


def resolve_server_args(args) -> None:
    spec = inspect_draft(args.speculative_draft_model_path)
    args.speculative_num_draft_tokens = spec.head.block_size
    args.speculative_num_steps = 1
    args.speculative_eagle_topk = 1
    if args.speculative_draft_attention_backend is None:
        # The drafter takes the target's attention backend where it can run the block, else triton.
        target = args.prefill_attention_backend or args.attention_backend
        args.speculative_draft_attention_backend = target if target in DRAFT_ATTENTION_BACKENDS else "triton"
    if args.max_running_requests is None:
        args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
        logger.warning(
            "%s: --max-running-requests defaults to %d, as for DFLASH; set it to override.",
            ALGORITHM_NAME, DEFAULT_MAX_RUNNING_REQUESTS,
        )
