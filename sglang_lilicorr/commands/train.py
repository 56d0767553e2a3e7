"""Subcommands `lilicorr regenerate | train | export` (registered by the top-level CLI).

lilicorr regenerate --target DIR --recipe --output-dir DATA --exclude EVAL.jsonl [--magpie N --package N ...]
lilicorr regenerate --target DIR --prompts P.jsonl --output OUT.jsonl [--temperature 1 --seed 0]
lilicorr train --target DIR --data DATA/train.jsonl --eval-data DATA/heldout.jsonl --output-dir RUN [--gamma 0.25 ...]
    (multi-GPU: torchrun --nproc-per-node N -m sglang_lilicorr.cli train ...)
lilicorr export RUN[/checkpoints/step-N] OUT_DIR [--dtype bfloat16] [--force]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path

from ..cli_args import json_object_arg

CHAT_KWARGS_HELP = 'JSON object passed to the chat template (default {"enable_thinking": false}: reasoning off)'


def register(subparsers) -> None:
    _register_regenerate(
        subparsers.add_parser(
            "regenerate", help="the target's own answers (and, with --recipe, its own prompts) -> training jsonl"
        )
    )
    _register_train(
        subparsers.add_parser(
            "train", help="train the DFlash drafter + a head (--head lilicorr, domino, dspark or none) jointly"
        )
    )
    _register_export(subparsers.add_parser("export", help="training checkpoint -> SGLang draft directory"))


def bounded(kind, low, high=None):
    """argparse type: a `kind` number in [low, high]."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not (value >= low and (high is None or value <= high)) or value != value:
            raise argparse.ArgumentTypeError(f"{text} is outside [{low}, {'inf' if high is None else high}]")
        return value

    return parse


# --- regenerate ---------------------------------------------------------------------------


def _register_regenerate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="HF model directory of the target")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--prompts", help="prompt file: jsonl of {'id'?, 'messages'} rows (user turns are played in order)"
    )
    mode.add_argument(
        "--recipe", action="store_true", help="build a training set: Magpie + standard-library prompts -> --output-dir"
    )
    p.add_argument("--output", help="with --prompts: jsonl the conversations are appended to (resumable)")
    p.add_argument(
        "--output-dir", help="with --recipe: directory for conversations, train/heldout splits and manifest.json"
    )
    p.add_argument(
        "--exclude",
        help="evaluation prompts (jsonl with text / turns / messages): never trained on (required with --recipe)",
    )
    p.add_argument(
        "--magpie", type=bounded(int, 0), default=36000, help="self-written conversations to attempt (recipe)"
    )
    p.add_argument("--package", type=bounded(int, 0), default=4000, help="standard-library prompts (recipe)")
    p.add_argument(
        "--second-turns",
        type=bounded(float, 0.0, 1.0),
        default=0.3,
        help="share of conversations given a second, self-written user turn (recipe)",
    )
    p.add_argument("--heldout", type=bounded(int, 0), default=256, help="conversations kept out of training (recipe)")
    p.add_argument(
        "--minutes",
        type=bounded(float, 0.0),
        default=0.0,
        help="start no conversation after this many minutes; "
        "the set closes at what was generated, a later run plays the rest (recipe; 0: no limit)",
    )
    p.add_argument(
        "--temperature", type=bounded(float, 0.0), default=0.0, help="replies' temperature (0 = greedy, as the paper)"
    )
    p.add_argument("--seed", type=bounded(int, 0), default=0)
    p.add_argument("--max-new-tokens", type=bounded(int, 1), default=512, help="per reply")
    p.add_argument(
        "--engine",
        choices=("auto", "sglang", "transformers"),
        default="auto",
        help="auto = SGLang servers when CUDA is available, else transformers",
    )
    p.add_argument("--url", nargs="+", help="running SGLang servers to use instead of launching them")
    p.add_argument(
        "--servers", type=bounded(int, 1), help="SGLang servers to launch, one per GPU (default: every visible GPU)"
    )
    p.add_argument("--server-args", default="", help="extra `sglang.launch_server` arguments, one shell-quoted string")
    p.add_argument("--concurrency", type=bounded(int, 1), default=256, help="requests in flight per server")
    p.add_argument("--chat-template-kwargs", type=json_object_arg, default={}, help=CHAT_KWARGS_HELP)
    p.set_defaults(func=run_regenerate)


@contextlib.contextmanager
def generator_for(args: argparse.Namespace, tokenizer, log_dir: Path):
    import torch

    engine = args.engine
    if engine == "auto":
        engine = "sglang" if (args.url or torch.cuda.is_available()) else "transformers"
    if engine == "transformers":
        from transformers import AutoModelForCausalLM

        from ..train.engine import TransformersGenerator

        from ..frozen_target import loading_target

        with loading_target(args.target):
            model = AutoModelForCausalLM.from_pretrained(args.target).eval()
        yield (
            TransformersGenerator(
                model, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            ),
            "transformers",
        )
        return
    from ..train.engine import SGLangServers

    if args.url:
        yield SGLangServers(args.url, args.concurrency), f"sglang servers {args.url}"
        return
    gpus = args.servers or max(1, torch.cuda.device_count())
    with SGLangServers.launch(
        args.target, gpus, server_args=shlex.split(args.server_args), log_dir=log_dir, concurrency=args.concurrency
    ) as servers:
        yield servers, f"{gpus} sglang servers ({args.server_args or 'default arguments'})"


def run_regenerate(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from ..errors import UsageError
    from ..frozen_target import loading_target, local_model_dir
    from ..train.prompts import eval_guard
    from ..train.regenerate import (
        Settings,
        build_dataset,
        check_rows_file,
        claim_dataset_dir,
        play,
        prompt_plans,
        recipe_options,
    )

    local_model_dir(args.target)
    if args.recipe and not (args.output_dir and args.exclude):
        raise UsageError(
            "--recipe needs --output-dir and --exclude",
            where="--recipe",
            fix="pass where the data goes and the evaluation prompts to keep out",
        )
    if args.prompts and not args.output:
        raise UsageError(
            "--prompts needs --output", where="--prompts", fix="pass the jsonl the conversations are appended to"
        )
    with loading_target(args.target):
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    settings = Settings(
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        chat_kwargs=args.chat_template_kwargs,
    )
    out = Path(args.output_dir) if args.recipe else Path(args.output)
    # bad input and a destination that is not ours fail before any server starts or anything is written
    if args.recipe:
        claim_dataset_dir(out, create=False)
    else:
        check_rows_file(out)
    plans = None if args.recipe else prompt_plans(args.prompts, eval_guard(args.exclude))
    if args.recipe:
        claim_dataset_dir(out)  # marked before the servers' logs go into it
    log_dir = out / "logs" if args.recipe else out.with_name(out.name + ".logs")
    with generator_for(args, tokenizer, log_dir) as (generator, engine):
        if args.recipe:
            result = build_dataset(
                out,
                tokenizer,
                generator,
                settings,
                **recipe_options(args),
                exclude=args.exclude,
                describe={
                    "command": "lilicorr " + " ".join(map(shlex.quote, sys.argv[1:])),
                    "engine": engine,
                    "target": str(Path(args.target).resolve()),
                },
            )
            print(json.dumps({k: result[k] for k in ("counts", "this_call")}))
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            stats = play(plans, out, tokenizer, generator, settings)
            print(
                json.dumps(
                    {
                        "generated_tokens": stats.generated_tokens,
                        "tokens_per_s": round(stats.generated_tokens / max(stats.generate_seconds, 1e-9)),
                        "dropped": stats.dropped,
                        "engine": engine,
                    }
                )
            )
    return 0


# --- train --------------------------------------------------------------------------------


def _register_train(p: argparse.ArgumentParser) -> None:
    from ..train.config import TrainConfig

    required = {"target", "data", "output_dir"}
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.name == "chat_template_kwargs":
            p.add_argument(flag, type=json_object_arg, default=None, help=CHAT_KWARGS_HELP)
        elif field.type in ("bool", bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            kind = {"int": int, "float": float}.get(str(field.type), str)
            p.add_argument(
                flag,
                type=kind,
                default=None,
                required=field.name in required,
                help=None if field.name in required else f"default {field.default}",
            )
    p.set_defaults(func=run_train)


def train_config_from_args(args: argparse.Namespace):
    """The run's TrainConfig; an out-of-range value raises TrainConfigError naming the flag."""
    from ..train.config import TrainConfig

    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if getattr(args, f.name, None) is not None
    }
    return TrainConfig(**given)


def run_train(args: argparse.Namespace) -> int:
    from ..frozen_target import local_model_dir
    from ..train.trainer import train

    cfg = train_config_from_args(args)  # an out-of-range value is a usage error before anything loads
    local_model_dir(cfg.target)
    metrics = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank returns the same pooled metrics
        print(json.dumps(metrics))
    return 0


# --- export -------------------------------------------------------------------------------


def _register_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="training output dir (latest checkpoint) or OUTPUT/checkpoints/step-N")
    p.add_argument(
        "out_dir",
        help="draft directory to write (config.json + model.safetensors): a new or empty folder, "
        "or an earlier export, which it replaces",
    )
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument(
        "--force",
        action="store_true",
        help="write the draft's two files into OUT_DIR although it holds other files, "
        "which are kept "
        "(--force deletes nothing; never into a training run, a model folder or over files not a draft's)",
    )
    p.add_argument(
        "--accept-legacy-checkpoints",
        action="store_true",
        help="export a checkpoint written before checkpoints carried checksums (said with a warning)",
    )
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from ..train.export import export_checkpoint
    from ..train.heads import load_exported_draft

    path = export_checkpoint(
        args.checkpoint, args.out_dir, args.dtype, force=args.force, legacy=args.accept_legacy_checkpoints
    )
    _, head = load_exported_draft(path)  # strict reload: the export is usable as written
    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    print(
        f"exported {architecture} ({type(head).__name__ if head is not None else 'no head'}) -> {path}", file=sys.stderr
    )
    return 0
