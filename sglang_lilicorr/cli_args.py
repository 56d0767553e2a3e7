"""The parts every `lilicorr` subcommand shares, in a leaf module (it imports only `errors`): the parser class whose
errors are one line, the argparse types, and how an error ends a subcommand.

Every subcommand answers bad input with one line on stderr, `error: <what> (<where>): <fix>`, and exits 2 for a
usage error (argparse's, or a `UsageError`), 1 for any other error: the project's own (`LiLiCorrError`), a file that
cannot be read or written (`OSError`), or an unexpected exception, which the line names with the file:line it was
raised at. `LILICORR_DEBUG=1` re-raises instead, with the full traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from .errors import LiLiCorrError, describe


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (its subparsers are of this class too)."""

    def error(self, message: str):
        self.exit(2, f"error: {describe(message, self.prog, f'see `{self.prog} --help`')}\n")


def add_documented_command(subparsers, name: str, help: str, doc: str) -> argparse.ArgumentParser:
    """A subcommand whose --help prints `doc` (its module's docstring) with its line breaks kept."""
    return subparsers.add_parser(name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def json_object_arg(text: str) -> dict:
    """argparse type: a JSON object, e.g. '{"enable_thinking": false}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


def error_line(e: BaseException) -> str:
    """The one line `lilicorr` prints for an error that ends a subcommand."""
    if isinstance(e, LiLiCorrError):
        text = str(e)
    elif isinstance(e, ConnectionError):  # a server that is not there (aiohttp's connector errors are OSErrors too)
        text = describe(e.strerror or str(e), e.filename, "check that the server is up and the URL")
    elif isinstance(e, OSError):
        text = describe(e.strerror or str(e), e.filename, "check the path, its permissions and the free disk space")
    else:
        text = describe(
            f"unexpected {type(e).__name__}: {e}",
            raised_at(e),
            "this is a bug; rerun with LILICORR_DEBUG=1 for the traceback and report it",
        )
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
            print(
                "error: interrupted (SIGINT): every file is whole, as before or as written; "
                "rerun the same command to go on",
                file=sys.stderr,
            )
            return 130
        print(error_line(e), file=sys.stderr)
        return e.exit_code if isinstance(e, LiLiCorrError) else 1
