"""What `lilicorr` subcommands share (imports only `errors`): the parser, checking argparse types, how an error ends
one: `error: <what> (<where>): <fix>`, exit 2 (usage) or 1 (a bug names its file:line; LILICORR_DEBUG=1 re-raises)."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import shlex
import sys
import traceback
from pathlib import Path

from .errors import LiLiCorrError, UsageError, describe


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help keeps a command's description as written and ends each option's text with its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or default == [] or default == {}:
            return text
        return text if "default" in text else f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors naming the command's --help, and the closest option to an unknown one."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:  # a command with no subcommands: the words left are unknown to it
            self.error(f"unrecognized arguments: {' '.join(extras)}" + self.closest(extras))
        return namespace, extras

    def closest(self, words: list[str]) -> str:
        """'; did you mean --x?' for the first unknown option close to one of this command's, else ''."""
        known = {o[2:]: o for action in self._actions for o in action.option_strings if o.startswith("--")}
        for word in words:
            if word.startswith("--"):
                match = difflib.get_close_matches(word.split("=", 1)[0][2:], list(known), n=1, cutoff=0.75)
                if match:
                    return f"; did you mean {known[match[0]]}?"
        return ""

    def error(self, message: str):
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            names = re.findall(r"'([^']*)'", choice.group(2))
            match = difflib.get_close_matches(choice.group(1), names, n=1, cutoff=0.6)
            message += f"; did you mean {match[0]}?" if match else ""
        self.exit(2, f"error: {describe(message, self.prog, f'see `{self.prog} --help`')}\n")


def add_command(subparsers, name: str, help: str, doc: str | None = None) -> argparse.ArgumentParser:
    """A subcommand; its --help prints `doc` (its module's docstring) with its line breaks kept."""
    return subparsers.add_parser(name, help=help, description=doc or help)


def with_help(parser: argparse.ArgumentParser, texts: dict[str, str]) -> None:
    """Each option `texts` names by its dest gets that --help text (a command keeps its texts in one table)."""
    actions = {action.dest: action for action in parser._actions}
    for dest, text in texts.items():
        actions[dest].help = text


def bounded(kind: type, low: float, high: float | None = None, *, above: bool = False):
    """argparse type: a finite `kind` in [low, high] ((low, high] when `above`; high None: no upper bound)."""
    noun = "an integer" if kind is int else "a number"
    what = f"{noun} {'>' if above else '>='} {low:g}"
    if high is not None:
        what = f"{noun} in {'(' if above else '['}{low:g}, {high:g}]"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value) or value < low or (above and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    parse.allowed = what  # for --help texts and the tests
    return parse


def finite_float(text: str) -> float:
    """argparse type: a finite number (its range is the command's to check)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def path_arg(text: str) -> Path:
    """argparse type: a path; an empty one (which would name the current folder) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file or folder; pass one")
    return Path(text)


def url_arg(text: str) -> str:
    """argparse type: an http(s) URL."""
    if not re.match(r"https?://[^/\s]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL, e.g. http://127.0.0.1:30000")
    return text.rstrip("/")


def shell_words_arg(text: str) -> str:
    """argparse type: a string of shell words (`shlex` must split it)."""
    try:
        shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} does not split into shell words ({e})") from None
    return text


def json_object_arg(text: str) -> dict:
    """argparse type: a JSON object, e.g. '{"enable_thinking": false}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({e})") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object, e.g. '{{\"enable_thinking\": false}}'")
    return value


def one_level_down(path: str | os.PathLike, fallback: str, marker: str = "config.json") -> str:
    """The fix for a folder lacking `marker`: the folder(s) one level down that hold it, else `fallback`."""
    folder = Path(path)
    try:
        found = sorted(str(p) for p in folder.iterdir() if (p / marker).is_file()) if folder.is_dir() else []
    except OSError:
        found = []
    if not found:
        return fallback
    return f"pass {' or '.join(found[:3])}{', ...' if len(found) > 3 else ''} (one level down, with its {marker})"


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
    """file:line of the innermost frame of ours (past this module) the exception passed, else the innermost."""
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
        if os.environ.get("LILICORR_DEBUG") == "1" and not isinstance(e, UsageError):
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
