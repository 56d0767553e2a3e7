"""Compile-only passes: every Triton kernel a callable would launch, compiled concurrently and never launched. Inside
`compile_only(threads)` every @triton.jit launch is a warmup compiled on a thread pool (Triton's AsyncCompileMode),
finished on exit; torch ops run as usual. At most MAX_THREADS threads (LLVM memory)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

logger = logging.getLogger(__name__)

MAX_THREADS = 8


@dataclasses.dataclass
class CompileReport:
    """What a compile-only pass built: compiles submitted, failed (they raise at first launch), threads, seconds."""

    threads: int
    compiled: int = 0
    failed: int = 0
    first_error: str | None = None
    seconds: float = 0.0


def compile_threads() -> int:
    """The pool's size: this process's CPUs (its affinity where the OS says it), at most MAX_THREADS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS))


def unavailable(device: torch.device) -> str | None:
    """Why a compile-only pass cannot help on `device` (interpreter, CPU, graph capture, no AsyncCompileMode)."""
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes"):
        return "Triton's interpreter"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return f"not a CUDA device ({device})"
    if torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured"
    try:
        import triton
    except ImportError:
        triton = None
    if getattr(triton, "AsyncCompileMode", None) is None:
        return "this Triton has no AsyncCompileMode"
    return None


@contextlib.contextmanager
def compile_only(threads: int):
    """Yields a CompileReport, filled on exit once every compile has finished and Triton's state is restored."""
    from triton.runtime import _async_compile
    from triton.runtime.jit import JITFunction

    launch = JITFunction.run

    def warmup_only(self, *args, grid, warmup, **kwargs):
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    report, start = CompileReport(threads=int(threads)), time.perf_counter()
    mode = None
    JITFunction.run = warmup_only
    try:
        # ignore_errors: a kernel whose compile fails is left out of the cache (it compiles, and raises, when launched)
        with ThreadPoolExecutor(max_workers=report.threads, thread_name_prefix="lilicorr-compile") as pool:
            mode = _async_compile.AsyncCompileMode(pool, ignore_errors=True)
            with mode:
                yield report
    finally:
        JITFunction.run = launch
        if mode is not None:
            if _async_compile.active_mode.get() is mode:  # left set where Triton's exit did not finish
                _async_compile.active_mode.set(None)
            report.compiled = len(mode.raw_futures)
            errors = [f.exception() for f in mode.raw_futures if f.done() and f.exception() is not None]
            report.failed = len(errors)
            report.first_error = f"{type(errors[0]).__name__}: {errors[0]}" if errors else None
        report.seconds = time.perf_counter() - start


def precompile(run: Callable[[], object], *, device: torch.device, label: str) -> CompileReport | None:
    """`run()` compile-only where that helps, logged in one line -> the report; None where skipped or it failed."""
    why = unavailable(device)
    if why is not None:
        logger.debug("kernel pre-compilation skipped for %s: %s", label, why)
        return None
    try:
        with compile_only(compile_threads()) as report:
            run()
    except Exception as error:  # noqa: BLE001 - the kernels still compile lazily
        logger.warning(
            "pre-compiling the Triton kernels of %s failed (%s: %s); they compile when first launched instead.",
            label,
            type(error).__name__,
            error,
        )
        return None
    logger.info(
        "%s: %d Triton kernels compiled concurrently (or read from Triton's cache) on %d threads in %.1f s%s.",
        label,
        report.compiled,
        report.threads,
        report.seconds,
        f"; {report.failed} failed, left to their first launch (first: {report.first_error})" if report.failed else "",
    )
    return report
