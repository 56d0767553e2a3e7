"""`lilicorr`: one console script, one subcommand per job. Each job module adds its own
subparsers through `register(subparsers)` and imports its heavy dependencies lazily.

Every subcommand answers bad input with one line on stderr, `error: <what> (<where>): <fix>`, and
exits 2 for a usage error (argparse's, or a `UsageError`), 1 for any other error: the project's own
(`LiLiCorrError`), a file that cannot be read or written (`OSError`), or an unexpected exception,
which the line names with the file:line it was raised at. `LILICORR_DEBUG=1` re-raises instead,
with the full traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from .errors import LiLiCorrError, describe

# module -> the subcommands it registers
JOBS = {
    "sglang_lilicorr.demo": "demo",
    "sglang_lilicorr.check_draft": "check-draft",
    "sglang_lilicorr.train.cli": "regenerate, train, export",
    "sglang_lilicorr.reference.replay_cli": "replay",
    "sglang_lilicorr.benchmarks.cli": "bench",
}


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (its subparsers are of this class too)."""

    def error(self, message: str):
        self.exit(2, f"error: {describe(message, self.prog, f'see `{self.prog} --help`')}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lilicorr", description="LiLiCorr speculative decoding: demo, training, benchmarks.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in JOBS:
        importlib.import_module(module).register(sub)
    return parser


def error_line(e: BaseException) -> str:
    """The one line `lilicorr` prints for an error that ends a subcommand."""
    if isinstance(e, LiLiCorrError):
        text = str(e)
    elif isinstance(e, ConnectionError):  # a server that is not there (aiohttp's connector errors are OSErrors too)
        text = describe(e.strerror or str(e), e.filename, "check that the server is up and the URL")
    elif isinstance(e, OSError):
        text = describe(e.strerror or str(e), e.filename, "check the path, its permissions and the free disk space")
    else:
        text = describe(f"unexpected {type(e).__name__}: {e}", raised_at(e),
                        "this is a bug; rerun with LILICORR_DEBUG=1 for the traceback and report it")
    return "error: " + " ".join(text.split())


def raised_at(e: BaseException) -> str | None:
    """file:line of the innermost frame of ours (sglang_lilicorr.*, past this module) that the exception
    passed through, else of the innermost frame."""
    frames = list(traceback.walk_tb(e.__traceback__))
    modules = [frame.f_globals.get("__name__", "") for frame, _ in frames]
    ours = [f for f, module in zip(frames, modules) if module.startswith("sglang_lilicorr.") and module != __name__]
    if not frames:
        return None
    frame, line = (ours or frames)[-1]
    return f"{frame.f_code.co_filename}:{line}"


def run(args: argparse.Namespace) -> int:
    """Runs the parsed subcommand (`args.func`); an error ends it as one line and an exit code."""
    try:
        return int(args.func(args) or 0)
    except (Exception, KeyboardInterrupt) as e:
        if os.environ.get("LILICORR_DEBUG") == "1":
            raise
        if isinstance(e, KeyboardInterrupt):
            print("error: interrupted (SIGINT): every file is whole, as before or as written; rerun the same command to go on",
                  file=sys.stderr)
            return 130
        print(error_line(e), file=sys.stderr)
        return e.exit_code if isinstance(e, LiLiCorrError) else 1


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
