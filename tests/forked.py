"""Children forked from the test process, in place of `python ...` subprocesses where a new interpreter is not what a
test checks: a child starts with torch, transformers and the package already imported (a fresh interpreter spends
seconds importing them on a loaded 2-core machine), runs one function and ends with os._exit, never back in pytest.
CPU only: a process that has used CUDA cannot fork one that uses it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable


class Child:
    """A forked child as subprocess.Popen shows a process: pid, poll(), wait(), returncode (-N: ended by signal N)."""

    def __init__(self, pid: int, args) -> None:
        self.pid, self.args, self.returncode = pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode


def start(
    fn: Callable[[], int | None],
    *,
    stdout: int,
    stderr: int,
    cwd: Path | None = None,
    env: dict | None = None,
    new_session: bool = False,
    args=None,
) -> Child:
    """fn() in a forked child, its stdout and stderr on the file descriptors given, from `cwd`, with `env` as its whole
    environment, in a session of its own (`new_session`), with the signal handlers of a fresh interpreter; it exits
    with fn's code (None: 0; an exception: its traceback on stderr, 1). `args`: what Child.args shows."""
    pid = os.fork()
    if pid:
        return Child(pid, args)
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)  # as a fresh interpreter has them, whatever a test installed here
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if new_session:
            os.setsid()
        if cwd is not None:
            os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        sys.stdout, sys.stderr = open(1, "w", closefd=False, buffering=1), open(2, "w", closefd=False, buffering=1)
        code = fn() or 0
    except SystemExit as e:  # as the interpreter ends on one
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
