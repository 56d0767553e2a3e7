"""The compile-only pass (fast_path/precompile.py): launches become warmups whose compiles run on a thread pool,
everything is restored afterwards, the pass does nothing where it cannot help and never stops a start-up; the
proposer runs it at the draft-graph and eager batch sizes once each (serving/proposer.py)."""

import logging
import threading

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import _async_compile
from triton.runtime.jit import JITFunction

from sglang_lilicorr.fast_path import precompile as pc


def _add_one(x_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)


KERNEL = JITFunction(_add_one)  # compiled mode whatever this session's TRITON_INTERPRET


class Launches:
    """JITFunction.run stood in for (no CUDA driver here): records each call, and under an active AsyncCompileMode
    submits a compile keyed by N, as Triton's _do_compile does."""

    def __init__(self, fail: bool = False):
        self.calls, self.compiled_in, self.finalized, self.fail = [], [], [], fail

    def __call__(self, fn, *args, grid, warmup, **kwargs):
        mode = _async_compile.active_mode.get()
        self.calls.append((warmup, mode is not None))
        if mode is not None:

            def compile_fn():
                self.compiled_in.append(threading.current_thread().name)
                if self.fail:
                    raise ValueError("ptxas said no")
                return "binary"

            mode.submit(("N", kwargs.get("N")), compile_fn, self.finalized.append)

    def install(self, monkeypatch) -> "Launches":
        """As JITFunction.run (self.method), a method like the one it stands in for."""

        def run(fn, *args, grid, warmup, **kwargs):
            assert isinstance(fn, JITFunction)
            return self(fn, *args, grid=grid, warmup=warmup, **kwargs)

        self.method = run
        monkeypatch.setattr(JITFunction, "run", run)
        return self


@pytest.fixture
def launches(monkeypatch):
    return Launches().install(monkeypatch)


def test_launches_become_warmups_compiled_on_the_pool_and_run_is_restored(launches):
    x = torch.zeros(4)
    with pc.compile_only(2) as report:
        KERNEL[(1,)](x, N=4)
        KERNEL[(1,)](x, N=4)  # the same key: one compile
        KERNEL[(1,)](x, N=8)
        assert _async_compile.active_mode.get() is not None
    assert launches.calls == [(True, True)] * 3
    assert sorted(launches.finalized) == ["binary", "binary"]  # every future finished on exit
    assert all(name.startswith("lilicorr-compile") for name in launches.compiled_in)
    assert (report.compiled, report.failed, report.threads) == (2, 0, 2) and report.seconds >= 0
    assert JITFunction.run is launches.method and _async_compile.active_mode.get() is None
    KERNEL[(1,)](x, N=4)  # outside: a real launch again
    assert launches.calls[-1] == (False, False)


def test_an_exception_inside_still_finishes_the_compiles_and_restores_everything(launches):
    with pytest.raises(RuntimeError, match="select broke"):
        with pc.compile_only(2):
            KERNEL[(1,)](torch.zeros(4), N=4)
            raise RuntimeError("select broke")
    assert launches.finalized == ["binary"]
    assert JITFunction.run is launches.method and _async_compile.active_mode.get() is None


def test_a_failed_compile_is_counted_and_left_to_its_launch(monkeypatch):
    fake = Launches(fail=True).install(monkeypatch)
    with pc.compile_only(2) as report:
        KERNEL[(1,)](torch.zeros(4), N=4)
    assert (report.compiled, report.failed) == (1, 1) and "ValueError: ptxas said no" in report.first_error
    assert fake.finalized == [] and _async_compile.active_mode.get() is None


def test_threads_follow_the_cpus_up_to_the_cap(monkeypatch):
    monkeypatch.setattr(pc.os, "sched_getaffinity", lambda pid: set(range(3)), raising=False)
    assert pc.compile_threads() == 3
    monkeypatch.setattr(pc.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert pc.compile_threads() == pc.MAX_THREADS


@pytest.fixture
def cuda_here(monkeypatch):
    """A CUDA device as far as `unavailable` asks."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def _never_run():
    raise AssertionError("a no-op pass ran its callable")


def test_nothing_runs_under_the_interpreter_off_cuda_while_capturing_or_without_async_compile(monkeypatch, cuda_here):
    cuda = torch.device("cuda")
    assert pc.unavailable(cuda) is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pc.unavailable(cuda) == "Triton's interpreter" and pc.precompile(_never_run, device=cuda, label="t") is None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "not a CUDA device" in pc.unavailable(torch.device("cpu"))
    assert pc.precompile(_never_run, device=torch.device("cpu"), label="t") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "not a CUDA device" in pc.unavailable(cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert pc.precompile(_never_run, device=cuda, label="t") is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delattr(triton, "AsyncCompileMode")
    assert pc.unavailable(cuda) == "this Triton has no AsyncCompileMode"
    assert pc.precompile(_never_run, device=cuda, label="t") is None


def test_a_failing_pass_logs_one_warning_and_start_up_continues(cuda_here, caplog):
    original = JITFunction.run

    def broken():
        raise ValueError("boom")

    with caplog.at_level(logging.INFO, logger=pc.__name__):
        assert pc.precompile(broken, device=torch.device("cuda"), label="LILICORR select") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "LILICORR select" in warnings[0].getMessage()
    assert "ValueError: boom" in warnings[0].getMessage() and "compile when first launched" in warnings[0].getMessage()
    assert JITFunction.run is original and _async_compile.active_mode.get() is None


def test_a_pass_logs_what_it_compiled(cuda_here, launches, caplog):
    with caplog.at_level(logging.INFO, logger=pc.__name__):
        report = pc.precompile(lambda: KERNEL[(1,)](torch.zeros(4), N=4), device=torch.device("cuda"), label="sel")
    assert report.compiled == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert (
        line.startswith("sel: 1 Triton kernels compiled concurrently (or read from Triton's cache) on ")
        and " s." in line
    )


# --- the proposer's passes ---------------------------------------------------------------------------------------


def _proposer(max_rows: int = 6):
    from sglang_lilicorr.config import LiLiCorrConfig
    from sglang_lilicorr.head import LiLiCorrHead
    from sglang_lilicorr.serving.proposer import LiLiCorrProposer

    cfg = LiLiCorrConfig(block_size=6, candidate_topk=4, factor_dim=16, hidden_size=32, num_heads=4, num_layers=2)
    head = LiLiCorrHead(cfg, model_hidden_size=24).eval()
    proposer = LiLiCorrProposer(
        head=head, lm_head_weight=torch.randn(64, 24), embed_weight=torch.randn(64, 24), block_size=6
    )
    proposer.allocate(num_request_slots=max_rows, max_rows=max_rows)
    return proposer


def test_the_proposer_passes_each_size_once_and_warm_only_what_is_left(monkeypatch):
    from sglang_lilicorr.serving import proposer as module

    proposer, passes, shapes = _proposer(), [], []

    def fake_precompile(run, *, device, label):
        passes.append(label)
        run()
        return pc.CompileReport(threads=1)

    monkeypatch.setattr(module, "precompile", fake_precompile)
    direct = proposer.propose
    monkeypatch.setattr(proposer, "propose", lambda h, a: shapes.append(tuple(h.shape)) or direct(h, a))
    assert proposer.eager_sizes(graph_batch_sizes=[1, 2], capture=True, max_batch=5) == [3, 4, 5]  # no capture on CPU
    assert proposer.precompile(graph_batch_sizes=[2, 1], eager_sizes=[3, 4]) is not None
    assert passes == ["LILICORR select, draft graphs at bs [1, 2], eager proposal at bs [3, 4]"]
    assert shapes == [(1, 5, 24), (2, 5, 24), (3, 5, 24), (4, 5, 24)]  # __call__ on [b * B, Hm] blocks, then eager
    assert proposer.precompile(graph_batch_sizes=[1, 2], eager_sizes=[3, 4]) is None  # done: no second pass
    shapes.clear()
    assert proposer.warm(graph_batch_sizes=[1, 2], capture=True) == [3, 4, 5, 6]
    assert passes[1:] == ["LILICORR select, draft graphs at bs -, eager proposal at bs [5, 6]"]
    assert shapes == [(5, 5, 24), (6, 5, 24), (3, 5, 24), (4, 5, 24), (5, 5, 24), (6, 5, 24)]


def test_the_proposer_pass_is_a_no_op_on_the_cpu():
    proposer = _proposer()
    assert proposer.precompile(graph_batch_sizes=[1, 2], eager_sizes=[3]) is None and proposer.precompiled == set()
    assert proposer.warm(graph_batch_sizes=[1, 2], capture=True) == [3, 4, 5, 6]


# --- on the GPU ----------------------------------------------------------------------------------------------------


def _clear_kernel_caches() -> int:
    """Empties the in-process kernel cache of every @triton.jit kernel of ours (their next launch compiles, or loads
    from Triton's disk cache) -> how many kernels."""
    from benchmarks.micro.compile_census import _jit_kernels

    kernels = [fn for fn in _jit_kernels().values() if isinstance(fn, JITFunction)]
    for fn in kernels:
        fn.device_caches.clear()
    return len(kernels)


@pytest.mark.gpu
def test_after_the_pass_the_served_sizes_compile_nothing_and_propose_the_same():
    """The testbed head's geometry (random weights): after the pass at draft-graph sizes covering every plan bucket
    and the eager sizes above them, the proposal at each size compiles no kernel and equals the proposal of a run
    without the pass."""
    from benchmarks.micro.compile_census import GEOMETRIES
    from sglang_lilicorr.config import LiLiCorrConfig
    from sglang_lilicorr.head import LiLiCorrHead
    from sglang_lilicorr.serving.proposer import LiLiCorrProposer

    geo, dev, dtype = GEOMETRIES["testbed"], torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    cfg = LiLiCorrConfig(**geo.config)
    head = LiLiCorrHead(cfg, model_hidden_size=geo.model_hidden).to(dev, dtype).eval()
    lm = (torch.randn(geo.vocab, geo.model_hidden, device=dev) * geo.model_hidden**-0.5).to(dtype)
    embed = torch.randn(geo.vocab, geo.model_hidden, device=dev, dtype=dtype)
    graph_sizes, rows = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32], 48

    def fresh():
        proposer = LiLiCorrProposer(head=head, lm_head_weight=lm, embed_weight=embed, block_size=cfg.block_size)
        proposer.allocate(num_request_slots=rows, max_rows=rows)
        proposer.publish_anchors(
            torch.randn(rows, geo.model_hidden, device=dev, dtype=dtype), torch.arange(rows, device=dev)
        )
        proposer.stage_anchors(torch.arange(rows, device=dev).flip(0))
        return proposer

    g = torch.Generator(device=dev).manual_seed(1)
    blocks = torch.randn(rows * cfg.block_size, geo.model_hidden, device=dev, dtype=dtype, generator=g)

    def proposals(proposer, eager_sizes):
        out = {}
        for b in graph_sizes:
            proposer(blocks[: b * cfg.block_size])
            out[("draft", b)] = proposer.out[: b * proposer.slots].clone()
        for b in eager_sizes:
            pass_hidden = blocks[: b * cfg.block_size].view(b, cfg.block_size, -1)[:, 1:].contiguous()
            out[("eager", b)] = proposer.propose(pass_hidden, proposer.anchors[:b]).clone()
        torch.cuda.synchronize()
        return out

    torch.manual_seed(2)
    plain = fresh()
    eager_sizes = plain.eager_sizes(graph_batch_sizes=graph_sizes, capture=True, max_batch=rows)
    assert eager_sizes == [40, 48]
    _clear_kernel_caches()
    want = proposals(plain, eager_sizes)

    assert _clear_kernel_caches() >= 10
    torch.manual_seed(2)
    warmed = fresh()
    report = warmed.precompile(graph_batch_sizes=graph_sizes, eager_sizes=eager_sizes)
    assert report is not None and report.failed == 0 and report.compiled >= 20, report
    compiled = []
    before = triton.knobs.runtime.jit_post_compile_hook
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["fn"].name)
    try:
        got = proposals(warmed, eager_sizes)
    finally:
        triton.knobs.runtime.jit_post_compile_hook = before
    assert compiled == [], f"kernels compiled after the pass: {compiled}"
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
