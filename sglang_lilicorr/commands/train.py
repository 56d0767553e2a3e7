"""Subcommands `lilicorr regenerate | train | export` (registered by the top-level CLI).

lilicorr regenerate --target DIR --recipe --output-dir DATA --exclude EVAL.jsonl [--magpie N --package N ...]
lilicorr regenerate --target DIR --prompts P.jsonl --output OUT.jsonl [--temperature 1 --seed 0]
lilicorr train --target DIR --data DATA/train.jsonl --eval-data DATA/heldout.jsonl --output-dir RUN [--gamma 0.25 ...]
    (multi-GPU: torchrun --nproc-per-node N -m sglang_lilicorr.cli train ...)
lilicorr export RUN[/checkpoints/step-N] OUT_DIR [--dtype bfloat16] [--force]"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path

from ..cli_args import add_command, bounded, finite_float, json_object_arg, path_arg, shell_words_arg, url_arg
from ..cli_args import with_help

CHAT_KWARGS_HELP = 'JSON object passed to the chat template (default {"enable_thinking": false}: reasoning off)'


def register(subparsers) -> None:
    summary = "the target's own answers (and, with --recipe, its own prompts) -> training jsonl"
    _register_regenerate(add_command(subparsers, "regenerate", summary, __doc__))
    summary = "train the DFlash drafter + a head (--head lilicorr, domino, dspark or none) jointly"
    _register_train(add_command(subparsers, "train", summary, __doc__))
    _register_export(add_command(subparsers, "export", "training checkpoint -> SGLang draft directory", __doc__))


def path_text(text: str) -> str:
    """argparse type: a path given as text (the settings keep paths as strings); an empty one is refused."""
    return str(path_arg(text))


# the --help texts of `lilicorr regenerate`, by option
REGENERATE_HELP = {
    "prompts": "answer these prompts: a jsonl of {'id'?, 'messages'} rows (user turns in order)",
    "recipe": "build a training set: the target's own (Magpie) and standard-library prompts, answered -> --output-dir",
    "exclude": "evaluation prompts (jsonl with text / turns / messages) never to train on: a conversation sharing an "
    "8-word shingle with one is dropped (required with --recipe)",
    "magpie": "recipe: self-written conversations to attempt (>= 0)",
    "package": "recipe: standard-library prompts (>= 0)",
    "second_turns": "recipe: share of conversations given a second, self-written user turn (a fraction in [0, 1])",
    "heldout": "recipe: conversations held out of training (>= 0)",
    "minutes": "recipe: start no conversation after this many minutes; the set closes at what was generated, a later "
    "run plays the rest (>= 0; 0: no limit)",
    "chat_template_kwargs": CHAT_KWARGS_HELP,
    "target": "local Hugging Face folder of the target",
    "temperature": "the replies' temperature (>= 0; 0 = greedy)",
    "seed": "sampling seed of the replies (>= 0)",
    "max_new_tokens": "tokens per reply, at most (>= 1)",
    "engine": "what generates: SGLang servers, or transformers in this process; auto = SGLang servers when CUDA is "
    "available, else transformers",
    "url": "running SGLang servers to use instead of launching them (http URLs)",
    "servers": "SGLang servers to launch, one per GPU (>= 1; default: every GPU)",
    "server_args": "extra `sglang.launch_server` arguments, shell-quoted",
    "concurrency": "requests in flight per server (>= 1)",
    "output": "with --prompts: jsonl the conversations are appended to (resumable)",
    "output_dir": "with --recipe: folder for the conversations, the train / heldout splits and manifest.json "
    "(resumable)",
}


def _register_regenerate(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data")
    mode = data.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prompts", type=path_text)
    mode.add_argument("--recipe", action="store_true")
    data.add_argument("--exclude", type=path_text)
    data.add_argument("--magpie", type=bounded(int, 0), default=36000)
    data.add_argument("--package", type=bounded(int, 0), default=4000)
    data.add_argument("--second-turns", type=bounded(float, 0.0, 1.0), default=0.3)
    data.add_argument("--heldout", type=bounded(int, 0), default=256)
    data.add_argument("--minutes", type=bounded(float, 0.0), default=0.0)
    data.add_argument("--chat-template-kwargs", type=json_object_arg, default={})
    model = p.add_argument_group("model")
    model.add_argument("--target", type=path_text, required=True)
    model.add_argument("--temperature", type=bounded(float, 0.0), default=0.0)
    model.add_argument("--seed", type=bounded(int, 0), default=0)
    model.add_argument("--max-new-tokens", type=bounded(int, 1), default=512)
    server = p.add_argument_group("servers")
    server.add_argument("--engine", choices=("auto", "sglang", "transformers"), default="auto")
    server.add_argument("--url", type=url_arg, nargs="+")
    server.add_argument("--servers", type=bounded(int, 1))
    server.add_argument("--server-args", type=shell_words_arg, default="")
    server.add_argument("--concurrency", type=bounded(int, 1), default=256)
    output = p.add_argument_group("output")
    output.add_argument("--output", type=path_text)
    output.add_argument("--output-dir", type=path_text)
    with_help(p, REGENERATE_HELP)
    p.set_defaults(func=run_regenerate)


@contextlib.contextmanager
def generator_for(args: argparse.Namespace, tokenizer, log_dir: Path):
    import torch

    engine = args.engine
    if engine == "auto":
        engine = "sglang" if (args.url or torch.cuda.is_available()) else "transformers"
    if engine == "transformers":
        from transformers import AutoModelForCausalLM

        from ..frozen_target import loading_target
        from ..train.engine import TransformersGenerator

        with loading_target(args.target):
            model = AutoModelForCausalLM.from_pretrained(args.target).eval()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        yield TransformersGenerator(model, pad), "transformers"
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
    from ..train.regenerate import Settings, build_dataset, check_rows_file, claim_dataset_dir, play, prompt_plans
    from ..train.regenerate import recipe_options

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
    guard = eval_guard(args.exclude)  # read before anything loads or is written: its errors are the user's
    with loading_target(args.target):
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    settings = Settings(args.temperature, args.max_new_tokens, seed=args.seed, chat_kwargs=args.chat_template_kwargs)
    out = Path(args.output_dir) if args.recipe else Path(args.output)
    # bad input and a destination that is not ours fail before any server starts or anything is written
    plans = None
    if args.recipe:
        claim_dataset_dir(out)  # marked before the servers' logs go into it
    else:
        check_rows_file(out)
        plans = prompt_plans(args.prompts, guard)
    log_dir = out / "logs" if args.recipe else out.with_name(out.name + ".logs")
    with generator_for(args, tokenizer, log_dir) as (generator, engine):
        if args.recipe:
            command = "lilicorr " + " ".join(map(shlex.quote, sys.argv[1:]))
            describe = {"command": command, "engine": engine, "target": str(Path(args.target).resolve())}
            options = dict(recipe_options(args), exclude=args.exclude, describe=describe)
            result = build_dataset(out, tokenizer, generator, settings, **options)
            print(json.dumps({k: result[k] for k in ("counts", "this_call")}))
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            stats = play(plans, out, tokenizer, generator, settings)
            tokens = stats.generated_tokens
            rate = round(tokens / max(stats.generate_seconds, 1e-9))
            summary = {"generated_tokens": tokens, "tokens_per_s": rate, "dropped": stats.dropped, "engine": engine}
            print(json.dumps(summary))
    return 0


# every `lilicorr train` option (a TrainConfig field each): its group in --help and its text
TRAIN_OPTIONS = {
    "data": {
        "target": "local Hugging Face folder of the target model (frozen; its tokenizer is used)",
        "data": "training conversations: a jsonl of {'messages'} rows, e.g. `lilicorr regenerate`'s train.jsonl",
        "eval_data": "held-out conversations evaluated during the run (default: hold out --eval-examples of --data)",
        "eval_examples": "held-out conversations evaluated at each evaluation (>= 1)",
        "exclude": "evaluation prompts (jsonl): a training conversation that overlaps one is refused",
        "max_length": "tokens per training sequence, at most; longer ones are cut (>= block size + 2)",
        "chat_template_kwargs": CHAT_KWARGS_HELP,
    },
    "model: drafter": {
        "draft_layers": "transformer layers of the DFlash drafter (>= 1)",
        "num_context_features": "target layers whose hidden states feed the drafter, spread evenly (>= 1)",
        "block_size": "B: tokens per drafted block, the anchor included (>= 2; paper: 16)",
        "mask_token": "token filling the drafted slots of a block (default: the tokenizer's mask token; SmolLM2: "
        "'<empty_output>')",
        "draft_intermediate_size": "the drafter's FFN width (>= 0; 0 = the target's)",
        "rope_scaling": "the drafter's rope: default, or yarn to serve inputs longer than it trained on",
        "rope_factor": "yarn: how far the rope is stretched (> 1; with --rope-scaling yarn only)",
        "rope_original_max_position": "yarn: the length it is stretched from, in tokens (>= 0; 0 = the target's "
        "max_position_embeddings)",
        "init_from": "a draft folder whose weights and geometry start the run: a `lilicorr export` or a published "
        "DFlash draft as is (z-lab's layout; docs/BRING_YOUR_OWN_TARGET.md); a resumed run ignores its weights",
    },
    "model: head": {
        "head": "the head trained beside the drafter: lilicorr (the paper), domino, dspark (docs/BASELINES.md) or "
        "none (plain DFlash)",
        "corrector_width": "domino: GRU and MLP width; dspark: Markov rank (>= 0; 0 = the drafter's width)",
        "markov_head_type": "dspark: its Markov head",
        "candidate_topk": "K: candidates kept per slot (a power of two, at most 16)",
        "head_hidden_size": "width of the lattice transformer (a multiple of --head-heads; 0 = the drafter's width)",
        "head_layers": "lattice transformer layers (>= 1)",
        "head_heads": "attention heads of the lattice transformer (>= 1)",
        "head_mlp_ratio": "its FFN width over its width (> 0)",
        "factor_dim": "d_e: width of the unit out / in vectors whose cosines score adjacent slots (>= 1)",
        "logit_scale": "sigma: a pair's score is sigma * cos(out, in) (> 0)",
    },
    "training": {
        "train": "what the run updates: joint (the drafter and the head, the paper) or head (the head alone, on the "
        "--init-from drafter kept frozen: no drafter gradients or optimizer state)"
    },
    "objective": {
        "beta": "DFlash's decay of the per-slot loss weights along the block (> 0)",
        "gamma": "weight of the head's loss beside the drafter's (>= 0; 0 = plain DFlash, no head)",
        "lam": "lambda: weight of the distractor term in the head's loss (>= 0)",
        "use_margin": "the margin-hinge objective (paper App. G) instead of cross-entropy + distractor",
        "mu": "margin objective: share of the hard label (in [0, 1])",
        "rho": "margin objective: the hinge margin (> 0)",
    },
    "optimisation": {
        "lr_drafter": "the drafter's peak learning rate (in (0, 1])",
        "wd_drafter": "the drafter's AdamW weight decay (>= 0)",
        "lr_head": "the head's peak learning rate (in (0, 1])",
        "wd_head": "the head's AdamW weight decay (>= 0)",
        "warmup_ratio": "share of the steps spent warming the learning rates up, then cosine decay (in [0, 1))",
        "grad_clip": "the gradients' norm is clipped to this (> 0)",
        "bf16": "train in bfloat16 autocast (--no-bf16: float32)",
        "epochs": "passes over the training conversations (>= 1)",
        "max_steps": "optimizer steps, at most (>= 0; 0 = as many as --epochs give)",
        "max_minutes": "stop, evaluated and checkpointed, after this many minutes; the schedule is cut there (>= 0; "
        "0 = no limit)",
        "batch_size": "sequences per GPU and micro-step (>= 1)",
        "grad_accum": "micro-steps per optimizer step (>= 1; global batch = batch size x this x GPUs)",
        "num_anchors": "blocks drafted per sequence, at random anchors (>= 1)",
        "seed": "seed of the data order, the anchors and the initial weights (>= 0)",
        "max_bad_steps": "steps with a non-finite loss or gradient skipped before the run stops (>= 1)",
    },
    "output": {
        "output_dir": "the run's folder: checkpoints, metrics, evaluation curves (new, empty, or this run's to resume)",
        "log_every": "log the losses every N steps (>= 1)",
        "eval_every": "evaluate the held-out set and snapshot the weights every N steps (>= 0; 0 = at each log step)",
        "save_every": "write a resumable checkpoint every N steps (>= 1)",
        "keep_checkpoints": "resumable checkpoints kept, the newest (>= 1; older ones are the fallback)",
        "resume": "resume from the run's last good checkpoint (--no-resume: a new run, in a folder that holds none)",
        "move_aside": "with --no-resume: move the run in --output-dir to OUTPUT.old-N first (nothing is deleted)",
        "resume_with_changes": "resume although the data or a setting differs from the checkpoint's",
        "accept_legacy_checkpoints": "resume from checkpoints written before they carried checksums (with a warning)",
    },
}


METAVARS = {int: "N", finite_float: "X"}


def _register_train(p: argparse.ArgumentParser) -> None:
    from ..baselines import MARKOV_HEAD_TYPES
    from ..drafter.config import ROPE_TYPES
    from ..train.config import TRAIN_MODES, TrainConfig
    from ..train.heads import HEADS

    choices = {"head": HEADS, "markov_head_type": MARKOV_HEAD_TYPES, "rope_scaling": ROPE_TYPES, "train": TRAIN_MODES}
    required = {"target", "data", "output_dir"}
    paths = {"target", "data", "eval_data", "exclude", "output_dir", "init_from"}
    groups = {name: p.add_argument_group(name) for name in TRAIN_OPTIONS}
    where = {field: group for group, fields in TRAIN_OPTIONS.items() for field in fields}
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        group = groups[where[field.name]] if field.name in where else p
        text = TRAIN_OPTIONS[where[field.name]][field.name] if field.name in where else None
        if text is not None and field.default not in (dataclasses.MISSING, None):
            text += f" (default: {field.default})"  # argparse's own default is None: TrainConfig knows what was given
        if field.name == "chat_template_kwargs":
            group.add_argument(flag, type=json_object_arg, default=None, help=text)
        elif field.type in ("bool", bool):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            kind = {"int": int, "float": finite_float}.get(str(field.type), path_text if field.name in paths else str)
            group.add_argument(
                flag,
                type=kind,
                metavar=None if field.name in choices else METAVARS.get(kind, "PATH" if kind is path_text else "TEXT"),
                default=None,
                required=field.name in required,
                choices=choices.get(field.name),
                help=text,
            )
    p.set_defaults(func=run_train)


def train_config_from_args(args: argparse.Namespace):
    """The run's TrainConfig; an out-of-range value raises TrainConfigError naming the flag."""
    from ..train.config import TrainConfig

    names = [f.name for f in dataclasses.fields(TrainConfig)]
    return TrainConfig(**{name: getattr(args, name) for name in names if getattr(args, name, None) is not None})


def run_train(args: argparse.Namespace) -> int:
    from ..frozen_target import local_model_dir
    from ..train.heads import load_exported_draft
    from ..train.trainer import train

    cfg = train_config_from_args(args)  # an out-of-range value is a usage error before anything loads
    local_model_dir(cfg.target)
    if cfg.init_from:  # a damaged draft is refused before the run's folder is made (the trainer loads it later)
        load_exported_draft(cfg.init_from)
    metrics = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank returns the same pooled metrics
        print(json.dumps(metrics))
    return 0


EXPORT_HELP = {  # the --help texts of `lilicorr export`
    "checkpoint": "a training run's folder (its latest checkpoint) or RUN/checkpoints/step-N",
    "out_dir": "draft folder to write (config.json + model.safetensors): a new or empty folder, or an earlier export, "
    "which it replaces",
    "dtype": "dtype of the exported tensors (SGLang serves bfloat16 drafts)",
    "force": "write the draft into OUT_DIR although it holds other files, which are kept as they are (hard-linked "
    "into the new folder that takes OUT_DIR's place; never into a training run, a model folder or over files not a "
    "draft's)",
    "accept_legacy_checkpoints": "export a checkpoint written before checkpoints carried checksums (said with a "
    "warning)",
}


def _register_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=path_text)
    p.add_argument("out_dir", type=path_text)
    output = p.add_argument_group("output")
    output.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    output.add_argument("--force", action="store_true")
    p.add_argument_group("data").add_argument("--accept-legacy-checkpoints", action="store_true")
    with_help(p, EXPORT_HELP)
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from ..train.export import export_checkpoint
    from ..train.heads import load_exported_draft

    path = export_checkpoint(
        args.checkpoint, args.out_dir, args.dtype, force=args.force, legacy=args.accept_legacy_checkpoints
    )
    _, head = load_exported_draft(path)  # strict reload: the export is usable as written
    architecture = json.loads((path / "config.json").read_text())["architectures"][0]
    what = type(head).__name__ if head is not None else "no head"
    print(f"exported {architecture} ({what}) -> {path}", file=sys.stderr)
    return 0
