"""`lilicorr check-draft DRAFT --target TARGET`: is DRAFT servable as LILICORR on TARGET? Offline, no GPU or server:
the checks a LILICORR server runs before it starts (serving/draft_check.py), then the strict loader (every tensor's
name, shape, dtype and finiteness). Prints what the draft is, or every problem, one `error:` line each; exit 0 / 1."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cli_args import add_command, error_line, one_level_down, path_arg, with_help
from ..errors import LiLiCorrError, UsageError
from ..jsonl import loads

CHECK_DRAFT_HELP = {  # the --help texts of `lilicorr check-draft`
    "draft": "draft folder (config.json + model.safetensors), as `lilicorr export` writes it",
    "target": "local folder of the target model the draft is to serve (only its config.json is read)",
}


def register(subparsers) -> None:
    summary = "validate a draft against a target offline, with the LILICORR server's own checks"
    p = add_command(subparsers, "check-draft", summary, __doc__)
    p.add_argument("draft", type=path_arg)
    p.add_argument_group("model").add_argument("--target", type=path_arg, required=True)
    with_help(p, CHECK_DRAFT_HELP)
    p.set_defaults(func=run_check_draft)


def target_config(folder: Path) -> dict:
    from ..frozen_target import local_model_dir
    from ..serving.draft_check import ServingConfigError

    path = local_model_dir(folder) / "config.json"
    try:
        config = loads(path.read_bytes().decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON, too deep
        raise ServingConfigError(f"{path} is not valid JSON ({e}); pass the target's own folder.") from e
    if not isinstance(config, dict):
        raise ServingConfigError(f"{path} is not a JSON object; pass the target's own folder.")
    return config


def describe_draft(spec, target_shape, drafter, target: Path) -> list[str]:
    """What check-draft prints for a servable draft."""
    d, h = drafter.config, spec.head
    width = f"{h.hidden_size}" if h.hidden_size else f"{d.hidden_size} (the drafter's)"
    return [
        f"draft {spec.path}: {spec.config['architectures'][0]}, "
        f"torch_dtype {spec.config.get('torch_dtype', 'bfloat16')}",
        f"  drafter: hidden {d.hidden_size}, vocab {d.vocab_size}, "
        f"{d.num_hidden_layers} layer(s) of {d.num_attention_heads} heads ({d.num_key_value_heads} kv) x {d.head_dim}, "
        f"FFN {d.intermediate_size}, block {d.block_size}",
        f"  target layers {list(d.target_layer_ids)} of {d.num_target_layers}, "
        f"mask token {d.mask_token!r} (id {d.mask_token_id})",
        f"  rope: theta {d.rope_theta:g}, scaling {d.rope_scaling.describe()}; "
        f"positions up to {d.max_position_embeddings}",
        f"  head: K={h.candidate_topk}, width {width}, {h.num_layers} layer(s) of {h.num_heads} heads, "
        f"d_e {h.factor_dim}, sigma {h.logit_scale:g}",
        f"target {target}: hidden {target_shape.hidden_size}, vocab {target_shape.vocab_size}, "
        f"{target_shape.num_layers} layers, context {target_shape.context_length}",
        f"ok: serve with --model-path {target} --speculative-algorithm LILICORR "
        f"--speculative-draft-model-path {spec.path}",
    ]


def run_check_draft(args: argparse.Namespace) -> int:
    from ..drafter import load_draft
    from ..serving.draft_check import TargetShape, examine_draft

    if not (args.draft / "config.json").is_file():
        found = "a folder without config.json" if args.draft.is_dir() else "not an existing folder"
        raise UsageError(
            f"{str(args.draft)!r} is {found}",
            where="DRAFT",
            fix=one_level_down(
                args.draft, "pass a draft folder (config.json + model.safetensors, as `lilicorr export` writes it)"
            ),
        )
    shape = TargetShape.of(target_config(args.target))
    report = examine_draft(args.draft, shape, option="DRAFT")
    problems: list[LiLiCorrError] = list(report.problems)
    drafter = None
    if not problems:
        try:
            drafter, _ = load_draft(args.draft)
        except LiLiCorrError as e:
            problems.append(e)
    for problem in problems:
        print(error_line(problem), file=sys.stderr)
    if problems:
        print(
            f"{args.draft}: {len(problems)} problem(s); LILICORR would refuse this draft on {args.target}.",
            file=sys.stderr,
        )
        return 1
    print("\n".join(describe_draft(report.spec, shape, drafter, args.target)))
    return 0
