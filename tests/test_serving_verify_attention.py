"""serving/verify_attention.py: which verify attention a LILICORR target runs, and that SGLang's split-KV verify
kernel, as the plugin runs it, computes the prefill kernel's attention (both kernels under Triton's interpreter, in a
subprocess: SGLang's kernel modules must be imported with TRITON_INTERPRET=1 set)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402

from sglang_lilicorr.serving import verify_attention as va  # noqa: E402
from sglang_lilicorr.serving.draft_check import ServingConfigError  # noqa: E402


def triton_backend(topk: int = 1, heads: int = 9) -> TritonAttnBackend:
    backend = object.__new__(TritonAttnBackend)  # the attributes configure reads and writes, no GPU
    backend.topk, backend.num_head, backend.use_verify_splitkv = topk, heads, False
    return backend


def test_the_setting_is_checked_and_defaults_to_auto(monkeypatch):
    monkeypatch.delenv(va.ENV, raising=False)
    assert va.choice() == va.AUTO
    monkeypatch.setenv(va.ENV, "splitkv")
    with pytest.raises(ServingConfigError, match="LILICORR_VERIFY_ATTENTION='splitkv'.*auto, split-kv, extend"):
        va.choice()


@pytest.mark.parametrize(
    "setting, heads, expected",
    [
        ("auto", 9, True),
        ("auto", 16, True),
        ("auto", 17, False),
        ("auto", 32, False),
        ("split-kv", 32, True),
        ("extend", 9, False),
    ],
)
def test_which_targets_get_the_split_kv_kernel(setting, heads, expected):
    assert va.wanted(setting, heads) is expected


@pytest.fixture
def warmed(monkeypatch) -> list:
    """configure's warm-up, recorded instead of run: the backends it warmed."""
    calls = []
    monkeypatch.setattr(va, "zero_scratch", lambda: None)
    monkeypatch.setattr(
        va, "warm", lambda backend, block_size, dtype, lengths: calls.append((backend, block_size)) or True
    )
    return calls


def test_configure_switches_the_warmed_triton_backends_of_a_chain(warmed, caplog):
    ours, other, tree = triton_backend(), object(), triton_backend(topk=4)
    with caplog.at_level("INFO"):
        assert va.configure([ours, other, tree], 16, None, va.AUTO)
    assert ours.use_verify_splitkv and not tree.use_verify_splitkv and warmed == [(ours, 16)]
    assert "split-KV verify kernel, warmed" in caplog.text and "9 query heads" in caplog.text


def test_configure_leaves_sglangs_kernel_where_not_asked_or_not_triton(warmed, caplog, monkeypatch):
    monkeypatch.delenv(va.ENV, raising=False)
    wide, narrow = triton_backend(heads=32), triton_backend()
    with caplog.at_level("INFO"):
        assert not va.configure([wide], 16, None, va.AUTO)
        assert not va.configure([narrow], 16, None, va.EXTEND)
        assert not va.configure([object()], 16, None, va.SPLIT_KV)
    assert not wide.use_verify_splitkv and not narrow.use_verify_splitkv and warmed == []
    assert "32 query heads" in caplog.text
    assert caplog.records[-1].levelname == "INFO" and caplog.records[-1].getMessage() == (
        "LILICORR: target verify attention: the target backend's own kernel (object); LILICORR_VERIFY_ATTENTION "
        "picks between SGLang's Triton backend's kernels only."
    )


class FlashInferAttnBackend:  # stands in for SGLang's (its name is what the line shows)
    pass


def test_the_line_names_the_non_triton_backend_that_serves_the_verify(warmed, caplog, monkeypatch):
    """A LILICORR target on flashinfer (the variable unset: set, the server would not have started) says whose kernel
    verifies; a DFLASH server with the variable set says, as a warning, that it is ignored there."""
    monkeypatch.delenv(va.ENV, raising=False)
    with caplog.at_level("INFO"):
        assert not va.configure([FlashInferAttnBackend()], 16, None)
    assert caplog.records[-1].getMessage() == (
        "LILICORR: target verify attention: the target backend's own kernel (FlashInferAttnBackend); "
        "LILICORR_VERIFY_ATTENTION picks between SGLang's Triton backend's kernels only."
    )
    monkeypatch.setenv(va.ENV, va.SPLIT_KV)
    with caplog.at_level("INFO"):
        assert not va.configure([FlashInferAttnBackend()], 16, None)
    assert caplog.records[-1].levelname == "WARNING" and caplog.records[-1].getMessage().endswith(
        "kernels only, so LILICORR_VERIFY_ATTENTION=split-kv is ignored here."
    )
    assert warmed == []


@pytest.mark.parametrize("setting", [va.AUTO, va.SPLIT_KV, va.EXTEND])
def test_an_explicit_setting_on_a_target_not_on_triton_is_refused(setting, monkeypatch):
    monkeypatch.setenv(va.ENV, setting)
    va.check_target_backend("triton")
    with pytest.raises(ServingConfigError) as refused:
        va.check_target_backend("flashinfer")
    assert str(refused.value) == (
        f"LILICORR_VERIFY_ATTENTION='{setting}' picks the target verify's kernel on SGLang's Triton attention backend, "
        "but the target runs flashinfer, which verifies with its own kernel: unset LILICORR_VERIFY_ATTENTION, or serve "
        "with --attention-backend triton."
    )
    monkeypatch.delenv(va.ENV)
    va.check_target_backend("flashinfer")  # unset: the backend's own kernel, said at start-up


def test_every_split_count_is_warmed_only_where_eager_verifies_can_occur(monkeypatch, caplog):
    counts = []
    monkeypatch.setattr(va, "zero_scratch", lambda: None)
    monkeypatch.setattr(va, "warm", lambda backend, block_size, dtype, lengths: counts.append(len(lengths)) or True)
    with caplog.at_level("INFO"):
        assert va.configure([triton_backend()], 16, None, va.AUTO, eager=True)
        assert va.configure([triton_backend()], 16, None, va.AUTO, eager=False)
    assert counts == [len(va.probe_lengths()), 1] and len(va.probe_lengths()) == 3
    assert "warmed at 3 of its 3 split counts (eager verifies can occur" in caplog.text
    assert "warmed at 1 of its 3 split counts (every verify batch within the graphs" in caplog.text


@pytest.mark.parametrize(
    "backend_name, sizes, running, expected",
    [
        ("FULL", [1, 2, 4, 32], 32, False),
        ("FULL", [1, 2, 4, 32], 33, True),
        ("FULL", [1, 16], 32, True),
        ("FULL", [1, 16], None, True),
        ("FULL", [], 8, True),
        ("DISABLED", [1, 32], 8, True),
    ],
)
def test_eager_batches_are_possible_above_the_largest_graph_or_without_graphs(
    monkeypatch, backend_name, sizes, running, expected
):
    import sglang.srt.runtime_context as runtime_context
    from sglang.srt.model_executor.cuda_graph_config import Backend

    from sglang_lilicorr.serving import graphs

    decode = type("Decode", (), {"bs": sizes, "backend": getattr(Backend, backend_name)})()
    context = type("Exec", (), {"graph": type("G", (), {"cuda_graph_config": type("C", (), {"decode": decode})()})()})()
    monkeypatch.setattr(runtime_context, "get_exec", lambda: context)
    assert graphs.graph_batch_sizes() == sizes
    assert graphs.eager_batches_possible(running) is expected


def test_a_second_configure_keeps_the_first_choice_without_warming_again(warmed, caplog):
    backend = triton_backend()
    assert va.configure([backend], 16, None, va.SPLIT_KV)
    caplog.clear()
    with caplog.at_level("INFO"):
        assert va.configure([backend], 16, None, va.EXTEND)  # the DFLASH hook ran first: LILICORR's own call keeps it
    assert backend.use_verify_splitkv and warmed == [(backend, 16)] and caplog.text == ""
    kept = triton_backend()
    assert not va.configure([kept], 16, None, va.EXTEND) and not va.configure([kept], 16, None, va.SPLIT_KV)
    assert not kept.use_verify_splitkv and warmed == [(backend, 16)]


def test_the_dflash_hook_configures_the_workers_target_by_the_environment(warmed, monkeypatch):
    backend = triton_backend()

    from sglang_lilicorr.serving import graphs

    class Worker:
        block_size = 16
        model_runner = type("Runner", (), {"attn_backend": backend, "dtype": torch.bfloat16})()
        server_args = type("Args", (), {"max_running_requests": 48})()

    asked = []
    monkeypatch.setattr(graphs, "eager_batches_possible", lambda running: asked.append(running) or True)
    monkeypatch.setenv(va.ENV, va.SPLIT_KV)
    assert va.after_dflash_init(None, Worker()) is None  # an AFTER hook that keeps the method's result
    assert backend.use_verify_splitkv and warmed == [(backend, 16)] and asked == [48]


def test_the_plugin_hooks_sglangs_dflash_worker_only_where_the_setting_is_set():
    """In a fresh interpreter, as SGLang's processes load plugins: the DFLASH worker's init_attention_backends is
    wrapped with the verify attention hook when LILICORR_VERIFY_ATTENTION is set, and left as SGLang ships it when
    not."""
    script = textwrap.dedent("""
        from sglang.srt.plugins import load_plugins
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
        from sglang_lilicorr.serving import verify_attention as va
        load_plugins()
        hooks = [h for _, h, _ in HookRegistry._hooks.get(va.DFLASH_INIT, [])]
        print(hasattr(DFlashWorkerV2.init_attention_backends, "__wrapped__"), hooks == [va.after_dflash_init])
    """)
    runs = {  # both interpreters at once: each spends its time importing SGLang
        expected: subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, va.ENV: env, "SGLANG_PLUGINS": "lilicorr"},
        )
        for env, expected in ((va.SPLIT_KV, "True True"), ("", "False False"))
    }
    for expected, process in runs.items():
        out, err = process.communicate(timeout=300)
        assert out.strip().splitlines()[-1:] == [expected], err[-2000:]


@pytest.mark.parametrize("outcome", ["declines", "raises"])
def test_a_kernel_that_declines_or_fails_its_warm_up_is_not_switched_on(monkeypatch, caplog, outcome):
    def warm(backend, block_size, dtype, lengths):
        if outcome == "raises":
            raise RuntimeError("no sm_90 build")
        return False

    monkeypatch.setattr(va, "zero_scratch", lambda: None)
    monkeypatch.setattr(va, "warm", warm)
    backend = triton_backend()
    with caplog.at_level("INFO"):
        assert not va.configure([backend], 16, None, va.AUTO)
    assert not backend.use_verify_splitkv
    assert ("failed its warm-up (RuntimeError: no sm_90 build)" if outcome == "raises" else "declines") in caplog.text


def test_warm_runs_every_split_count_an_eager_verify_can_pick():
    from sglang.kernels.ops.attention.verify_splitkv import MAX_N_SPLITS, MIN_N_SPLITS, choose_n_splits

    class Pool:
        start_layer = 3

        def get_key_buffer(self, layer):
            assert layer == 3
            return torch.zeros(64, 3, 64)

        get_value_buffer = get_key_buffer

    seen = []

    def fake_kernel(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, *rest, max_bs):
        assert q.shape == (16, 9, 64) and k.shape == (16, 3, 64) and max_bs == 48
        assert qo_indptr.tolist() == [0, 16] and kv_indptr.tolist() == [0, kv_indices.numel()]
        seen.append(choose_n_splits(kv_indices.numel()))
        return True

    backend = triton_backend()
    backend.num_kv_head, backend.token_to_kv_pool = 3, Pool()
    backend.req_to_token_pool = type("R", (), {"size": 48})()
    backend.verify_splitkv_fwd = fake_kernel
    assert va.warm(backend, 16, torch.float32, va.probe_lengths())
    assert sorted(seen) == sorted(set(seen)) and min(seen) == MIN_N_SPLITS and max(seen) == MAX_N_SPLITS
    backend.verify_splitkv_fwd = lambda *a, **k: False
    assert not va.warm(backend, 16, torch.float32, va.probe_lengths())


def test_target_attention_backends_unwraps_a_hybrid_backend_once():
    class Hybrid:
        def __init__(self, prefill, decode):
            self.prefill_backend, self.decode_backend = prefill, decode

    prefill, decode = object(), object()
    hybrid = Hybrid(prefill, decode)

    class Runner:
        attn_backend, decode_attn_backend = hybrid, decode

    assert va.target_attention_backends(Runner()) == [hybrid, prefill, decode]


# Both kernels on one random verify batch (B = 16 queries a request, SmolLM2's 9 / 3 heads of 64), against an fp32
# reference; the scratch buffers start as NaN (what uninitialized memory may hold), and the split-KV kernel runs as the
# plugin runs it (`zero_scratch`) or as SGLang allocates it. `KERNELS SEED MODE...`: each mode in a child forked once
# the kernels are imported, each printing one JSON line.
KERNELS = textwrap.dedent("""
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from sglang.kernels.ops.attention import verify_splitkv
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    for mode in sys.argv[2:]:
        pid = os.fork()
        if pid:
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, mode
            continue
        break
    else:
        sys.exit(0)
    if mode == "zeroed":
        from sglang_lilicorr.serving.verify_attention import zero_scratch
        zero_scratch()
    empty = torch.empty
    torch.empty = lambda *a, **k: empty(*a, **k).fill_(float("nan"))  # uninitialized memory at its worst
    g = torch.Generator().manual_seed(int(sys.argv[1]))
    B, hq, hkv, d, prefix = 16, 9, 3, 64, [37, 70]  # prefixes shorter than the kernel's splits
    pool = sum(prefix) + 8
    rand = lambda *s: torch.randn(*s, generator=g).half()
    kbuf, vbuf = rand(pool, hkv, d), rand(pool, hkv, d)
    q, k, v = rand(2 * B, hq, d), rand(2 * B, hkv, d), rand(2 * B, hkv, d)
    kv_indptr = torch.tensor([0, prefix[0], sum(prefix)], dtype=torch.int32)
    kv_indices = torch.randperm(pool, generator=g)[: sum(prefix)]
    qo_indptr = torch.arange(0, 2 * B + 1, B, dtype=torch.int32)
    ref = torch.empty(2 * B, hq, d)
    for b, n in enumerate(prefix):
        idx = kv_indices[kv_indptr[b]: kv_indptr[b + 1]]
        keys = torch.cat([kbuf[idx], k[b * B:(b + 1) * B]]).float()
        values = torch.cat([vbuf[idx], v[b * B:(b + 1) * B]]).float()
        allowed = torch.ones(B, n + B, dtype=torch.bool)
        allowed[:, n:] = torch.tril(torch.ones(B, B, dtype=torch.bool))
        for h in range(hq):
            s = q[b * B:(b + 1) * B, h].float() @ keys[:, h // 3].T / d ** 0.5
            ref[b * B:(b + 1) * B, h] = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ values[:, h // 3]
    out = {}
    for name in ("extend", "split_kv"):
        o = torch.zeros_like(q)
        args = (q, k, v, o, kbuf, vbuf, qo_indptr, kv_indptr, kv_indices, None, True, None, B, 1.0, 1.0)
        if name == "extend":
            extend_attention_fwd(*args)
        else:
            assert verify_splitkv.verify_splitkv_fwd(*args)
        out[name] = (o.float() - ref).abs().nan_to_num(nan=float("inf")).max().item()
    print(json.dumps({"mode": mode, **out}), flush=True)
    os._exit(0)
""")


@pytest.fixture(scope="module")
def kernel_errors() -> dict:
    """{mode: the kernels' errors}: KERNELS' two modes in one subprocess (SGLang's kernels imported once), on SEED."""
    import json

    from conftest import SEED

    done = subprocess.run(
        [sys.executable, "-c", KERNELS, str(SEED), "zeroed", "sglang"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {row["mode"]: row for row in map(json.loads, done.stdout.strip().splitlines())}


def test_split_kv_verify_equals_the_prefill_kernel_with_zeroed_scratch(kernel_errors):
    errors = kernel_errors["zeroed"]
    assert errors["extend"] < 2e-3 and errors["split_kv"] < 2e-3, errors


def test_split_kv_verify_without_zeroed_scratch_is_not_finite(kernel_errors):
    """Why zero_scratch exists: SGLang's allocation alone leaves NaN in a request whose prefix leaves a split empty."""
    assert kernel_errors["sglang"]["split_kv"] == float("inf")
