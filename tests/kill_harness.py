"""Runs `lilicorr ARGS` (as the program: `sglang_lilicorr.cli.main()` on sys.argv) and kills itself with SIGNAL at its
AT-th write point: the AT-th call, from our code, of os.replace, os.fsync, os.link, shutil.rmtree, ownership.exchange
(a folder swapped for its new copy), ownership.put_back (a replaced folder emptied, each of its folders) or a file
opened to write or append (just before it happens). AT may instead name a point: `exchange` (the first swap),
`put_back` (the first emptying, once the swap is done) or `end` (once the command has returned, before the
interpreter's exit hooks).
Exits as `lilicorr` would if it never gets there.

  python tests/kill_harness.py AT SIGKILL|SIGINT|SIGTERM -- lilicorr arguments ...
"""

import builtins
import io
import os
import shutil
import signal
import sys


def run(at: str, sig: int, args: list[str]) -> int:
    """`lilicorr ARGS` in this process, killed with `sig` at write point `at` (the module docstring); its exit code
    where it is not killed. It hooks this process's os, shutil, open and ownership for good: run it in a process of
    its own (this script, or a child forked for it)."""
    count = [0]

    def point(name: str) -> None:
        frame = sys._getframe(2)
        while frame is not None and frame.f_globals.get("__name__") in (
            "pathlib",
            "os",
            "shutil",
            "io",
            "tempfile",
            "contextlib",
        ):
            frame = frame.f_back  # through the standard library's wrappers to their caller
        if frame is None or not frame.f_globals.get("__name__", "").startswith("sglang_lilicorr"):
            return
        count[0] += 1
        if str(count[0]) == at or name == at:
            os.kill(os.getpid(), sig)

    def wrap(original, name, writes=lambda *a, **k: True):
        def hooked(*a, **k):
            if writes(*a, **k):
                point(name)
            return original(*a, **k)

        return hooked

    def opens_to_write(file, mode="r", *a, **k):
        return isinstance(mode, str) and any(c in mode for c in "wax+")

    from sglang_lilicorr import ownership

    os.replace = wrap(os.replace, "replace")
    os.fsync = wrap(os.fsync, "fsync")
    os.link = wrap(os.link, "link")
    shutil.rmtree = wrap(shutil.rmtree, "rmtree")
    ownership.exchange = wrap(ownership.exchange, "exchange")
    ownership.put_back = wrap(ownership.put_back, "put_back")
    builtins.open = io.open = wrap(builtins.open, "open", opens_to_write)
    from sglang_lilicorr.cli import main as lilicorr

    sys.argv = ["lilicorr", *args]
    code = lilicorr()
    if at == "end":
        os.kill(os.getpid(), sig)
    elif at.isdigit() and count[0] < int(at):
        print(f"kill_harness: {count[0]} write points, none killed", file=sys.stderr)
    return code


def main() -> int:
    return run(sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[sys.argv.index("--") + 1 :])


if __name__ == "__main__":
    sys.exit(main())
