"""LILICORR's share of SGLang's ServerArgs resolution (hooks SGLang calls in the launcher on a recording stand-in
`args`): `default_target_attention_backend`, `validate_server_args` (every check that can fail before a process starts;
ServingConfigError) and `resolve_server_args` (the DFlash-style defaults)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from . import ALGORITHM_NAME
from .draft_check import DraftSpec, ServingConfigError, TargetShape, inspect_draft
from .proposer import walk_rule
from .verification import check_before_start
from .verify_attention import check_target_backend as check_verify_attention_backend
from .verify_attention import choice as verify_attention_choice
from .verify_width import widths_from_env

logger = logging.getLogger(__name__)

DEFAULT_MAX_RUNNING_REQUESTS = 48  # SGLang's default for DFLASH, kept for LILICORR
# SGLang runs the drafter's block attention on these; LILICORR is served and checked (greedy and T = 1) on the next
DRAFT_ATTENTION_BACKENDS = ("flashinfer", "fa3", "fa4", "triton")
SERVED_DRAFT_ATTENTION_BACKENDS = ("triton",)
# the target backends served and proven lossless (benchmarks/results/served-greedy/, sampling/, backends/), the first
# the default; the rest (FA3/FA4 need sgl-kernel ops the GPU machine cannot load) are refused
SERVED_TARGET_ATTENTION_BACKENDS = ("triton", "flashinfer")


def draft_path(args) -> str:
    path = args.speculative_draft_model_path
    if path is None:
        raise ServingConfigError(
            f"--speculative-algorithm {ALGORITHM_NAME} needs --speculative-draft-model-path: the folder of a "
            'LiLiCorr draft (config.json with architectures ["LiLiCorrDraftModel"] + model.safetensors), '
            "as written by `lilicorr export`."
        )
    return path


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


# (option, test on the resolving view, what to do): paths the LILICORR worker was not built or tested for
_UNSUPPORTED = (
    (
        "--attn-dp-size > 1 / --enable-dp-attention",
        lambda a: bool(a.enable_dp_attention) or (a.attn_dp_size or 1) > 1,
        "serve without DP attention: --tp-size N shards the model over N GPUs, --dp-size N runs N replicas",
    ),
    (
        "--pp-size > 1",
        lambda a: a.pp_size != 1,
        "serve with --pp-size 1 (SGLang's DFLASH refuses pipeline parallelism too); "
        "--tp-size N spreads the model over N GPUs",
    ),
    (
        "--attn-cp-size > 1",
        lambda a: a.attn_cp_size != 1,
        "serve with --attn-cp-size 1; --tp-size N spreads the model over N GPUs",
    ),
    (
        "--disaggregation-mode",
        lambda a: a.disaggregation_mode not in (None, "null"),
        "serve LILICORR without prefill/decode disaggregation",
    ),
    ("--enable-unified-memory", lambda a: bool(a.enable_unified_memory), "drop --enable-unified-memory"),
    ("--enable-mixed-chunk", lambda a: bool(a.enable_mixed_chunk), "drop --enable-mixed-chunk"),
    ("--enable-two-batch-overlap", lambda a: bool(a.enable_two_batch_overlap), "drop --enable-two-batch-overlap"),
    (
        "--speculative-adaptive",
        lambda a: bool(a.speculative_adaptive),
        "drop it: the head is trained for one block size",
    ),
    (
        "--speculative-use-block-verification",
        lambda a: bool(a.speculative_use_block_verification),
        "drop it: the drafted block is a deterministic proposal, where token-wise verification is already exact",
    ),
    (
        "--speculative-draft-window-size",
        lambda a: a.speculative_draft_window_size is not None,
        "drop it: LILICORR keeps the full draft KV cache",
    ),
    (
        "--speculative-draft-model-quantization (set, or inherited from --quantization)",
        lambda a: a.speculative_draft_model_quantization is not None,
        "LILICORR serves unquantized drafts; a quantized target (--quantization X) serves with "
        "--speculative-draft-model-quantization unquant",
    ),
    (
        "--enable-lora / --lora-paths",
        lambda a: bool(a.enable_lora) or bool(a.lora_paths),
        "serve LILICORR without LoRA adapters",
    ),
    (
        "--speculative-accept-threshold-single/-acc != 1",
        lambda a: a.speculative_accept_threshold_single != 1.0 or a.speculative_accept_threshold_acc != 1.0,
        "drop them: LILICORR verifies exactly (greedy or rejection sampling)",
    ),
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
    for option, value in (
        ("--speculative-num-steps", args.speculative_num_steps),
        ("--speculative-eagle-topk", args.speculative_eagle_topk),
    ):
        if value not in (None, 1):
            raise ServingConfigError(
                f"{option} {value} is not supported with --speculative-algorithm {ALGORITHM_NAME}: it drafts one "
                "linear block per step; drop the option (it resolves to 1)."
            )


def check_draft_attention_backend(args) -> None:
    backend = args.speculative_draft_attention_backend
    if backend is None or backend in SERVED_DRAFT_ATTENTION_BACKENDS:
        return
    if backend in DRAFT_ATTENTION_BACKENDS:
        raise ServingConfigError(
            f"--speculative-draft-attention-backend {backend}: SGLang can run the drafter's block attention on it, but "
            f"{ALGORITHM_NAME} has been served and checked with {', '.join(SERVED_DRAFT_ATTENTION_BACKENDS)} only; "
            f"drop the flag (the drafter then runs triton, whatever the target's backend) or pass triton."
        )
    raise ServingConfigError(
        f"--speculative-draft-attention-backend {backend} is not supported with --speculative-algorithm "
        f"{ALGORITHM_NAME}: the drafter attends bidirectionally within its block; pick "
        f"{', '.join(SERVED_DRAFT_ATTENTION_BACKENDS)}."
    )


def serves_lilicorr(args) -> bool:
    """Whether `args` (raw or resolving) asks for LILICORR: the name may still be as typed."""
    return str(args.speculative_algorithm or "").upper() == ALGORITHM_NAME


def default_target_attention_backend(args) -> None:
    """With no --attention-backend, a LILICORR server gets SERVED_TARGET_ATTENTION_BACKENDS[0] (one warning), not
    SGLang's GPU default; runs before SGLang fills it. Not with both --prefill- and --decode-attention-backend set."""
    if not serves_lilicorr(args) or args.attention_backend is not None:
        return
    prefill, decode = args.prefill_attention_backend, args.decode_attention_backend
    if prefill is not None and decode is not None:
        return
    backend = SERVED_TARGET_ATTENTION_BACKENDS[0]
    args.attention_backend = backend
    phases = "prefill and decode" if prefill is None and decode is None else ("decode" if decode is None else "prefill")
    logger.warning(
        "%s: --attention-backend defaults to %s (the target's %s attention), the backend %s is served and proven on, "
        "where SGLang's own default can be one it was never served on (fa3 on Hopper); pass --attention-backend %s "
        "for the other one accepted.",
        ALGORITHM_NAME,
        backend,
        phases,
        ALGORITHM_NAME,
        " or ".join(SERVED_TARGET_ATTENTION_BACKENDS[1:]),
    )


def check_target_attention_backend(args) -> str:
    """The target's resolved attention backend: prefill and decode one of SERVED_TARGET_ATTENTION_BACKENDS."""
    from sglang.srt.arg_groups.overrides import attention_backends_of

    prefill, decode = attention_backends_of(args)
    fix = f"pass --attention-backend {' or '.join(SERVED_TARGET_ATTENTION_BACKENDS)}"
    split = args.prefill_attention_backend is not None or args.decode_attention_backend is not None
    for backend, phase, flag in (
        (prefill, "prefill and decode" if prefill == decode else "prefill", "prefill-attention-backend"),
        (decode, "decode", "decode-attention-backend"),
    ):
        if backend not in SERVED_TARGET_ATTENTION_BACKENDS:
            named = getattr(args, flag.replace("-", "_")) == backend
            raise ServingConfigError(
                f"--{flag if named else 'attention-backend'} {backend} is not supported with --speculative-algorithm "
                f"{ALGORITHM_NAME}: the target's {phase} attention has never been served and checked on {backend} "
                f"({ALGORITHM_NAME} accepts {', '.join(SERVED_TARGET_ATTENTION_BACKENDS)}); {fix} (triton is served "
                f"and proven lossless){' and drop the split flags' if split else ''}."
            )
    if prefill != decode:
        raise ServingConfigError(
            f"The target's prefill attention would run {prefill} and its decode attention {decode} "
            f"(--attention-backend, --prefill-attention-backend, --decode-attention-backend): {ALGORITHM_NAME} has "
            f"been served with one backend for both, never with SGLang's hybrid of two; "
            f"pass --attention-backend {prefill} or {decode} alone."
        )
    return prefill


def tensor_parallel_problems(heads: int, kv_heads: int, intermediate: int, tp_size: int) -> list[str]:
    """Why each draft shape SGLang's DFlash draft shards over TP does not fit tp_size; [] when all fit."""
    problems = []
    if heads % tp_size:
        problems.append(f"num_attention_heads={heads} is not divisible by {tp_size}")
    if kv_heads % tp_size if kv_heads >= tp_size else tp_size % kv_heads:
        problems.append(f"num_key_value_heads={kv_heads} neither divides nor is divisible by {tp_size}")
    if intermediate % tp_size:
        problems.append(
            f"intermediate_size={intermediate} is not divisible by {tp_size} (lilicorr train --draft-intermediate-size)"
        )
    return problems


def check_tensor_parallel(spec: DraftSpec, tp_size: int) -> None:
    """--tp-size against the draft's heads, KV heads and MLP width; the message lists the TP sizes that fit."""
    config = spec.config
    heads = int(config["num_attention_heads"])
    kv_heads, intermediate = int(config.get("num_key_value_heads") or heads), int(config["intermediate_size"])
    problems = tensor_parallel_problems(heads, kv_heads, intermediate, tp_size)
    if problems:
        fits = [n for n in range(1, heads + 1) if not tensor_parallel_problems(heads, kv_heads, intermediate, n)]
        raise ServingConfigError(
            f"--tp-size {tp_size} does not fit the draft, which SGLang's DFlash draft shards over the TP ranks: "
            f"{'; '.join(problems)}. Serve with --tp-size in {fits}, or with a draft whose shapes divide by {tp_size}."
        )


def check_block_size(spec: DraftSpec, args) -> None:
    for option, value in (
        ("--speculative-num-draft-tokens", args.speculative_num_draft_tokens),
        ("--speculative-dflash-block-size", args.speculative_dflash_block_size),
    ):
        if value is not None and int(value) != spec.head.block_size:
            raise ServingConfigError(
                f"{option} {value} differs from the draft's block_size={spec.head.block_size}: the LiLiCorr head is "
                f"trained for {spec.head.block_size}-token blocks. Drop {option} or set it to {spec.head.block_size}."
            )


def served_target(args) -> TargetShape:
    """The target as served: its shape and the context the draft must cover (--context-length, else the target's; None
    where SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set)."""
    from sglang.srt.environ import envs
    from sglang.srt.utils.hf_transformers.common import get_context_length

    text = target_text_config(args)
    context = None
    if not envs.SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN.get():
        context = int(args.context_length or get_context_length(text))
    return dataclasses.replace(TargetShape.of(text), context_length=context)


def validate_server_args(args) -> None:
    check_options(args)
    check_draft_attention_backend(args)
    target_backend = check_target_attention_backend(args)
    check_before_start()
    verify_attention_choice()
    check_verify_attention_backend(target_backend)
    walk_rule()
    spec = inspect_draft(draft_path(args), served_target(args))
    check_tensor_parallel(spec, int(args.tp_size))
    check_block_size(spec, args)
    widths_from_env(spec.head.block_size)


def resolve_server_args(args) -> None:
    spec = inspect_draft(draft_path(args))
    args.speculative_num_draft_tokens = spec.head.block_size
    args.speculative_num_steps = 1
    args.speculative_eagle_topk = 1
    if args.speculative_draft_attention_backend is None:
        args.speculative_draft_attention_backend = SERVED_DRAFT_ATTENTION_BACKENDS[0]
    if args.max_running_requests is None:
        args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
        logger.warning(
            "%s: --max-running-requests defaults to %d, as for DFLASH; set it to override.",
            ALGORITHM_NAME,
            DEFAULT_MAX_RUNNING_REQUESTS,
        )
