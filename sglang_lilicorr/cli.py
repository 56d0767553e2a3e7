"""`lilicorr`: one console script; each job module adds its subparsers through `register(subparsers)`."""

from __future__ import annotations

import argparse
import signal
import sys

from .bench import cli as bench
from .cli_args import Parser, run
from .commands import check_draft, demo, replay, train

JOBS = (demo, check_draft, train, replay, bench)  # demo; check-draft; regenerate, train, export; replay; bench


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lilicorr", description="LiLiCorr speculative decoding: demo, training, benchmarks.")
    sub = parser.add_subparsers(dest="command", required=True)
    for job in JOBS:
        job.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`lilicorr ARGV...` -> its exit code; as the program (no `argv`), an interrupt after the command is ignored."""
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 1
        return run(args)
    finally:
        if argv is None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
