"""The start-up pass over the target prefill's attention kernel (serving/target_warmup.py): the launches it builds
through SGLang's own `TritonAttnBackend.forward_extend` key like those of served prefills of any batch size (1 to 48
prompts, uneven lengths, cached prefixes, both q/k/v layouts a model passes), so none of those compiles after start-up;
it does nothing, and says why, on a CPU, another backend or a backend that runs another kernel; it never raises."""

from __future__ import annotations

import logging
import types

import pytest
import torch

pytest.importorskip("sglang")

from sglang.kernels.ops.attention import extend_attention as ea  # noqa: E402
from sglang.srt.layers.attention.triton_backend import ForwardMetadata, TritonAttnBackend  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from sglang_lilicorr.fast_path import precompile as pc  # noqa: E402
from sglang_lilicorr.serving import target_warmup as tw  # noqa: E402

MAX_BS = 48
SLOTS = 512


class Pool:
    """SGLang's MHA KV pool as the backend reads it: one [slots, kv heads, head dim] buffer per layer and side."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype, device):
        self.k = [torch.zeros(SLOTS, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(SLOTS, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.writes = 0

    def get_key_buffer(self, layer_id):
        return self.k[layer_id]

    def get_value_buffer(self, layer_id):
        return self.v[layer_id]

    def get_kv_buffer(self, layer_id):
        return self.k[layer_id], self.v[layer_id]

    def set_kv_buffer(self, *args, **kwargs):
        self.writes += 1


def triton_backend(pool: Pool, device) -> TritonAttnBackend:
    """SGLang's Triton backend with the attributes its forward_extend reads, as its __init__ sets them (no GPU)."""
    backend = object.__new__(TritonAttnBackend)
    backend.skip_prefill, backend.token_to_kv_pool, backend.page_size = False, pool, 1
    backend.qo_indptr = torch.zeros(MAX_BS + 1, dtype=torch.int64, device=device)
    backend.kv_indptr = torch.zeros(MAX_BS + 1, dtype=torch.int32, device=device)
    backend.forward_metadata, backend.dllm_attention = None, None
    backend.dcp_size, backend.enable_deterministic, backend.use_mla = 1, False, False
    backend.use_dense_fp8_chunked_prefill = backend.use_verify_shared_kv = backend.use_verify_splitkv = False
    backend.allow_bidirectional_attention_in_extend = False
    backend.req_to_token_pool = types.SimpleNamespace(size=MAX_BS)
    backend.extend_attention_fwd = ea.extend_attention_fwd
    return backend


class Model(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)


def runner(heads=9, kv_heads=3, head_dim=64, layers=2, device="cpu", dtype=torch.bfloat16, **layer_kwargs):
    """A target model runner as the pass reads it: its Triton backend, its model's RadixAttention layers, dtype."""
    attention = [
        RadixAttention(heads, head_dim, head_dim**-0.5, num_kv_heads=kv_heads, layer_id=i, **layer_kwargs)
        for i in range(layers)
    ]
    backend = triton_backend(Pool(layers, kv_heads, head_dim, dtype, device), device)
    return types.SimpleNamespace(
        attn_backend=backend, decode_attn_backend=None, model=Model(attention), device=device, dtype=dtype
    )


def serve_prefill(model_runner, layer, prompt_lens, prefix_lens, fused: bool):
    """A served prefill of len(prompt_lens) prompts through one layer, as SGLang runs it: the backend's metadata as its
    init_forward_metadata builds it for an extend, then q/k/v as a Llama (fused qkv, rotary in place) or a Qwen3
    (q and k normed into tensors of their own) attention hands them to the backend."""
    backend, device, dtype = model_runner.attn_backend, model_runner.device, model_runner.dtype
    bs = len(prompt_lens)
    kv_indptr, qo_indptr = backend.kv_indptr[: bs + 1], backend.qo_indptr[: bs + 1]
    kv_indptr[1:] = torch.cumsum(torch.tensor(prefix_lens, device=device), 0)
    qo_indptr[1:] = torch.cumsum(torch.tensor(prompt_lens, device=device), 0)
    kv_indices = torch.arange(sum(prefix_lens), dtype=torch.int64, device=device)  # torch.empty(sum) in SGLang
    backend.forward_metadata = ForwardMetadata(
        None, None, max(prompt_lens), None, kv_indptr, kv_indices, qo_indptr, None, None, None, None, None, None
    )
    tokens, hq, hk, d = sum(prompt_lens), layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, device=device).to(dtype)
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    if not fused:
        q, k = torch.nn.functional.rms_norm(q, (hq * d,)), torch.nn.functional.rms_norm(k, (hk * d,))
    forward_batch = types.SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        extend_seq_lens_cpu=list(prompt_lens),
        mha_one_shot=False,
        attn_attend_prefix_cache=None,
    )
    return backend.forward_extend(q, k.view(-1, hk, d), v.view(-1, hk, d), layer, forward_batch, save_kv_cache=False)


def served_batches():
    """Prefills a server meets: one prompt of one token (a cached prompt), every batch size to MAX_BS with uneven
    lengths, some with cached prefixes."""
    yield [1], [0]
    for bs in range(1, MAX_BS + 1):
        yield [1 + (7 * i) % 23 for i in range(bs)], [(5 * i) % 3 * 8 for i in range(bs)]


def launch_key(fn, args, kwargs):
    """What Triton's JITFunction.run keys a launch by: constexprs by value, None, integers by type and class (1, a
    multiple of 16, other), floats by type, tensors by dtype and 16-byte alignment; and the launch options."""
    names = [p.name for p in fn.params]
    bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
    key = []
    for p in fn.params:
        value = bound.get(p.name, p._param.default)
        if p.is_constexpr:
            key.append((p.name, "constexpr", value))
        elif value is None:
            key.append((p.name, None))
        elif isinstance(value, bool):
            key.append((p.name, "i1"))
        elif isinstance(value, int):
            cls = "1" if value == 1 else "D" if value % 16 == 0 else ""
            key.append((p.name, "i32" if -(2**31) <= value < 2**31 else "i64", cls))
        elif isinstance(value, float):
            key.append((p.name, "fp32"))
        elif isinstance(value, torch.Tensor):
            key.append((p.name, str(value.dtype), value.data_ptr() % 16 == 0))
        else:
            key.append((p.name, type(value).__name__, repr(value)))
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
    return tuple(key), options


class Launches:
    """JITFunction.run stood in for (no CUDA here): records every `_fwd_kernel` launch, its key and arguments."""

    def __init__(self, monkeypatch):
        self.keys, self.args, self.other = [], [], []

        def run(fn, *args, grid, warmup, **kwargs):
            if fn is not ea._fwd_kernel:
                self.other.append(fn)
                return None
            self.keys.append(launch_key(fn, args, kwargs))
            self.args.append((warmup, dict(zip([p.name for p in fn.params], args)) | kwargs))
            return None

        monkeypatch.setattr(JITFunction, "run", run)


@pytest.fixture
def launches(monkeypatch):
    return Launches(monkeypatch)


@pytest.fixture
def compiles_here(monkeypatch):
    """The compile-only pass runs as on a CUDA machine (it skips a CPU one)."""
    monkeypatch.setattr(pc, "unavailable", lambda device: None)


@pytest.mark.parametrize("geometry", [dict(heads=9, kv_heads=3, head_dim=64), dict(heads=32, kv_heads=8, head_dim=72)])
def test_every_served_prefill_keys_like_a_launch_of_the_pass(geometry, launches, compiles_here, caplog):
    model_runner = runner(**geometry)
    with caplog.at_level(logging.INFO, logger="sglang_lilicorr.fast_path.precompile"):
        report = tw.warm(model_runner)
    assert report is not None and "LILICORR target prefill attention (SGLang's _fwd_kernel) at batches of 1/2/16 " in (
        caplog.text
    )
    warmed, warm_args = set(launches.keys), list(launches.args)
    assert len(launches.keys) == 2 * len(tw.BATCHES) * 2  # layers x batches x layouts, every one a warmup
    assert all(warmup for warmup, _ in warm_args) and not launches.other
    assert len(warmed) == 3  # one binary per batch class; layers and layouts share it
    backend = model_runner.attn_backend
    assert backend.forward_metadata is None and backend.token_to_kv_pool.writes == 0
    launches.keys.clear()
    for layer in model_runner.model.layers:
        for prompt_lens, prefix_lens in served_batches():
            for fused in (True, False):
                serve_prefill(model_runner, layer, prompt_lens, prefix_lens, fused)
    served = set(launches.keys)
    assert served <= warmed and len(served) == 3


def test_the_pass_hands_the_kernel_the_runners_own_buffers_and_a_prefills_layouts(launches, compiles_here):
    model_runner = runner()
    tw.warm(model_runner)
    backend, pool = model_runner.attn_backend, model_runner.attn_backend.token_to_kv_pool
    seen = set()
    for _, a in launches.args:
        bs, layer = a["compact_batch_size"], next(i for i in range(2) if a["K_Buffer"] is pool.k[i])
        seen.add((layer, bs, a["stride_qbs"]))
        assert a["V_Buffer"] is pool.v[layer] and a["qo_indptr"].data_ptr() == backend.qo_indptr.data_ptr()
        assert a["qo_indptr"].shape == (bs + 1,) and a["kv_indptr"].data_ptr() == backend.kv_indptr.data_ptr()
        assert a["Q_Extend"].shape == (bs * tw.TOKENS, 9, 64) and a["Q_Extend"].dtype == torch.bfloat16
        assert a["K_Extend"].is_contiguous() and a["K_Extend"].shape == (bs * tw.TOKENS, 3, 64)
        assert a["O_Extend"].is_contiguous() and a["kv_indices"].numel() == 0
        assert a["mask_ptr"] is None and a["mask_indptr"] is None and a["sink_ptr"] is None and a["LSE_Extend"] is None
        assert a["IS_CAUSAL"] and not a["USE_CUSTOM_MASK"] and a["SLIDING_WINDOW_SIZE"] == -1 and a["PAGE_SIZE"] == 1
        assert a["sm_scale"] == 64**-0.5 and a["kv_group_num"] == 3
    # q a view of the fused qkv output (row stride (9 + 2 * 3) * 64) and a tensor of its own (9 * 64)
    assert seen == {(layer, bs, s) for layer in range(2) for bs in tw.BATCHES for s in (960, 576)}


def test_sliding_window_and_non_causal_layers_are_left_and_counted(launches, compiles_here, caplog):
    model_runner = runner(layers=3)
    window = RadixAttention(9, 64, 0.125, num_kv_heads=3, layer_id=1, sliding_window_size=128)
    cross = RadixAttention(9, 64, 0.125, num_kv_heads=3, layer_id=2, is_cross_attention=True)
    model_runner.model = Model([model_runner.model.layers[0], window, cross])
    with caplog.at_level(logging.INFO):
        assert tw.warm(model_runner) is not None
    assert "1 layers (2 sliding-window or non-causal left to their first prefill)" in caplog.text
    pool = model_runner.attn_backend.token_to_kv_pool
    assert launches.args and all(a["K_Buffer"] is pool.k[0] for _, a in launches.args)


class FlashInferAttnBackend:  # stands in for another backend (its name is what the line shows)
    skip_prefill = False


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda r: setattr(r, "attn_backend", FlashInferAttnBackend()), "prefills on FlashInferAttnBackend, not"),
        (lambda r: setattr(r.attn_backend, "enable_deterministic", True), "runs deterministic inference"),
        (lambda r: setattr(r.attn_backend, "dcp_size", 2), "runs decode context parallelism"),
        (lambda r: setattr(r.attn_backend, "use_mla", True), "runs MLA"),
        (lambda r: setattr(r, "model", Model([])), "no causal full-attention layer among 0"),
        (lambda r: delattr(r, "model"), "AttributeError"),
    ],
)
def test_nothing_runs_where_the_prefill_takes_another_kernel(change, why, launches, compiles_here, caplog):
    model_runner = runner()
    change(model_runner)
    with caplog.at_level(logging.DEBUG, logger="sglang_lilicorr.serving.target_warmup"):
        assert tw.warm(model_runner) is None
    assert "target prefill warm-up skipped" in caplog.text and why in caplog.text
    assert not launches.keys


def test_on_a_cpu_the_pass_is_skipped_with_a_debug_line(launches, caplog):
    with caplog.at_level(logging.DEBUG, logger="sglang_lilicorr.fast_path.precompile"):
        assert tw.warm(runner()) is None
    assert "kernel pre-compilation skipped for LILICORR target prefill attention" in caplog.text
    assert "not a CUDA device" in caplog.text and not launches.keys


def test_a_failing_pass_warns_restores_the_metadata_and_does_not_raise(launches, compiles_here, caplog, monkeypatch):
    model_runner = runner()
    backend = model_runner.attn_backend
    backend.forward_metadata = "served"

    def broken(*args, **kwargs):
        raise RuntimeError("no such layout")

    monkeypatch.setattr(TritonAttnBackend, "forward_extend", broken)
    with caplog.at_level(logging.WARNING):
        assert tw.warm(model_runner) is None
    assert "RuntimeError: no such layout" in caplog.text and backend.forward_metadata == "served"


def test_the_worker_warms_the_target_prefill_after_its_attention_backends(monkeypatch):
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_lilicorr.serving import worker as w

    calls = []
    monkeypatch.setattr(DFlashWorkerV2, "init_attention_backends", lambda self: calls.append("dflash"))
    monkeypatch.setattr(w, "configure_verify_attention", lambda *a, **k: calls.append("verify"))
    monkeypatch.setattr(w, "warm_target_prefill", lambda runner: calls.append(("prefill", runner)))
    model_runner = types.SimpleNamespace(dtype=torch.bfloat16, attn_backend=None)
    worker = object.__new__(w.LiLiCorrWorker)
    worker.model_runner, worker.block_size = model_runner, 16
    worker.server_args = types.SimpleNamespace(max_running_requests=48)
    monkeypatch.setattr(w, "eager_batches_possible", lambda n: True)
    w.LiLiCorrWorker.init_attention_backends(worker)
    assert calls == ["dflash", "verify", ("prefill", model_runner)]


@pytest.mark.gpu
def test_no_served_prefill_compiles_after_the_pass_on_cuda():
    model_runner = runner(device="cuda")
    device = torch.cuda.current_device()
    assert tw.warm(model_runner) is not None
    kernel_cache = ea._fwd_kernel.device_caches[device][0]
    built = len(kernel_cache)
    for layer in model_runner.model.layers:
        for prompt_lens, prefix_lens in served_batches():
            for fused in (True, False):
                out = serve_prefill(model_runner, layer, prompt_lens, prefix_lens, fused)
    torch.cuda.synchronize()
    assert len(kernel_cache) == built and torch.isfinite(out).all()
