"""`lilicorr`: one console script, one subcommand per job. Each job module adds its subparsers through
`register(subparsers)` and imports its heavy dependencies lazily; the parser class and the error rule they share are
sglang_lilicorr/cli_args.py's (a leaf module, so no job imports this one back).
"""

from __future__ import annotations

import argparse
import sys

from . import check_draft, demo
from .benchmarks import cli as bench_cli
from .cli_args import Parser, run
from .reference import replay_cli
from .train import cli as train_cli

JOBS = (
    demo,
    check_draft,
    train_cli,
    replay_cli,
    bench_cli,
)  # demo; check-draft; regenerate, train, export; replay; bench


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lilicorr", description="LiLiCorr speculative decoding: demo, training, benchmarks.")
    sub = parser.add_subparsers(dest="command", required=True)
    for job in JOBS:
        job.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
