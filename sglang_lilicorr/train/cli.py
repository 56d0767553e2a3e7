"""Subcommands `lilicorr regenerate | train | export` (registered by the top-level CLI).

  lilicorr regenerate --target DIR --prompts P.jsonl --output TRAIN.jsonl [--exclude EVAL.jsonl]
  lilicorr train --target DIR --data TRAIN.jsonl --output-dir RUN [--gamma 0.25 ...]
      (multi-GPU: torchrun --nproc-per-node N -m sglang_lilicorr.cli train ...)
  lilicorr export RUN[/checkpoints/step-N] OUT_DIR [--dtype bfloat16] [--force]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

CHAT_KWARGS_HELP = 'JSON object passed to the chat template (default {"enable_thinking": false}: reasoning off)'


def register(subparsers) -> None:
    _register_regenerate(subparsers.add_parser("regenerate", help="target's own greedy answers to prompts -> training jsonl"))
    _register_train(subparsers.add_parser("train", help="train the DFlash drafter + LiLiCorr head jointly"))
    _register_export(subparsers.add_parser("export", help="training checkpoint -> SGLang draft directory"))


def json_object_arg(text: str) -> dict:
    """argparse type: a JSON object, e.g. '{"enable_thinking": false}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


# --- regenerate ---------------------------------------------------------------------------


def _register_regenerate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="HF model directory of the target")
    p.add_argument("--prompts", required=True, help="jsonl of {'id'?, 'messages'} rows")
    p.add_argument("--output", required=True, help="jsonl to append regenerated conversations to (resumable)")
    p.add_argument("--exclude", help="evaluation prompts jsonl: these prompts are never written")
    p.add_argument("--engine", choices=("auto", "sglang", "transformers"), default="auto",
                   help="auto = SGLang's offline engine when CUDA is available, else transformers")
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--chat-template-kwargs", type=json_object_arg, default={"enable_thinking": False}, help=CHAT_KWARGS_HELP)
    p.add_argument("--engine-kwargs", type=json_object_arg, default={}, help="JSON object of extra sglang.Engine arguments")
    p.set_defaults(func=run_regenerate)


def run_regenerate(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from ..frozen_target import local_model_dir
    from .regenerate import regenerate, sglang_generator, transformers_generator

    local_model_dir(args.target)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    engine = args.engine
    if engine == "auto":
        engine = "sglang" if torch.cuda.is_available() else "transformers"
    shutdown = None
    if engine == "sglang":
        generate, shutdown = sglang_generator(args.target, args.max_new_tokens, **args.engine_kwargs)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.target).eval()
        generate = transformers_generator(model, tokenizer, args.max_new_tokens)
    try:
        counts = regenerate(args.prompts, args.output, tokenizer, generate, args.exclude, args.batch_size, args.chat_template_kwargs)
    finally:
        if shutdown is not None:
            shutdown()
    print(json.dumps(counts))
    return 0


# --- train --------------------------------------------------------------------------------


def _register_train(p: argparse.ArgumentParser) -> None:
    from .trainer import TrainConfig

    required = {"target", "data", "output_dir"}
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.name == "chat_template_kwargs":
            p.add_argument(flag, type=json_object_arg, default=None, help=CHAT_KWARGS_HELP)
        elif field.type in ("bool", bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            kind = {"int": int, "float": float}.get(str(field.type), str)
            p.add_argument(flag, type=kind, default=None, required=field.name in required,
                           help=None if field.name in required else f"default {field.default}")
    p.set_defaults(func=run_train)


def train_config_from_args(args: argparse.Namespace):
    from .trainer import TrainConfig

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if getattr(args, f.name, None) is not None}
    return TrainConfig(**given)


def run_train(args: argparse.Namespace) -> int:
    from .trainer import train

    metrics = train(train_config_from_args(args))
    print(json.dumps(metrics))
    return 0


# --- export -------------------------------------------------------------------------------


def _register_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="training output dir (latest checkpoint) or OUTPUT/checkpoints/step-N")
    p.add_argument("out_dir", help="draft directory to write (config.json + model.safetensors): a new or empty folder, "
                   "or an earlier export, which it replaces")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--force", action="store_true", help="replace OUT_DIR even if it holds other files (never a training run)")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from ..drafter import load_draft
    from .export import export_checkpoint

    path = export_checkpoint(args.checkpoint, args.out_dir, args.dtype, force=args.force)
    _, head = load_draft(path)  # strict reload: the export is usable as written
    kind = "LiLiCorrDraftModel" if head is not None else "DFlashDraftModel"
    print(f"exported {kind} -> {path}", file=sys.stderr)
    return 0
