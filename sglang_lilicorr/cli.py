"""`lilicorr`: one console script, one subcommand per job. Each job module adds its own
subparsers through `register(subparsers)` and imports its heavy dependencies lazily."""
from __future__ import annotations

import argparse
import importlib
import sys

# module -> the subcommands it registers
JOBS = {
    "sglang_lilicorr.demo": "demo",
    "sglang_lilicorr.train.cli": "regenerate, train, export",
    "sglang_lilicorr.reference.replay_cli": "replay",
    "sglang_lilicorr.benchmarks.cli": "bench",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lilicorr", description="LiLiCorr speculative decoding: demo, training, benchmarks.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in JOBS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
