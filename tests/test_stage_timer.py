"""Per-stage decode timing (instrumentation/stage_timer.py) on CPU: a fake DFlash-family worker with an
injected clock and injected (lazily resolving) events, the JSON it writes, the proposal
micro-benchmark's parts, the plugin's opt-in install, and `from_timings` / the lab's `stages --timings`."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from test_serving import make_proposer

pytest.importorskip("sglang")

from sglang.srt.managers.tp_worker import TpModelWorker  # noqa: E402
from sglang.srt.speculative import dflash_worker_v2  # noqa: E402
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2  # noqa: E402

from benchmarks.instrumentation import stage_timer  # noqa: E402
from benchmarks.instrumentation.plugin import register  # noqa: E402
from benchmarks.served import stages  # noqa: E402

# --- fakes ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0  # seconds

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1e3


class Events:
    """Endpoints stamped by the fake clock; `done` False plays a GPU that has not got there yet."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.done, self.queries = clock, True, 0

    def record(self):
        return SimpleNamespace(t=self.clock.now, events=self)

    def ready(self, event) -> bool:
        self.queries += 1
        return self.done

    def elapsed_ms(self, start, end) -> float:
        return (end.t - start.t) * 1e3


class Mode:
    def __init__(self, extend=False, idle=False) -> None:
        self.extend, self.idle = extend, idle

    def is_extend(self) -> bool:
        return self.extend

    def is_idle(self) -> bool:
        return self.idle


def batch(bs: int, extend: bool = False):
    return SimpleNamespace(forward_mode=Mode(extend=extend), is_extend_in_batch=False, seq_lens=torch.zeros(bs))


MS = {"draft_forward": 2.0, "target_verify": 5.0, "accept": 1.0, "kv_append": 0.5, "draft_sample": 0.25}


class DraftRunner:
    def __init__(self, clock: Clock) -> None:
        self.clock, self.graph = clock, True

    def forward(self, forward_batch):
        self.clock.advance(MS["draft_forward"])
        return SimpleNamespace(can_run_graph=self.graph)


class Target:
    def __init__(self, clock: Clock) -> None:
        self.clock, self.calls = clock, []

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, **kwargs):
        self.calls.append(is_verify)
        self.clock.advance(MS["target_verify"] if is_verify else 3.0)
        return "target-out"


class Worker:
    """The call structure of DFlashWorkerV2.forward_batch_generation, each stage advancing the clock."""

    block_size = 4

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.draft_model_runner = DraftRunner(clock)
        self.target_worker = Target(clock)
        self.graphs_captured = False

    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend():
            self.target_worker.forward_batch_generation(batch)
            self._append_target_hidden_to_draft_kv_by_loc(extend_lens=1)
            return "prefill"
        out = self.draft_model_runner.forward(None)
        if not out.can_run_graph:
            self._greedy_sample_from_vocab_parallel_head(hidden_states=None, lm_head=None)
        self.target_worker.forward_batch_generation(batch=None, forward_batch=1, is_verify=True)
        self._accept_block(bs=len(batch.seq_lens))
        self._append_target_hidden_to_draft_kv_by_loc(commit_lens=1)
        return "decode"

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states, lm_head):
        self.clock.advance(MS["draft_sample"])

    def _accept_block(self, **kwargs):
        self.clock.advance(MS["accept"])

    def _append_target_hidden_to_draft_kv_by_loc(self, **kwargs):
        self.clock.advance(MS["kv_append"])

    def init_cuda_graphs(self):
        self.graphs_captured = True


class SubWorker(Worker):
    """A subclass override (as LiLiCorrWorker's) must sit inside the measured step."""

    def forward_batch_generation(self, batch, on_publish=None):
        self.clock.advance(0.75)
        return super().forward_batch_generation(batch, on_publish)


def timed(tmp_path, worker_cls=SubWorker, dump_every=100, microbench=None):
    clock = Clock()
    events = Events(clock)
    worker = worker_cls(clock)
    recorder = stage_timer.StageRecorder(
        tmp_path, info={"algorithm": "LILICORR"}, events=events, clock=clock, dump_every=dump_every
    )
    stage_timer.attach(worker, recorder, microbench=microbench)
    return worker, recorder, clock, events


def run_steps(worker, clock, n, bs=1, gap_ms=1.0):
    for _ in range(n):
        assert worker.forward_batch_generation(batch(bs)) == "decode"
        clock.advance(gap_ms)  # scheduler work between blocks


# --- the recorder on a fake worker ----------------------------------------------------------


def test_stages_of_a_decode_step_include_subclass_overrides(tmp_path):
    worker, recorder, clock, _ = timed(tmp_path)
    assert worker.forward_batch_generation(batch(2, extend=True)) == "prefill"  # not a decode step
    run_steps(worker, clock, 5, bs=2)
    worker.draft_model_runner.graph = False
    run_steps(worker, clock, 3, bs=2)
    doc = recorder.dump()
    doc = json.loads(doc.read_text())
    assert doc["decode_steps"] == 8 and doc["system"]["algorithm"] == "LILICORR" and doc["pid"] == os.getpid()
    rows = {(r["bs"], r["graph"]): r for r in doc["stages"]}
    assert set(rows) == {(2, True), (2, False)}
    graph, eager = rows[2, True], rows[2, False]
    assert graph["n_blocks"] == 5 and eager["n_blocks"] == 3
    step = 0.75 + MS["draft_forward"] + MS["target_verify"] + MS["accept"] + MS["kv_append"]
    for stage in ("draft_forward", "target_verify", "accept", "kv_append"):
        assert graph["gpu_ms"][stage]["median"] == pytest.approx(MS[stage])
        assert graph["host_ms"][stage] == pytest.approx(graph["gpu_ms"][stage])
    assert graph["gpu_ms"]["step"]["mean"] == pytest.approx(step)
    assert "draft_sample" not in graph["gpu_ms"]  # graphed draft: the proposal ran inside draft_forward
    assert eager["gpu_ms"]["draft_sample"]["median"] == pytest.approx(MS["draft_sample"])
    assert eager["gpu_ms"]["step"]["median"] == pytest.approx(step + MS["draft_sample"])
    # per-block wall: start to start; the prefill before the first step starts no interval
    assert graph["step_interval_ms"]["count"] == 5  # the 5th interval ends at the first eager step's start
    assert graph["step_interval_ms"]["median"] == pytest.approx(step + 1.0)
    assert eager["step_interval_ms"]["count"] == 2
    assert worker.target_worker.calls == [False] + [True] * 8  # prefill's target forward passes through


class DSparkLikeWorker:
    """The DSPARK worker's call structure: draft forward and verify, no DFlash accept or KV-append methods."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.gamma = clock, 3
        self.draft_model_runner, self.target_worker = DraftRunner(clock), Target(clock)

    def forward_batch_generation(self, batch, on_publish=None):
        self.draft_model_runner.forward(None)
        self.target_worker.forward_batch_generation(batch=None, forward_batch=1, is_verify=True)
        self.clock.advance(MS["accept"])
        return "decode"

    def init_cuda_graphs(self):
        pass


def test_a_dspark_worker_is_timed_by_the_stages_it_has(tmp_path):
    worker, recorder, clock, _ = timed(tmp_path, worker_cls=DSparkLikeWorker)
    run_steps(worker, clock, 3)
    (row,) = recorder.document()["stages"]
    assert set(row["gpu_ms"]) == {"step", "draft_forward", "target_verify"} and row["n_blocks"] == 3
    assert stage_timer.block_size_of(worker) == 4 and stage_timer.block_size_of(Worker(clock)) == 4


def test_prefill_between_decode_steps_drops_that_interval(tmp_path):
    worker, recorder, clock, _ = timed(tmp_path)
    run_steps(worker, clock, 2)
    worker.forward_batch_generation(batch(1, extend=True))
    run_steps(worker, clock, 2)
    row = recorder.document()["stages"][0]
    assert row["n_blocks"] == 4 and row["step_interval_ms"]["count"] == 2


def test_each_prefill_is_timed_whole_and_an_idle_forward_is_not(tmp_path):
    worker, recorder, clock, events = timed(tmp_path)
    for bs in (3, 5):
        worker.forward_batch_generation(batch(bs, extend=True))
    idle = SimpleNamespace(forward_mode=Mode(idle=True), is_extend_in_batch=False, seq_lens=torch.zeros(0))
    worker.forward_batch_generation(idle)
    assert recorder.document()["prefill"]["gpu_ms"]["count"] == 2
    events.done = False  # a prefill still on the GPU is not folded in
    worker.forward_batch_generation(batch(7, extend=True))
    assert recorder.document()["prefill"]["gpu_ms"]["count"] == 2
    events.done = True
    prefill = recorder.document()["prefill"]
    whole = 0.75 + 3.0 + MS["kv_append"]  # the subclass, the target's extend, the draft-KV append
    assert prefill["gpu_ms"]["count"] == 3 and prefill["requests"]["mean"] == pytest.approx(5.0)
    assert prefill["gpu_ms"]["median"] == pytest.approx(whole) and prefill["host_ms"]["mean"] == pytest.approx(whole)
    assert recorder.document()["decode_steps"] == 0


def test_events_resolve_lazily_without_waiting(tmp_path):
    worker, recorder, clock, events = timed(tmp_path)
    events.done = False  # the GPU is behind: nothing may be folded, nothing may block
    run_steps(worker, clock, 3)
    assert recorder.document()["stages"] == [] and recorder.document()["pending_steps"] == 3
    assert events.queries > 0
    events.done = True
    recorder.poll()
    assert recorder.document()["stages"][0]["n_blocks"] == 3 and recorder.document()["pending_steps"] == 0


def test_periodic_dump_and_atomic_file(tmp_path):
    worker, recorder, clock, _ = timed(tmp_path / "out", dump_every=4)
    run_steps(worker, clock, 3)
    assert not recorder.path.exists()
    run_steps(worker, clock, 1)
    assert recorder.path.name == f"stages-{os.getpid()}.json"
    assert json.loads(recorder.path.read_text())["decode_steps"] == 4
    assert list(recorder.path.parent.iterdir()) == [recorder.path]  # no temp file left behind


def test_a_prefill_after_an_idle_second_flushes_the_last_steps(tmp_path):
    worker, recorder, clock, _ = timed(tmp_path / "out", dump_every=100)
    run_steps(worker, clock, 3)
    worker.forward_batch_generation(batch(1, extend=True))  # a prefill right after the steps: no dump mid-run
    assert not recorder.path.exists()
    run_steps(worker, clock, 2)
    clock.advance(1000 * stage_timer.IDLE_DUMP_S)
    worker.forward_batch_generation(batch(1, extend=True))  # the client's flush after a run
    assert json.loads(recorder.path.read_text())["decode_steps"] == 5
    recorder.path.unlink()
    clock.advance(1000 * stage_timer.IDLE_DUMP_S)
    worker.forward_batch_generation(batch(1, extend=True))  # nothing new since: no dump
    assert not recorder.path.exists()


def test_series_statistics():
    s = stage_timer.Series()
    assert s.summary() == {"count": 0, "mean": None, "median": None, "max": None}
    for v in (1.0, 2.0, 10.0, 3.0):
        s.add(v)
    assert s.summary() == {"count": 4, "mean": 4.0, "median": 2.5, "max": 10.0}


def test_microbench_runs_after_graph_capture_and_is_recorded(tmp_path):
    seen = []

    def microbench(worker):
        seen.append(worker.graphs_captured)
        return {"batch_sizes": {"1": {"eager": {"lm_head": 1.0}}}, "errors": []}

    worker, recorder, _, _ = timed(tmp_path, microbench=microbench)
    worker.init_cuda_graphs()
    assert seen == [True]
    assert json.loads(recorder.path.read_text())["proposal"]["batch_sizes"]["1"]["eager"]["lm_head"] == 1.0


def test_host_events_fallback():
    ev = stage_timer.HostEvents()
    a, b = ev.record(), ev.record()
    assert ev.ready(b) and ev.elapsed_ms(a, b) >= 0.0
    assert isinstance(
        stage_timer.default_events(), stage_timer.CudaEvents if torch.cuda.is_available() else stage_timer.HostEvents
    )


# --- the proposal micro-benchmark -----------------------------------------------------------


def host_time_ms(fn, *, graph):
    if graph:
        raise RuntimeError("no CUDA graphs on CPU")
    fn()
    return 0.5


@pytest.mark.parametrize("lilicorr", [True, False])
def test_proposal_parts_split_the_proposal_exactly(lilicorr):
    proposer, _, lm, _ = make_proposer(block_size=16)
    parts = stage_timer.proposal_parts(lm_head_weight=lm, block_size=16, bs=3, proposer=proposer if lilicorr else None)
    assert parts["lm_head"]().shape == (3 * 15, lm.shape[0])
    draft = parts["proposal"]()
    assert draft.reshape(-1).tolist() == parts["spec_head"]().reshape(-1).tolist()  # (b) on (a) is the proposal


def test_microbench_records_each_failure_and_keeps_going():
    proposer, *_ = make_proposer(block_size=16)
    worker = SimpleNamespace(block_size=16, proposer=proposer)
    result = stage_timer.proposal_microbench(worker, batch_sizes=[1, 2], time_ms=host_time_ms)
    assert set(result["batch_sizes"]) == {"1", "2"}
    assert result["batch_sizes"]["2"]["eager"] == {"lm_head": 0.5, "spec_head": 0.5, "proposal": 0.5}
    assert len(result["errors"]) == 6 and all("no CUDA graphs" in e for e in result["errors"])
    broken = stage_timer.proposal_microbench(
        SimpleNamespace(block_size=16, proposer=None), batch_sizes=[1], time_ms=host_time_ms
    )
    assert broken["batch_sizes"] == {} and broken["errors"][0].startswith("setup:")  # no target LM head to read


def test_microbench_batch_sizes_from_the_env(monkeypatch):
    monkeypatch.setenv(stage_timer.ENV_BS, "8, 1,8")
    assert stage_timer.microbench_batch_sizes() == [1, 8]


@pytest.mark.gpu
@pytest.mark.parametrize("lilicorr", [True, False])
def test_microbench_on_cuda_times_eager_and_graph(lilicorr):
    proposer, head, lm, embed = make_proposer(block_size=16)
    if lilicorr:
        from sglang_lilicorr.serving.proposer import LiLiCorrProposer

        proposer = LiLiCorrProposer(
            head=head.cuda(), lm_head_weight=lm.cuda(), embed_weight=embed.cuda(), block_size=16
        )
        worker = SimpleNamespace(block_size=16, proposer=proposer)
    else:  # DFLASH: the target's LM head, as the worker finds it
        runner = SimpleNamespace(
            model=SimpleNamespace(lm_head=torch.nn.Linear(lm.shape[1], lm.shape[0] + 6, bias=False).cuda()),
            model_config=SimpleNamespace(vocab_size=lm.shape[0]),
        )
        worker = SimpleNamespace(block_size=16, target_worker=SimpleNamespace(model_runner=runner))
    result = stage_timer.proposal_microbench(worker, batch_sizes=[1, 4])
    assert result["errors"] == []
    for bs in ("1", "4"):
        for variant in ("eager", "graph"):
            times = result["batch_sizes"][bs][variant]
            assert set(times) == {"lm_head", "spec_head", "proposal"} and all(t > 0 for t in times.values())


# --- install: the plugin, SGLang's worker class ---------------------------------------------


def test_plugin_installs_the_timer_only_with_the_env(monkeypatch, tmp_path):
    monkeypatch.setattr(DFlashWorkerV2, "__init__", DFlashWorkerV2.__init__)  # restored after the test
    monkeypatch.setattr(TpModelWorker, "__init__", TpModelWorker.__init__)
    monkeypatch.delenv(stage_timer.ENV_DIR, raising=False)
    original = DFlashWorkerV2.__init__
    register()
    assert DFlashWorkerV2.__init__ is original
    monkeypatch.setenv(stage_timer.ENV_DIR, str(tmp_path))
    register()
    assert DFlashWorkerV2.__init__._stage_timing_original is original
    patched = DFlashWorkerV2.__init__
    register()  # every SGLang process calls it; installing twice would time twice
    assert DFlashWorkerV2.__init__ is patched
    assert (
        TpModelWorker.__init__._stage_timing_original is not None
    )  # the plain decode step of a server without speculation
    stage_timer.uninstall()
    assert (
        DFlashWorkerV2.__init__ is original and getattr(TpModelWorker.__init__, "_stage_timing_original", None) is None
    )


def test_installed_timer_wraps_every_dflash_family_worker(monkeypatch, tmp_path):
    def fake_init(self, server_args, gpu_id, nccl_port, target_worker):
        clock = Clock()
        self.clock, self.block_size, self._target_worker = clock, 4, target_worker
        self.draft_model_runner = DraftRunner(clock)
        self.graphs_captured = False

    class FakeDFlash(DFlashWorkerV2):  # SGLang's class with the fake worker's stage methods
        forward_batch_generation = Worker.forward_batch_generation
        _greedy_sample_from_vocab_parallel_head = Worker._greedy_sample_from_vocab_parallel_head
        _accept_block = Worker._accept_block
        _append_target_hidden_to_draft_kv_by_loc = Worker._append_target_hidden_to_draft_kv_by_loc
        init_cuda_graphs = Worker.init_cuda_graphs

    monkeypatch.setattr(DFlashWorkerV2, "__init__", fake_init)
    monkeypatch.setattr(TpModelWorker, "__init__", TpModelWorker.__init__)
    monkeypatch.setattr(stage_timer, "proposal_microbench", lambda w: {"batch_sizes": {}, "errors": ["skipped"]})
    monkeypatch.setattr(stage_timer, "dflash_memory", lambda w: {"draft_gib": 1.5})
    assert stage_timer.install(tmp_path)
    assert not stage_timer.install(tmp_path)
    worker = FakeDFlash(SimpleNamespace(speculative_algorithm="DFLASH"), 0, 0, Target(Clock()))
    worker.target_worker.clock = worker.clock
    for _ in range(3):
        worker.forward_batch_generation(batch(1))
    worker.init_cuda_graphs()  # then the proposal micro-benchmark, and a dump
    assert worker.graphs_captured
    path = worker.stage_recorder.path
    assert path == tmp_path / f"stages-{os.getpid()}.json"
    doc = json.loads(path.read_text())
    assert doc["system"]["algorithm"] == "DFLASH" and doc["system"]["block_size"] == 4
    assert doc["stages"][0]["n_blocks"] == 3
    assert doc["stages"][0]["gpu_ms"]["target_verify"]["count"] == 3
    assert doc["proposal"] == {"batch_sizes": {}, "errors": ["skipped"]}
    assert doc["memory"]["draft_gib"] == 1.5 and doc["system"]["forced_commit_len"] is None


def test_a_server_without_speculation_times_its_plain_decode_steps(monkeypatch, tmp_path):
    clock = Clock()

    def fake_init(self, server_args, gpu_id, nccl_port, is_draft_worker=False, **kwargs):
        self._model_runner = SimpleNamespace(
            model=torch.nn.Linear(4, 8, bias=False), max_total_num_tokens=64, pre_model_load_memory=70.0
        )

    class FakeTarget(TpModelWorker):
        def forward_batch_generation(self, batch, forward_batch=None, **kwargs):
            clock.advance(3.0 if batch.forward_mode.is_extend() else 2.0)
            return SimpleNamespace(can_run_cuda_graph=len(batch.seq_lens) <= 4)

    monkeypatch.setattr(TpModelWorker, "__init__", fake_init)
    monkeypatch.setattr(DFlashWorkerV2, "__init__", DFlashWorkerV2.__init__)
    recorder_cls = stage_timer.StageRecorder
    monkeypatch.setattr(
        stage_timer, "StageRecorder", lambda out, info: recorder_cls(out, info=info, events=Events(clock), clock=clock)
    )
    assert stage_timer.install(tmp_path)
    try:
        assert not hasattr(
            FakeTarget(SimpleNamespace(speculative_algorithm="DFLASH"), 0, 0), "stage_recorder"
        )  # a verify target
        assert not hasattr(
            FakeTarget(SimpleNamespace(speculative_algorithm=None), 0, 0, True), "stage_recorder"
        )  # a draft
        worker = FakeTarget(SimpleNamespace(speculative_algorithm=None), 0, 0)
    finally:
        stage_timer.uninstall()
    worker.forward_batch_generation(batch(4, extend=True))
    for bs in (4, 4, 4, 8, 8):
        worker.forward_batch_generation(batch(bs))
        clock.advance(0.5)
    doc = json.loads(worker.stage_recorder.dump().read_text())
    rows = {(r["bs"], r["graph"]): r for r in doc["stages"]}
    assert rows[4, True]["n_blocks"] == 3 and rows[8, False]["n_blocks"] == 2
    assert rows[4, True]["step_interval_ms"]["median"] == pytest.approx(2.5) and rows[4, True]["gpu_ms"]["step"][
        "median"
    ] == pytest.approx(2.0)
    assert doc["system"]["algorithm"] == "None" and doc["system"]["block_size"] is None
    assert (
        doc["memory"]["target_gib"] == pytest.approx(32 * 4 / stage_timer.GIB)
        and doc["memory"]["max_total_num_tokens"] == 64
    )


def test_forced_acceptance_is_read_from_sglangs_knob(monkeypatch):
    monkeypatch.delenv("SGLANG_SIMULATE_ACC_LEN", raising=False)
    assert stage_timer.forced_commit_len() is None
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "7")
    assert stage_timer.forced_commit_len() == 7.0
    assert stage_timer.system_info(SimpleNamespace(speculative_algorithm="LILICORR"), 16)["forced_commit_len"] == 7.0


def test_memory_counts_each_storage_once_and_leaves_out_the_targets():
    target = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False))  # 128 elements
    draft = torch.nn.Module()
    draft.fc = torch.nn.Linear(8, 8, bias=False)  # 64
    draft.lm_head = target[0]  # borrowed from the target (SGLang's built-in sets draft.lm_head)
    draft.lilicorr = torch.nn.Linear(4, 4, bias=False)  # 16: the built-in head
    draft.register_buffer("table", torch.zeros(10, dtype=torch.bfloat16))  # 20 bytes
    pool = lambda gib: SimpleNamespace(token_to_kv_pool=SimpleNamespace(mem_usage=gib))  # noqa: E731
    runner = SimpleNamespace(model=target, max_total_num_tokens=1000, pre_model_load_memory=75.0, **vars(pool(2.0)))
    mem = stage_timer.memory_info(runner, draft_model=draft, draft_runner=pool(0.5))
    assert mem["target_gib"] * stage_timer.GIB == 128 * 4 and mem["draft_gib"] * stage_timer.GIB == (64 + 16) * 4 + 20
    assert mem["head_gib"] * stage_timer.GIB == 16 * 4 and mem["kv_pool_gib"] == 2.5
    assert (mem["max_total_num_tokens"], mem["pre_load_free_gib"]) == (1000, 75.0)
    draft.lilicorr_head, draft.lilicorr = torch.nn.Linear(2, 2, bias=False), None  # ours
    assert stage_timer.memory_info(runner, draft_model=draft)["head_gib"] * stage_timer.GIB == 16
    assert stage_timer.memory_info(SimpleNamespace(model=target))["kv_pool_gib"] is None
    assert stage_timer.best_effort("memory", lambda: 1 / 0) == {"error": "ZeroDivisionError: division by zero"}


def test_builtin_head_is_timed_as_the_proposal_less_the_gemm(monkeypatch):
    from sglang.srt.speculative import lilicorr_utils

    calls = []

    class Sampler:  # SGLang's LiLiCorrDraftSampler: what the built-in draft graph captures
        def set_anchor(self, rows, bs):
            calls.append(("anchor", tuple(rows.shape), bs))

        def __call__(self, hidden_states, input_ids=None):
            calls.append(("sampler", tuple(hidden_states.shape)))

    def propose(*, head, draft_hidden, lm_head, embed_tokens, anchor, **kwargs):
        calls.append(("eager", tuple(draft_hidden.shape), tuple(anchor.shape)))
        return torch.zeros(1), None, None

    monkeypatch.setattr(lilicorr_utils, "propose_lilicorr_block", propose)
    target = SimpleNamespace(
        lm_head=torch.nn.Linear(6, 20, bias=False), get_input_embeddings=lambda: torch.nn.Embedding(20, 6)
    )
    worker = SimpleNamespace(
        block_size=4,
        lilicorr=SimpleNamespace(context_proj=SimpleNamespace(input_size=5)),
        _draft_sampler=Sampler(),
        target_worker=SimpleNamespace(
            model_runner=SimpleNamespace(model=target, model_config=SimpleNamespace(vocab_size=18))
        ),
    )
    ms = {"lm_head": 0.5, "proposal": 0.8}

    def time_ms(fn, *, graph):
        fn()
        return ms["proposal"] if calls and calls[-1][0] in ("sampler", "eager") else ms["lm_head"]

    result = stage_timer.proposal_microbench(worker, batch_sizes=[2], time_ms=time_ms)
    assert result["errors"] == []
    for variant in ("eager", "graph"):
        assert result["batch_sizes"]["2"][variant] == pytest.approx({"lm_head": 0.5, "proposal": 0.8, "spec_head": 0.3})
    assert ("eager", (2, 4, 6), (2, 5)) in calls and ("anchor", (2, 5), 2) in calls and ("sampler", (8, 6)) in calls


def test_builtin_eager_proposal_is_a_draft_sample_span(monkeypatch, tmp_path):
    monkeypatch.setattr(
        dflash_worker_v2, "propose_lilicorr_block", dflash_worker_v2.propose_lilicorr_block
    )  # restored after
    clock = Clock()

    class BuiltinWorker(Worker):
        def __init__(self, clock):
            super().__init__(clock)
            self.lilicorr = object()

        def forward_batch_generation(self, batch, on_publish=None):
            self.draft_model_runner.graph = False
            self.draft_model_runner.forward(None)
            dflash_worker_v2.propose_lilicorr_block()  # the call DFlashWorkerV2 makes, through its module global
            self.target_worker.forward_batch_generation(batch=None, forward_batch=1, is_verify=True)
            self._accept_block()
            return "decode"

    def propose():
        clock.advance(0.4)

    monkeypatch.setattr(dflash_worker_v2, "propose_lilicorr_block", propose)
    worker = BuiltinWorker(clock)
    recorder = stage_timer.StageRecorder(tmp_path, events=Events(clock), clock=clock)
    stage_timer.attach(worker, recorder)
    run_steps(worker, clock, 2)
    (row,) = recorder.document()["stages"]
    assert row["graph"] is False and row["gpu_ms"]["draft_sample"]["median"] == pytest.approx(0.4)


def test_graph_capture_records_the_memory_it_took(tmp_path, monkeypatch):
    free = iter([10.0, 7.5])
    monkeypatch.setattr(stage_timer, "free_gib", lambda: next(free))
    clock = Clock()
    worker = Worker(clock)
    recorder = stage_timer.StageRecorder(tmp_path, events=Events(clock), clock=clock)
    stage_timer.attach(worker, recorder, memory=lambda w: {"draft_gib": 2.0})
    worker.init_cuda_graphs()
    memory = json.loads(recorder.path.read_text())["memory"]
    assert memory == {"draft_gib": 2.0, "free_after_graphs_gib": 7.5, "graphs_gib": 2.5}


# --- from_timings and the CLI ---------------------------------------------------------------


def timings_doc(verify, draft, lm_head, spec_head, wall, *, bs=1, graph=True, n=200, gpu="H100", draft_sample=None):
    gpu_ms = {
        "step": {"count": n, "mean": wall, "median": wall},
        "target_verify": {"count": n, "mean": verify, "median": verify},
        "draft_forward": {"count": n, "mean": draft, "median": draft},
    }
    if draft_sample is not None:
        gpu_ms["draft_sample"] = {"count": n, "mean": draft_sample, "median": draft_sample}
    variant = "graph" if graph else "eager"
    return {
        "system": {"algorithm": "X", "gpu": gpu, "block_size": 16},
        "decode_steps": n,
        "stages": [
            {
                "bs": bs,
                "graph": graph,
                "n_blocks": n,
                "step_interval_ms": {"count": n - 1, "mean": wall + 1, "median": wall},
                "gpu_ms": gpu_ms,
                "host_ms": gpu_ms,
            }
        ],
        "proposal": {
            "batch_sizes": {
                str(bs): {variant: {"lm_head": lm_head, "spec_head": spec_head, "proposal": lm_head + spec_head}}
            },
            "errors": [],
        },
    }


def test_from_timings_decomposes_the_block():
    doc = stages.from_timings(
        {"lilicorr": timings_doc(7.5, 2.1, 0.5, 0.3, 11.0), "dflash": timings_doc(7.4, 1.8, 0.5, 0.05, 10.0)}
    )
    lil, dfl = doc["systems"]
    assert lil["system"] == "lilicorr" and lil["variant"] == "graph" and lil["n_blocks"] == 200
    assert lil["stages"] == pytest.approx(
        {"target_verify": 7.5, "draft_backbone": 1.3, "lm_head": 0.5, "spec_head": 0.3, "accept": 1.4}
    )
    assert lil["per_block_wall"] == 11.0 and sum(lil["stages"].values()) == pytest.approx(11.0)
    assert dfl["stages"]["draft_backbone"] == pytest.approx(1.25) and doc["device"] == "H100"
    # floors: a micro-benchmark larger than the in-server draft, a wall below the GPU stages
    floor = stages.from_timings({"x": timings_doc(7.0, 0.4, 0.5, 0.3, 6.0)})["systems"][0]["stages"]
    assert floor["draft_backbone"] == 0.0 and floor["accept"] == 0.0
    eager = stages.from_timings(
        {"x": timings_doc(7.0, 2.0, 0.6, 0.4, 12.0, graph=False, draft_sample=0.9)}, graph=False
    )
    assert eager["systems"][0]["variant"] == "eager"
    assert eager["systems"][0]["stages"]["draft_backbone"] == pytest.approx(2.0 + 0.9 - 1.0)


def test_from_timings_names_what_is_missing():
    with pytest.raises(stages.StageSchemaError, match=r"recorded: \[\(1, 'graph'\)\]"):
        stages.from_timings({"x": timings_doc(7.0, 2.0, 0.5, 0.3, 11.0)}, bs=4)
    with pytest.raises(stages.StageSchemaError, match="LILICORR_STAGE_TIMING_BS"):
        doc = timings_doc(7.0, 2.0, 0.5, 0.3, 11.0)
        doc["proposal"] = {"batch_sizes": {}, "errors": ["bs=1 graph lm_head: OOM"]}
        stages.from_timings({"x": doc})
    with pytest.raises(stages.StageSchemaError, match="no stages-<pid>.json"):
        stages.load_timings(os.devnull + "-missing")


def test_cli_stages_from_server_timings(tmp_path, capsys):
    for name, doc, pid in (
        ("lilicorr", timings_doc(7.5, 2.1, 0.5, 0.3, 11.0), 11),
        ("dflash", timings_doc(7.4, 1.8, 0.5, 0.05, 10.0), 12),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"stages-{pid}.json").write_text(json.dumps(doc))
    stale = timings_doc(9.0, 9.0, 0.5, 0.3, 30.0, n=5)  # an earlier, shorter server run in the same folder
    (tmp_path / "lilicorr" / "stages-10.json").write_text(json.dumps(stale))
    out = tmp_path / "report"
    argv = [
        "--timings",
        f"lilicorr={tmp_path / 'lilicorr'}",
        f"dflash={tmp_path / 'dflash'}",
        "--out",
        str(out),
    ]
    assert stages.main(argv) == 0
    doc = json.loads((out / "stages.json").read_text())
    assert [s["system"] for s in doc["systems"]] == ["lilicorr", "dflash"]
    assert doc["systems"][0]["per_block_wall"] == 11.0  # the longest run in the folder
    md = (out / "stages.md").read_text()
    assert "| Speculative head | 0.30 | **0.05** |" in md and (out / "stages.png").stat().st_size > 0
    assert "lilicorr (graph)" in capsys.readouterr().out
    # the file form still works, and exactly one of the two forms is required
    assert stages.main([str(out / "stages.json"), "--out", str(tmp_path / "again")]) == 0
    assert stages.main(["--out", str(out)]) == 2
    assert "exactly one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        stages.main(["--timings", "no-equals-sign", "--out", str(out)])


def test_forced_acceptance_is_noted_under_the_table_and_the_plain_step_is_read():
    forced = timings_doc(7.5, 2.1, 0.5, 0.3, 11.0)
    forced["system"]["forced_commit_len"] = 7.0
    doc = stages.from_timings({"lilicorr": forced, "dflash": timings_doc(7.4, 1.8, 0.5, 0.05, 10.0)})
    assert [s["forced_commit_len"] for s in doc["systems"]] == [7.0, None]
    assert "every block committed 7 tokens" in stages.table(doc)
    assert "Forced" not in stages.table(stages.from_timings({"dflash": timings_doc(7.4, 1.8, 0.5, 0.05, 10.0)}))
    plain = timings_doc(6.0, 0.0, 0.0, 0.0, 6.5, bs=4)
    assert stages.plain_step_ms(plain, 4) == 6.5
    with pytest.raises(stages.StageSchemaError, match=r"plain decode step \(bs=8, graph\)"):
        stages.plain_step_ms(plain, 8)
