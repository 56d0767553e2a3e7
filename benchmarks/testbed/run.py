"""The testbed's command line, `python -m benchmarks testbed STEP ...`: the options every step shares, then each
step's own, as its module declares them (its STEP: common.Step).

On the project's GPU machine the steps run through `bash benchmarks/device/testbed.sh STEP ...` (the device kit's
environment). WORK defaults to /tmp/testbed, the target to /tmp/smol/model; $OUT receives small copies. Every step
resumes: what a step finished is not redone. See variants.py for sizes, variants and the sweep. One setting comes
from the environment, because a device call's wrapper sets it for every step of the call: TESTBED_DEADLINE (epoch
seconds), past which a step that would not finish exits 4 instead of starting.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from . import compare, data, eval_sets, evalgen, export, long_pack, long_serve, prompts, replay, report, speed, startup
from . import sweep, train
from .common import SERVER_ARGS, with_backends

STEPS = (
    prompts.STEP,
    data.STEP,
    sweep.STEP,
    train.TRAIN,
    train.WAIT,
    export.STEP,
    evalgen.STEP,
    replay.STEP,
    speed.STEP,
    startup.STEP,
    compare.STEP,
    report.STEP,
    long_pack.STEP,
    long_serve.STEP,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/testbed", help="work directory (default /tmp/testbed)")
    p.add_argument("--target", default="/tmp/smol/model", help="HF folder of the target")
    p.add_argument("--out", default=os.environ.get("OUT"), help="copy small results here (default $OUT)")
    p.add_argument("--eval-prompts", default=str(eval_sets.DEFAULT_FILE))
    p.add_argument(
        "--override", action="append", help="KEY=JSON over variants.SCALE / SCHEDULE (tests shrink the models)"
    )
    p.add_argument(
        "--long",
        action="store_true",
        help="the long-input lineage: variants.LONG over the schedule (use a --work of its own)",
    )
    p.add_argument(
        "--paper-recipe",
        action="store_true",
        help="the paper's recipe: variants.PAPER_RECIPE over the schedule, sequences up to 3,072 tokens (use a --work "
        "of its own; `data` then tokenizes at that length)",
    )
    p.add_argument(
        "--server-args",
        default=SERVER_ARGS,
        help="the SGLang servers' arguments (default: what the GPU "
        "machine's kit needs); the `speed` and `long-serve` steps set their pools and graphs over them",
    )
    p.add_argument(
        "--attention-backend",
        metavar="BACKEND",
        help="the target's --attention-backend in every server of every step, over --server-args' (e.g. flashinfer; "
        "the `speed` step keeps another backend's rounds in a setting folder of its own, WORK/speed/SETTING_BACKEND)",
    )
    p.add_argument(
        "--sampling-backend",
        metavar="BACKEND",
        help="the servers' --sampling-backend, over --server-args' (e.g. flashinfer)",
    )
    p.add_argument(
        "--engine",
        choices=("sglang", "transformers"),
        default="sglang",
        help="what generates for `data` and "
        "`evalgen`: SGLang servers, one per GPU, or the target in this process through transformers (CPU)",
    )
    p.add_argument(
        "--server-launch",
        metavar="CMD",
        help="tests: start each server of `speed`, `startup` and `long-serve` with CMD "
        "(a stand-in that serves $PORT) instead of SGLang",
    )
    sub = p.add_subparsers(dest="step", required=True)
    for step in STEPS:
        parser = sub.add_parser(step.name, help=step.help)
        step.arguments(parser)
        parser.set_defaults(func=step.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.attention_backend or args.sampling_backend:
        args.server_args = with_backends(args.server_args, args.attention_backend, args.sampling_backend)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return int(args.func(args) or 0)
