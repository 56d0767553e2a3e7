"""Opt-in per-stage timing of DFlash-family decode steps inside a real SGLang server (paper Table cost).

Enabled by `LILICORR_STAGE_TIMING=<dir>` (the instrumentation plugin's `register` calls `install`). Every DFlashWorkerV2
built afterwards -- SGLang's DFLASH worker (with or without its built-in LiLiCorr head, or a Domino draft) and our
LiLiCorrWorker alike -- and every DSparkWorkerV2 gets its instance attributes wrapped right after construction, so
subclass overrides are inside the measured spans (the DSPARK worker has step, draft_forward and target_verify; its
eager LM head and Markov block run outside draft_forward, so they land in the table's "accept and residual"):

  step          forward_batch_generation of a decode step (not extend / idle)
  draft_forward draft_model_runner.forward (records the ModelRunnerOutput's `can_run_graph`)
  draft_sample  the eager proposal, graph-off batches only: _greedy_sample_from_vocab_parallel_head
                (DFLASH, LILICORR) or SGLang's propose_lilicorr_block (the built-in head)
  target_verify target_worker.forward_batch_generation(..., is_verify=True)
  accept        _accept_block
  kv_append     _append_target_hidden_to_draft_kv_by_loc (decode steps only)

In a server without speculation the target's TpModelWorker is wrapped instead: `step` is its decode
forward_batch_generation and the graph flag its `can_run_cuda_graph` (the plain decode step beside
which a block is weighed).

Each span records a GPU interval (a pair of CUDA events on the current stream, resolved lazily with
`event.query()`: no host sync on the serving path) and a host interval (perf_counter). The host
interval between consecutive decode-step starts is the true per-block wall (scheduler overhead
included); an interval with a prefill in between is dropped. Everything is keyed by batch size
(requests) and the draft graph flag, aggregated (count, mean, median) and written to
`<dir>/stages-<pid>.json` every `DUMP_EVERY` decode steps, at the first prefill after `IDLE_DUMP_S` without
a decode step (a client flushes the last steps of a run that way: servers stopped by SIGKILL never reach their
exit dump), and at exit.

Right after the worker's CUDA graphs are captured, `proposal_microbench` times the LM-head GEMM,
the speculative head on its logits and the whole proposal, eager and CUDA-graph-captured, at each
decode graph batch size up to 64, and 1 (`LILICORR_STAGE_TIMING_BS=1,4` overrides the list). SGLang's
built-in head, Domino and DSpark take the drafter's states, not logits: their head is the proposal less the GEMM
(corrector_microbench). Any failure there is logged and recorded in the JSON; serving goes on.

A prefill (extend) forward is timed whole, by the same two clocks, into `prefill` (count, requests per
prefill, GPU and host ms): what a run spends outside its decode steps.

The JSON's `system` also says whether blocks commit a forced number of tokens (SGLang's own
`SGLANG_SIMULATE_ACC_LEN` benchmark knob: `forced_commit_len`), and `memory` what the server holds on
the GPU (weights of the target, the draft and its head, KV pools, what graph capture took).
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
IDLE_DUMP_S = 1.0  # a prefill this long after the last decode step dumps first (never within a run of steps)
MAX_SAMPLES = 20000  # per series kept for the median; count and mean use every sample
MICROBENCH_MAX_BS = 64  # default cap on the captured batch sizes the micro-benchmark visits
STAGES = ("step", "draft_forward", "draft_sample", "target_verify", "accept", "kv_append")
GIB = float(1 << 30)


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
    """Running count, mean and max over every sample; median over the first MAX_SAMPLES."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.max: float | None = None
        self.samples: list[float] = []

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.max = value if self.max is None else max(self.max, value)
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(value)

    def summary(self) -> dict:
        if not self.count:
            return {"count": 0, "mean": None, "median": None, "max": None}
        return {
            "count": self.count,
            "mean": self.total / self.count,
            "median": statistics.median(self.samples),
            "max": self.max,
        }


class _Step:
    def __init__(self, bs: int, start, host_start: float) -> None:
        self.bs = bs
        self.graph: bool | None = None
        self.spans: dict[str, tuple] = {}  # stage -> (start event, end event, host ms)
        self.start = start
        self.host_start = host_start


class StageRecorder:
    """Collects decode-step spans of one worker and writes them to `<out_dir>/stages-<pid>.json`."""

    def __init__(
        self,
        out_dir,
        *,
        info: dict | None = None,
        events=None,
        clock: Callable[[], float] = time.perf_counter,
        dump_every: int = DUMP_EVERY,
    ) -> None:
        self.path = Path(out_dir) / f"stages-{os.getpid()}.json"
        self.info = dict(info or {})
        self.events = events if events is not None else default_events()
        self.clock = clock
        self.dump_every = int(dump_every)
        self.proposal: dict | None = None
        self.memory: dict | None = None
        self.decode_steps = 0
        self._dumped_steps = 0  # decode_steps at the last dump
        self._last_step_end: float | None = None  # host time the last decode step ended
        self._step: _Step | None = None
        self._pending: list[_Step] = []
        # keyed by (batch size, draft graph flag), then stage
        self._gpu: dict[tuple[int, bool], dict[str, Series]] = {}
        self._host: dict[tuple[int, bool], dict[str, Series]] = {}
        self._interval: dict[tuple[int, bool], Series] = {}
        self._last: tuple[float, tuple[int, bool]] | None = None  # (host start, key) of the previous decode step
        self._prefill: tuple | None = None  # (requests, start event, host start) of the prefill in flight
        self._pending_prefills: list[tuple] = []  # (requests, start event, end event, host ms)
        self._prefills = {"requests": Series(), "gpu_ms": Series(), "host_ms": Series()}

    # --- serving path (no host syncs) -----------------------------------------------------

    def other_forward(self) -> None:
        """A prefill (or idle) forward: the next decode-step interval would include it."""
        self._last = None

    def begin_prefill(self, requests: int) -> None:
        self.other_forward()
        idle = self._last_step_end is not None and self.clock() - self._last_step_end >= IDLE_DUMP_S
        if idle and self.decode_steps > self._dumped_steps:
            self.safe_dump()
        self._prefill = (int(requests), self.events.record(), self.clock())

    def end_prefill(self) -> None:
        prefill, self._prefill = self._prefill, None
        if prefill is not None:
            requests, start, host0 = prefill
            self._pending_prefills.append((requests, start, self.events.record(), (self.clock() - host0) * 1e3))

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
        self._last_step_end = self.clock()
        self.decode_steps += 1
        if self.dump_every > 0 and self.decode_steps % self.dump_every == 0:
            self.safe_dump()

    def poll(self) -> None:
        """Folds in every finished step, oldest first; stops at the first one still on the GPU."""
        while self._pending and all(self.events.ready(end) for _, end, _ in self._pending[0].spans.values()):
            self._fold(self._pending.pop(0))
        while self._pending_prefills and self.events.ready(self._pending_prefills[0][2]):
            requests, start, end, host_ms = self._pending_prefills.pop(0)
            for name, value in (
                ("requests", requests),
                ("gpu_ms", self.events.elapsed_ms(start, end)),
                ("host_ms", host_ms),
            ):
                self._prefills[name].add(value)

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
            rows.append(
                {
                    "bs": key[0],
                    "graph": key[1],
                    "n_blocks": self._gpu[key]["step"].count,
                    "step_interval_ms": self._interval.get(key, Series()).summary(),
                    "gpu_ms": {s: v.summary() for s, v in self._gpu[key].items()},
                    "host_ms": {s: v.summary() for s, v in self._host[key].items()},
                }
            )
        return {
            "system": self.info,
            "pid": os.getpid(),
            "decode_steps": self.decode_steps,
            "pending_steps": len(self._pending),
            "stages": rows,
            "prefill": {k: v.summary() for k, v in self._prefills.items()},
            "proposal": self.proposal,
            "memory": self.memory,
        }

    def dump(self, *, final: bool = False) -> Path:
        """Writes the JSON atomically (a kill mid-write leaves the previous dump). `final` (exit)
        waits for the GPU so the last steps count."""
        if final and isinstance(self.events, CudaEvents) and (self._pending or self._pending_prefills):
            torch.cuda.synchronize()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.document(), indent=1))
        os.replace(tmp, self.path)
        self._dumped_steps = self.decode_steps
        return self.path

    def safe_dump(self, *, final: bool = False) -> None:
        """dump() for the serving path and exit (CUDA may be gone at teardown): failures only log."""
        try:
            self.dump(final=final)
        except Exception as e:
            logger.warning("stage timing: dump to %s failed: %s: %s", self.path, type(e).__name__, e)


# --- wrapping a worker ----------------------------------------------------------------------


def is_decode(batch) -> bool:
    if batch is None:  # a forward handed over as a ForwardBatch (a verify pass): not a scheduler step
        return False
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


def _decode_steps(recorder: StageRecorder, graph_of: Callable | None = None):
    """forward_batch_generation timed as one step per decode batch and whole per prefill; graph_of(result)
    gives the graph flag."""

    def make(fn):
        def run(batch, *args, **kwargs):
            if not is_decode(batch):
                if batch is None or batch.forward_mode.is_idle():
                    recorder.other_forward()
                    return fn(batch, *args, **kwargs)
                recorder.begin_prefill(len(batch.seq_lens))
                try:
                    return fn(batch, *args, **kwargs)
                finally:
                    recorder.end_prefill()
            recorder.begin_step(len(batch.seq_lens))
            try:
                out = fn(batch, *args, **kwargs)
                if graph_of is not None:
                    recorder.set_graph(graph_of(out))
                return out
            finally:
                recorder.end_step()

        return run

    return make


def best_effort(what: str, fn: Callable, *args) -> dict:
    """fn(*args), or {"error": ...} (logged): a measurement never stops a server."""
    try:
        return fn(*args)
    except Exception as e:
        logger.warning("stage timing: %s failed: %s: %s", what, type(e).__name__, e)
        return {"error": f"{type(e).__name__}: {e}"}


def free_gib() -> float | None:
    return torch.cuda.mem_get_info()[0] / GIB if torch.cuda.is_available() else None


def _after_init(recorder: StageRecorder, worker, memory: Callable | None, microbench: Callable | None):
    """Wraps init_cuda_graphs: what the capture took from free GPU memory, then `memory(worker)` and
    `microbench(worker)` into the JSON."""

    def make(fn):
        def run(*args, **kwargs):
            before = free_gib()
            out = fn(*args, **kwargs)
            after = free_gib()
            if memory is not None:
                recorder.memory = {
                    **best_effort("memory", memory, worker),
                    "free_after_graphs_gib": after,
                    "graphs_gib": None if after is None else before - after,
                }
            if microbench is not None:
                recorder.proposal = microbench(worker)
            recorder.safe_dump()
            return out

        return run

    return make


def attach(
    worker, recorder: StageRecorder, *, microbench: Callable | None = None, memory: Callable | None = None
) -> StageRecorder:
    """Wraps the decode-step stages of one DFlash-family worker instance (see the module docstring).
    After `init_cuda_graphs`, `memory(worker)` and `microbench(worker)` go to the JSON's `memory` and `proposal`."""

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

    _wrap(worker, "forward_batch_generation", _decode_steps(recorder))
    _wrap(worker.draft_model_runner, "forward", draft_forward)
    _wrap(worker.target_worker, "forward_batch_generation", verify)
    if hasattr(worker, "_greedy_sample_from_vocab_parallel_head"):  # the DFlash worker's (not DSPARK's)
        _wrap(worker, "_greedy_sample_from_vocab_parallel_head", _spanned(recorder, "draft_sample"))
    if vars(worker).get("lilicorr") is not None:  # SGLang's built-in head proposes eagerly through a module function
        from sglang.srt.speculative import dflash_worker_v2

        _wrap(dflash_worker_v2, "propose_lilicorr_block", _spanned(recorder, "draft_sample"))
    for name, stage in (("_accept_block", "accept"), ("_append_target_hidden_to_draft_kv_by_loc", "kv_append")):
        if hasattr(worker, name):
            _wrap(worker, name, _spanned(recorder, stage))
    _wrap(worker, "init_cuda_graphs", _after_init(recorder, worker, memory, microbench))
    return recorder


def attach_plain(worker, recorder: StageRecorder) -> StageRecorder:
    """Wraps the decode steps of a target served without speculation (its TpModelWorker instance)."""
    _wrap(
        worker,
        "forward_batch_generation",
        _decode_steps(recorder, lambda out: getattr(out, "can_run_cuda_graph", None)),
    )
    return recorder


# --- memory ---------------------------------------------------------------------------------


def _tensors(module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()] if module is not None else []


def module_gib(module, *, exclude=None) -> float | None:
    """GiB of a module's parameters and buffers, each storage once, leaving out those `exclude` holds
    too (a draft that borrows the target's LM head). None without a module."""
    if module is None:
        return None
    skip = {t.data_ptr() for t in _tensors(exclude)}
    sizes = {t.data_ptr(): t.numel() * t.element_size() for t in _tensors(module) if t.data_ptr() not in skip}
    return sum(sizes.values()) / GIB


def memory_info(target_runner, *, draft_model=None, draft_runner=None) -> dict:
    """What a server holds on the GPU, GiB: target weights, draft weights (its head included) and the
    head alone (ours: `lilicorr_head`; SGLang's built-in: `lilicorr`), the KV pools of target and draft;
    the pool's size in tokens, the free memory before the weights loaded, the card's memory."""
    heads = [getattr(draft_model, name, None) for name in ("lilicorr_head", "lilicorr")]
    head = next((h for h in heads if h is not None), None)
    pools = [
        getattr(getattr(r, "token_to_kv_pool", None), "mem_usage", None)
        for r in (target_runner, draft_runner)
        if r is not None
    ]
    return {
        "target_gib": module_gib(target_runner.model),
        "draft_gib": module_gib(draft_model, exclude=target_runner.model),
        "head_gib": module_gib(head),
        "kv_pool_gib": None if None in pools else float(sum(pools)),
        "max_total_num_tokens": getattr(target_runner, "max_total_num_tokens", None),
        "pre_load_free_gib": getattr(target_runner, "pre_model_load_memory", None),
        "device_gib": torch.cuda.mem_get_info()[1] / GIB if torch.cuda.is_available() else None,
    }


def dflash_memory(worker) -> dict:
    return memory_info(
        worker.target_worker.model_runner, draft_model=worker.draft_model, draft_runner=worker.draft_model_runner
    )


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


def _random(g: torch.Generator, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=like.device).to(like.dtype)


def proposal_parts(*, lm_head_weight: torch.Tensor, block_size: int, bs: int, proposer=None, seed: int = 0) -> dict:
    """Closures over random drafter states of bs requests: lm_head (the [bs*S, Hm] x [Hm, V] GEMM),
    spec_head (on those logits: DFLASH argmax; LILICORR top-K/LSE + head + walk) and proposal (both)."""
    w = lm_head_weight  # [V, Hm]
    s, hm = int(block_size) - 1, w.shape[1]
    g = torch.Generator(device=w.device).manual_seed(seed)
    hidden = _random(g, (bs, s, hm), w)  # [bs, S, Hm]
    rows = hidden.view(bs * s, hm)

    def lm_head():
        return F.linear(rows, w)  # [bs*S, V]

    logits = lm_head()
    if proposer is None:  # DFLASH: greedy draft tokens
        return {"lm_head": lm_head, "spec_head": lambda: logits.argmax(-1), "proposal": lambda: lm_head().argmax(-1)}
    anchor = _random(g, (bs, hm), w)  # [bs, Hm]

    def spec_head():
        return proposer.select.propose(logits, hidden, anchor).draft

    return {"lm_head": lm_head, "spec_head": spec_head, "proposal": lambda: proposer.propose(hidden, anchor)}


def builtin_parts(worker, *, bs: int, graph: bool, seed: int = 0) -> dict:
    """SGLang's built-in LiLiCorr head (a DFLASH worker whose draft carries one): lm_head (the same GEMM)
    and proposal, random drafter states of bs requests -> draft tokens, through SGLang's draft sampler
    (what its draft graph captures) for the graph variant, else its eager propose_lilicorr_block. The
    head takes the drafter's states, not logits: its time is proposal - lm_head."""
    from sglang.srt.lora.layers import unwrap_lora_layer
    from sglang.srt.speculative.lilicorr_utils import propose_lilicorr_block, target_input_embeddings

    w, b = worker_lm_head_weight(worker), int(worker.block_size)
    head, target = worker.lilicorr, worker.target_worker.model_runner.model
    g = torch.Generator(device=w.device).manual_seed(seed)
    hidden = _random(g, (bs, b, w.shape[1]), w)  # [bs, B, Hm]: slot 0, then the drafted slots
    anchor = _random(g, (bs, int(head.context_proj.input_size)), w)
    rows = hidden[:, 1:].reshape(bs * (b - 1), w.shape[1])
    sampler = vars(worker).get("_draft_sampler")
    if graph and sampler is not None:
        sampler.set_anchor(anchor, bs)
        proposal = lambda: sampler(hidden.view(bs * b, -1))  # noqa: E731
    else:
        lm_head, embed = unwrap_lora_layer(target.lm_head), target_input_embeddings(target)
        proposal = lambda: propose_lilicorr_block(  # noqa: E731
            head=head, draft_hidden=hidden, lm_head=lm_head, embed_tokens=embed, anchor=anchor
        )[0]
    return {"lm_head": lambda: F.linear(rows, w), "proposal": proposal}


def block_size_of(worker) -> int:
    """Tokens a block verifies: the DFlash worker's block size, the DSPARK worker's gamma + 1."""
    return int(worker.block_size) if hasattr(worker, "block_size") else int(worker.gamma) + 1


def worker_parts(worker, weight: torch.Tensor, proposer, *, bs: int, graph: bool) -> dict:
    """The micro-benchmark's closures for this worker's proposal at bs (proposal_parts, builtin_parts or
    corrector_microbench's)."""
    from . import corrector_microbench as corrector

    if vars(worker).get("lilicorr") is not None:
        return builtin_parts(worker, bs=bs, graph=graph)
    if corrector.is_domino(worker):
        return corrector.domino_parts(worker, weight, bs=bs, graph=graph)
    if corrector.is_dspark(worker):
        return corrector.dspark_parts(worker, weight, bs=bs)
    return proposal_parts(lm_head_weight=weight, block_size=block_size_of(worker), bs=bs, proposer=proposer)


def microbench_batch_sizes() -> list[int]:
    """LILICORR_STAGE_TIMING_BS if set; else 1 and the configured decode graph sizes up to MICROBENCH_MAX_BS
    (with graphs off the list may be empty: then 1 alone)."""
    if os.environ.get(ENV_BS):
        return sorted({int(b) for b in os.environ[ENV_BS].split(",") if b.strip()})
    from sglang.srt.runtime_context import get_exec

    configured = get_exec().graph.cuda_graph_config.decode.bs or []
    return sorted({1, *(int(b) for b in configured if 0 < int(b) <= MICROBENCH_MAX_BS)})


def worker_lm_head_weight(worker) -> torch.Tensor:
    """[V, Hm]: the proposer's (LILICORR) or the target's dense LM head over the real vocabulary (under
    tensor parallelism, this rank's shard of it)."""
    proposer = vars(worker).get("proposer")
    if proposer is not None:
        return proposer.lm_head_weight
    from sglang.srt.lora.layers import unwrap_lora_layer

    from sglang_lilicorr.serving.worker import lm_head_rows

    runner = worker.target_worker.model_runner
    rows, _ = lm_head_rows(unwrap_lora_layer(runner.model.lm_head), int(runner.model_config.vocab_size), tp_group=None)
    return rows


def proposal_microbench(worker, *, batch_sizes: list[int] | None = None, time_ms: Callable = cuda_time_ms) -> dict:
    """{"batch_sizes": {bs: {"eager"|"graph": {"lm_head", "spec_head", "proposal": ms}}}, "errors": [...]}
    (the built-in head's, Domino's and DSpark's spec_head: proposal - lm_head). Never raises: each failure is logged
    and recorded."""
    result: dict = {"batch_sizes": {}, "errors": []}

    def fail(where: str, e: Exception) -> None:
        logger.warning("stage timing: proposal micro-benchmark %s failed: %s: %s", where, type(e).__name__, e)
        result["errors"].append(f"{where}: {type(e).__name__}: {e}")

    try:
        sizes = batch_sizes if batch_sizes is not None else microbench_batch_sizes()
        weight, proposer = worker_lm_head_weight(worker), vars(worker).get("proposer")
    except Exception as e:
        fail("setup", e)
        return result
    for bs in sizes:
        with torch.inference_mode():
            for variant in ("eager", "graph"):
                try:
                    parts = worker_parts(worker, weight, proposer, bs=bs, graph=variant == "graph")
                except Exception as e:
                    fail(f"bs={bs} {variant}", e)
                    continue
                times = {}
                for part, fn in parts.items():
                    try:
                        times[part] = time_ms(fn, graph=variant == "graph")
                    except Exception as e:
                        fail(f"bs={bs} {variant} {part}", e)
                if "spec_head" not in parts and {"lm_head", "proposal"} <= set(times):
                    times["spec_head"] = max(0.0, times["proposal"] - times["lm_head"])
                if times:
                    result["batch_sizes"].setdefault(str(bs), {})[variant] = times
                del parts
        if weight.is_cuda:
            torch.cuda.empty_cache()
    logger.info("stage timing: proposal micro-benchmark at batch sizes %s: %s", sizes, result["batch_sizes"])
    return result


# --- installation ---------------------------------------------------------------------------


def forced_commit_len() -> float | None:
    """Tokens every block commits under SGLang's SGLANG_SIMULATE_ACC_LEN benchmark knob (its DFlash
    worker overrides the accepted length after verification); None when the knob is off."""
    from sglang.srt.environ import envs

    value = float(envs.SGLANG_SIMULATE_ACC_LEN.get())
    return value if value > 0 else None


def system_info(server_args, block_size: int | None = None) -> dict:
    from importlib.metadata import version

    info = {
        "algorithm": str(getattr(server_args, "speculative_algorithm", None)),
        "block_size": block_size,
        "forced_commit_len": forced_commit_len(),
        "torch": torch.__version__,
        "sglang": version("sglang"),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
    return info


def _patch_init(cls, timed: Callable) -> bool:
    """From now on every cls.__init__ ends with timed(worker, server_args, args, kwargs), which returns
    the worker's StageRecorder or None (not timed). Idempotent; returns whether it patched."""
    original = cls.__init__
    if getattr(original, "_stage_timing_original", None) is not None:
        return False

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            recorder = timed(self, kwargs["server_args"] if "server_args" in kwargs else args[0], args, kwargs)
        except Exception as e:  # measurement must never stop a server
            logger.warning(
                "stage timing: could not wrap %s, serving untimed: %s: %s", type(self).__name__, type(e).__name__, e
            )
            return
        if recorder is not None:
            self.stage_recorder = recorder
            atexit.register(recorder.safe_dump, final=True)
            logger.info("stage timing: recording decode stages of %s into %s", type(self).__name__, recorder.path)

    __init__._stage_timing_original = original
    cls.__init__ = __init__
    return True


def install(out_dir) -> bool:
    """Makes every DFlashWorkerV2 and DSparkWorkerV2 built from now on in this process, and the TpModelWorker of a
    server without speculation, record its stages into out_dir. Idempotent; returns whether it patched."""
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    def dflash(worker, server_args, args, kwargs):
        recorder = StageRecorder(out_dir, info=system_info(server_args, block_size_of(worker)))
        # late-bound, so tests can stub them
        return attach(worker, recorder, microbench=lambda w: proposal_microbench(w), memory=lambda w: dflash_memory(w))

    def plain(worker, server_args, args, kwargs):
        draft = kwargs.get("is_draft_worker", args[3] if len(args) > 3 else False)
        if draft or getattr(server_args, "speculative_algorithm", None) is not None:
            return None  # part of a speculative server: its DFlash worker is timed
        recorder = attach_plain(worker, StageRecorder(out_dir, info=system_info(server_args)))
        recorder.memory = {**best_effort("memory", memory_info, worker.model_runner), "free_after_init_gib": free_gib()}
        return recorder

    patched = [_patch_init(cls, dflash) for cls in (DFlashWorkerV2, DSparkWorkerV2)] + [
        _patch_init(TpModelWorker, plain)
    ]
    if any(patched):
        logger.info(
            "stage timing on (%s=%s): DFlash-family and DSpark workers and plain decode steps record per-stage times.",
            ENV_DIR,
            out_dir,
        )
    return any(patched)


def uninstall() -> None:
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    for cls in (DFlashWorkerV2, DSparkWorkerV2, TpModelWorker):
        original = getattr(cls.__init__, "_stage_timing_original", None)
        if original is not None:
            cls.__init__ = original
