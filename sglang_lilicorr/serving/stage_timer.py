"""Opt-in per-stage timing of DFlash-family decode steps inside a real SGLang server (paper Table cost).

Enabled by `LILICORR_STAGE_TIMING=<dir>` (plugin.register calls `install`). Every DFlashWorkerV2
built afterwards -- SGLang's DFLASH worker and our LiLiCorrWorker alike -- gets its instance
attributes wrapped right after construction, so subclass overrides are inside the measured spans:

  step          forward_batch_generation of a decode step (not extend / idle)
  draft_forward draft_model_runner.forward (records the ModelRunnerOutput's `can_run_graph`)
  draft_sample  _greedy_sample_from_vocab_parallel_head (the eager proposal, graph-off batches only)
  target_verify target_worker.forward_batch_generation(..., is_verify=True)
  accept        _accept_block
  kv_append     _append_target_hidden_to_draft_kv_by_loc (decode steps only)

Each span records a GPU interval (a pair of CUDA events on the current stream, resolved lazily with
`event.query()`: no host sync on the serving path) and a host interval (perf_counter). The host
interval between consecutive decode-step starts is the true per-block wall (scheduler overhead
included); an interval with a prefill in between is dropped. Everything is keyed by batch size
(requests) and the draft graph flag, aggregated (count, mean, median) and written to
`<dir>/stages-<pid>.json` every `DUMP_EVERY` decode steps and at exit.

Right after the worker's CUDA graphs are captured, `proposal_microbench` times the LM-head GEMM,
the speculative head on its logits and the whole proposal, eager and CUDA-graph-captured, at each
decode graph batch size up to 64, and 1 (`LILICORR_STAGE_TIMING_BS=1,4` overrides the list). Any failure there is
logged and recorded in the JSON; serving goes on.
"""
from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

ENV_DIR = "LILICORR_STAGE_TIMING"
ENV_BS = "LILICORR_STAGE_TIMING_BS"
DUMP_EVERY = 100  # decode steps between periodic dumps (servers may be SIGKILLed)
MAX_SAMPLES = 20000  # per series kept for the median; count and mean use every sample
MICROBENCH_MAX_BS = 64  # default cap on the captured batch sizes the micro-benchmark visits
STAGES = ("step", "draft_forward", "draft_sample", "target_verify", "accept", "kv_append")


# --- clocks ---------------------------------------------------------------------------------


class CudaEvents:
    """GPU interval endpoints: CUDA events recorded on the current stream, never waited on."""

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, event: torch.cuda.Event) -> bool:
        return event.query()

    def elapsed_ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end)


class HostEvents:
    """Fallback without CUDA (tests, CPU servers): the endpoints are host timestamps."""

    def record(self) -> float:
        return time.perf_counter()

    def ready(self, event: float) -> bool:
        return True

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3


def default_events():
    return CudaEvents() if torch.cuda.is_available() else HostEvents()


# --- aggregation ----------------------------------------------------------------------------


class Series:
    """Running count and mean over every sample; median over the first MAX_SAMPLES."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.samples: list[float] = []

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(value)

    def summary(self) -> dict:
        if not self.count:
            return {"count": 0, "mean": None, "median": None}
        return {"count": self.count, "mean": self.total / self.count, "median": statistics.median(self.samples)}


class _Step:
    def __init__(self, bs: int, start, host_start: float) -> None:
        self.bs = bs
        self.graph: bool | None = None
        self.spans: dict[str, tuple] = {}  # stage -> (start event, end event, host ms)
        self.start = start
        self.host_start = host_start


class StageRecorder:
    """Collects decode-step spans of one worker and writes them to `<out_dir>/stages-<pid>.json`."""

    def __init__(self, out_dir, *, info: dict | None = None, events=None, clock: Callable[[], float] = time.perf_counter,
                 dump_every: int = DUMP_EVERY) -> None:
        self.path = Path(out_dir) / f"stages-{os.getpid()}.json"
        self.info = dict(info or {})
        self.events = events if events is not None else default_events()
        self.clock = clock
        self.dump_every = int(dump_every)
        self.proposal: dict | None = None
        self.decode_steps = 0
        self._step: _Step | None = None
        self._pending: list[_Step] = []
        # keyed by (batch size, draft graph flag), then stage
        self._gpu: dict[tuple[int, bool], dict[str, Series]] = {}
        self._host: dict[tuple[int, bool], dict[str, Series]] = {}
        self._interval: dict[tuple[int, bool], Series] = {}
        self._last: tuple[float, tuple[int, bool]] | None = None  # (host start, key) of the previous decode step

    # --- serving path (no host syncs) -----------------------------------------------------

    def other_forward(self) -> None:
        """A prefill (or idle) forward: the next decode-step interval would include it."""
        self._last = None

    def begin_step(self, bs: int) -> None:
        now = self.clock()
        if self._last is not None:
            self._interval.setdefault(self._last[1], Series()).add((now - self._last[0]) * 1e3)
        self.poll()
        self._step = _Step(int(bs), self.events.record(), now)

    def set_graph(self, flag) -> None:
        if self._step is not None and flag is not None:
            self._step.graph = bool(flag)

    @contextmanager
    def span(self, stage: str):
        step = self._step
        if step is None:  # outside a decode step: prefill, capture, warm-up
            yield
            return
        host0, start = self.clock(), self.events.record()
        try:
            yield
        finally:
            step.spans[stage] = (start, self.events.record(), (self.clock() - host0) * 1e3)

    def end_step(self) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        step.spans["step"] = (step.start, self.events.record(), (self.clock() - step.host_start) * 1e3)
        self._pending.append(step)
        self._last = (step.host_start, (step.bs, bool(step.graph)))
        self.decode_steps += 1
        if self.dump_every > 0 and self.decode_steps % self.dump_every == 0:
            self.safe_dump()

    def poll(self) -> None:
        """Folds in every finished step, oldest first; stops at the first one still on the GPU."""
        while self._pending and all(self.events.ready(end) for _, end, _ in self._pending[0].spans.values()):
            self._fold(self._pending.pop(0))

    def _fold(self, step: _Step) -> None:
        key = (step.bs, bool(step.graph))
        gpu, host = self._gpu.setdefault(key, {}), self._host.setdefault(key, {})
        for stage, (start, end, host_ms) in step.spans.items():
            gpu.setdefault(stage, Series()).add(self.events.elapsed_ms(start, end))
            host.setdefault(stage, Series()).add(host_ms)

    # --- output ---------------------------------------------------------------------------

    def document(self) -> dict:
        self.poll()
        rows = []
        for key in sorted(self._gpu):
            rows.append({
                "bs": key[0], "graph": key[1], "n_blocks": self._gpu[key]["step"].count,
                "step_interval_ms": self._interval.get(key, Series()).summary(),
                "gpu_ms": {s: v.summary() for s, v in self._gpu[key].items()},
                "host_ms": {s: v.summary() for s, v in self._host[key].items()},
            })
        return {"system": self.info, "pid": os.getpid(), "decode_steps": self.decode_steps,
                "pending_steps": len(self._pending), "stages": rows, "proposal": self.proposal}

    def dump(self, *, final: bool = False) -> Path:
        """Writes the JSON atomically (a kill mid-write leaves the previous dump). `final` (exit)
        waits for the GPU so the last steps count."""
        if final and isinstance(self.events, CudaEvents) and self._pending:
            torch.cuda.synchronize()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.document(), indent=1))
        os.replace(tmp, self.path)
        return self.path

    def safe_dump(self, *, final: bool = False) -> None:
        """dump() for the serving path and exit (CUDA may be gone at teardown): failures only log."""
        try:
            self.dump(final=final)
        except Exception as e:
            logger.warning("stage timing: dump to %s failed: %s: %s", self.path, type(e).__name__, e)


# --- wrapping a worker ----------------------------------------------------------------------


def is_decode(batch) -> bool:
    mode = batch.forward_mode
    return not (mode.is_extend() or bool(getattr(batch, "is_extend_in_batch", False)) or mode.is_idle())


def _wrap(obj, name: str, make) -> None:
    setattr(obj, name, functools.wraps(getattr(obj, name))(make(getattr(obj, name))))


def _spanned(recorder: StageRecorder, stage: str):
    def make(fn):
        def run(*args, **kwargs):
            with recorder.span(stage):
                return fn(*args, **kwargs)
        return run
    return make


def attach(worker, recorder: StageRecorder, *, microbench: Callable | None = None) -> StageRecorder:
    """Wraps the decode-step stages of one DFlash-family worker instance (see the module docstring).
    `microbench(worker)` runs after `init_cuda_graphs`; its result goes to the JSON's `proposal`."""

    def step(fn):
        def run(batch, *args, **kwargs):
            if not is_decode(batch):
                recorder.other_forward()
                return fn(batch, *args, **kwargs)
            recorder.begin_step(len(batch.seq_lens))
            try:
                return fn(batch, *args, **kwargs)
            finally:
                recorder.end_step()
        return run

    def draft_forward(fn):
        def run(*args, **kwargs):
            with recorder.span("draft_forward"):
                out = fn(*args, **kwargs)
            recorder.set_graph(getattr(out, "can_run_graph", None))
            return out
        return run

    def verify(fn):
        def run(*args, **kwargs):
            if not kwargs.get("is_verify"):
                return fn(*args, **kwargs)
            with recorder.span("target_verify"):
                return fn(*args, **kwargs)
        return run

    def graphs(fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            if microbench is not None:
                recorder.proposal = microbench(worker)
                recorder.safe_dump()
            return out
        return run

    _wrap(worker, "forward_batch_generation", step)
    _wrap(worker.draft_model_runner, "forward", draft_forward)
    _wrap(worker.target_worker, "forward_batch_generation", verify)
    _wrap(worker, "_greedy_sample_from_vocab_parallel_head", _spanned(recorder, "draft_sample"))
    _wrap(worker, "_accept_block", _spanned(recorder, "accept"))
    _wrap(worker, "_append_target_hidden_to_draft_kv_by_loc", _spanned(recorder, "kv_append"))
    _wrap(worker, "init_cuda_graphs", graphs)
    return recorder


# --- proposal micro-benchmark ---------------------------------------------------------------


def cuda_time_ms(fn: Callable[[], object], *, graph: bool, warmup: int = 5, iters: int = 50) -> float:
    """Median CUDA-event time of one call of fn (eager) or one replay of its CUDA graph (private pool)."""
    run = fn
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (compiles, allocator) off the capture stream
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            fn()
        run = cuda_graph.replay
    for _ in range(warmup):
        run()
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in marks:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in marks)


def proposal_parts(*, lm_head_weight: torch.Tensor, block_size: int, bs: int, proposer=None, seed: int = 0) -> dict:
    """Closures over random drafter states of bs requests: lm_head (the [bs*S, Hm] x [Hm, V] GEMM),
    spec_head (on those logits: DFLASH argmax; LILICORR top-K/LSE + head + walk) and proposal (both)."""
    w = lm_head_weight  # [V, Hm]
    s, hm = int(block_size) - 1, w.shape[1]
    g = torch.Generator(device=w.device).manual_seed(seed)
    hidden = torch.randn((bs, s, hm), generator=g, device=w.device).to(w.dtype)  # [bs, S, Hm]
    rows = hidden.view(bs * s, hm)

    def lm_head():
        return F.linear(rows, w)  # [bs*S, V]

    logits = lm_head()
    if proposer is None:  # DFLASH: greedy draft tokens
        return {"lm_head": lm_head, "spec_head": lambda: logits.argmax(-1), "proposal": lambda: lm_head().argmax(-1)}
    anchor = torch.randn((bs, hm), generator=g, device=w.device).to(w.dtype)  # [bs, Hm]
    def spec_head():
        return proposer.select.select_from_logits(logits, hidden, anchor)[0]

    return {"lm_head": lm_head, "spec_head": spec_head, "proposal": lambda: proposer.propose(hidden, anchor)}


def microbench_batch_sizes() -> list[int]:
    """LILICORR_STAGE_TIMING_BS if set; else 1 and the configured decode graph sizes up to MICROBENCH_MAX_BS
    (with graphs off the list may be empty: then 1 alone)."""
    if os.environ.get(ENV_BS):
        return sorted({int(b) for b in os.environ[ENV_BS].split(",") if b.strip()})
    from sglang.srt.runtime_context import get_exec

    configured = get_exec().graph.cuda_graph_config.decode.bs or []
    return sorted({1, *(int(b) for b in configured if 0 < int(b) <= MICROBENCH_MAX_BS)})


def worker_lm_head_weight(worker) -> torch.Tensor:
    """[V, Hm]: the proposer's (LILICORR) or the target's dense LM head over the real vocabulary."""
    proposer = vars(worker).get("proposer")
    if proposer is not None:
        return proposer.lm_head_weight
    from sglang.srt.lora.layers import unwrap_lora_layer

    from .worker import dense_lm_head_weight

    runner = worker.target_worker.model_runner
    return dense_lm_head_weight(unwrap_lora_layer(runner.model.lm_head), int(runner.model_config.vocab_size))


def proposal_microbench(worker, *, batch_sizes: list[int] | None = None, time_ms: Callable = cuda_time_ms) -> dict:
    """{"batch_sizes": {bs: {"eager"|"graph": {"lm_head", "spec_head", "proposal": ms}}}, "errors": [...]}.
    Never raises: each failure is logged and recorded."""
    result: dict = {"batch_sizes": {}, "errors": []}

    def fail(where: str, e: Exception) -> None:
        logger.warning("stage timing: proposal micro-benchmark %s failed: %s: %s", where, type(e).__name__, e)
        result["errors"].append(f"{where}: {type(e).__name__}: {e}")

    try:
        sizes = batch_sizes if batch_sizes is not None else microbench_batch_sizes()
        weight, proposer = worker_lm_head_weight(worker), vars(worker).get("proposer")
        block_size = int(worker.block_size)
    except Exception as e:
        fail("setup", e)
        return result
    for bs in sizes:
        with torch.inference_mode():
            try:
                parts = proposal_parts(lm_head_weight=weight, block_size=block_size, bs=bs, proposer=proposer)
            except Exception as e:
                fail(f"bs={bs}", e)
                continue
            for variant in ("eager", "graph"):
                for part, fn in parts.items():
                    try:
                        ms = time_ms(fn, graph=variant == "graph")
                    except Exception as e:
                        fail(f"bs={bs} {variant} {part}", e)
                        continue
                    result["batch_sizes"].setdefault(str(bs), {}).setdefault(variant, {})[part] = ms
            del parts
        if weight.is_cuda:
            torch.cuda.empty_cache()
    logger.info("stage timing: proposal micro-benchmark at batch sizes %s: %s", sizes, result["batch_sizes"])
    return result


# --- installation ---------------------------------------------------------------------------


def system_info(worker, server_args) -> dict:
    from importlib.metadata import version

    info = {
        "algorithm": str(getattr(server_args, "speculative_algorithm", None)),
        "block_size": int(worker.block_size),
        "torch": torch.__version__,
        "sglang": version("sglang"),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
    return info


def install(out_dir) -> bool:
    """Makes every DFlashWorkerV2 built from now on in this process record its stages into out_dir.
    Idempotent; returns whether it patched."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    original = DFlashWorkerV2.__init__
    if getattr(original, "_stage_timing_original", None) is not None:
        return False

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            server_args = kwargs["server_args"] if "server_args" in kwargs else args[0]
            recorder = StageRecorder(out_dir, info=system_info(self, server_args))
            # late-bound, so tests can stub the micro-benchmark
            self.stage_recorder = attach(self, recorder, microbench=lambda worker: proposal_microbench(worker))
        except Exception as e:  # measurement must never stop a server
            logger.warning("stage timing: could not wrap %s, serving untimed: %s: %s", type(self).__name__, type(e).__name__, e)
            return
        atexit.register(recorder.safe_dump, final=True)
        logger.info("stage timing: recording decode stages of %s into %s", type(self).__name__, recorder.path)

    __init__._stage_timing_original = original
    DFlashWorkerV2.__init__ = __init__
    logger.info("stage timing on (%s=%s): DFlash-family workers record per-stage times.", ENV_DIR, out_dir)
    return True


def uninstall() -> None:
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    original = getattr(DFlashWorkerV2.__init__, "_stage_timing_original", None)
    if original is not None:
        DFlashWorkerV2.__init__ = original
