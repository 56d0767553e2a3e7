"""Runs `lilicorr ARGS` and kills itself with SIGNAL at its AT-th write point: the AT-th call, from our code, of
os.replace, os.fsync, shutil.rmtree or a file opened to write or append (just before it happens). Exits as `lilicorr`
would if it never gets there.

  python tests/kill_harness.py AT SIGKILL|SIGINT -- lilicorr arguments ...
"""

import builtins
import io
import os
import shutil
import signal
import sys


def main() -> int:
    at, sig = int(sys.argv[1]), getattr(signal, sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1 :]
    count = [0]

    def point() -> None:
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
        if count[0] == at:
            os.kill(os.getpid(), sig)

    def wrap(original, writes=lambda *a, **k: True):
        def hooked(*a, **k):
            if writes(*a, **k):
                point()
            return original(*a, **k)

        return hooked

    def opens_to_write(file, mode="r", *a, **k):
        return isinstance(mode, str) and any(c in mode for c in "wax+")

    os.replace = wrap(os.replace)
    os.fsync = wrap(os.fsync)
    shutil.rmtree = wrap(shutil.rmtree)
    builtins.open = io.open = wrap(builtins.open, opens_to_write)
    from sglang_lilicorr.cli import main as lilicorr

    code = lilicorr(args)
    if count[0] < at:
        print(f"kill_harness: {count[0]} write points, none killed", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
