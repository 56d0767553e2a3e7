"""The target's prefill attention kernel, compiled at start-up for every batch-size class a served prefill can meet.

SGLang's Triton attention backend runs the target's prefill (an extend) through `extend_attention_fwd`, whose
`_fwd_kernel` takes the number of prompts prefilled together as a plain integer argument. Triton keys an integer by
its class (1, a multiple of 16, any other), so batches of 1 (SGLang's warm-up request), of 16 or 32, and of any other
size are three binaries, each compiled (1.1-1.6 s on an H200) when the first batch of its class arrives, after SGLang
has started serving. Nothing else in that launch depends on the batch: the grid (from the prompts' lengths) is no part
of the key, and the tensors' dtypes, strides and 16-byte alignment do not change with it.

`warm` runs the backend's own `forward_extend` (SGLang's code builds the launch) on each full-attention layer of the
target at BATCHES, inside a compile-only pass (fast_path/precompile.py: each launch computes its key and compiles,
none runs). Its inputs are those of a prefill: the layer itself (heads, head sizes, scale, logit cap), the KV pool's
buffers of that layer, the backend's own index buffers (`qo_indptr`, `kv_indptr`, their first bs + 1 rows), no custom
mask, and q/k/v in both layouts a model passes: views of one fused qkv output (Llama, Qwen2: q's row stride is the
qkv width) and tensors of their own (models that norm q and k). The KV cache is not written.

Left to their first prefill, by what SGLang runs instead: a backend in deterministic, decode-context-parallel, MLA or
diffusion mode; sliding-window, cross- and non-causal layers (each such layer is counted in the log line). A model
that passes attention sinks or a score_mod to its attention keys differently from this pass: its variants still
compile at their first prefill.
"""

from __future__ import annotations

import logging
import types

import torch

from ..fast_path.precompile import CompileReport, precompile
from . import ALGORITHM_NAME
from .verify_attention import target_attention_backends

BATCHES = (1, 2, 16)  # one batch size per class Triton keys an integer by: 1, any other, a multiple of 16
TOKENS = 2  # query tokens per prompt: more than one, as in a prefill, so k and v are copied (k.contiguous())

logger = logging.getLogger(__name__)


def prefill_backends(model_runner) -> list:
    """The target's Triton attention backends that run prefills (SGLang's `TritonAttnBackend`, not skip_prefill)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return [
        b
        for b in target_attention_backends(model_runner)
        if isinstance(b, TritonAttnBackend) and not getattr(b, "skip_prefill", True)
    ]


def other_kernel(backend) -> str | None:
    """Why a prefill on this Triton backend runs a kernel other than `_fwd_kernel`'s plain launch (None: it does
    not)."""
    for attribute, mode in (
        ("enable_deterministic", "deterministic inference"),
        ("use_mla", "MLA"),
        ("use_dense_fp8_chunked_prefill", "dense FP8 prefill"),
    ):
        if getattr(backend, attribute, False):
            return mode
    if getattr(backend, "dcp_size", 1) > 1:
        return "decode context parallelism"
    if getattr(backend, "dllm_attention", None) is not None:
        return "diffusion attention"
    return None


def plain_layer(layer) -> bool:
    """A causal decoder self-attention layer without a sliding window: the plain launch, as `warm` builds it."""
    from sglang.srt.layers.radix_attention import AttentionType

    window = getattr(layer, "sliding_window_size", -1)
    return (
        layer.attn_type == AttentionType.DECODER and not layer.is_cross_attention and (window is None or window <= -1)
    )


def prefill_inputs(layer, tokens: int, dtype, device, fused: bool):
    """q [tokens, Hq * Dqk], k [tokens, Hk, Dqk], v [tokens, Hv, Dv] as RadixAttention hands them to the backend: views
    of one fused qkv output (`fused`) or tensors of their own. Uninitialized: nothing is launched."""
    widths = [
        layer.tp_q_head_num * layer.qk_head_dim,
        layer.tp_k_head_num * layer.qk_head_dim,
        layer.tp_v_head_num * layer.v_head_dim,
    ]
    if fused:
        q, k, v = torch.empty((tokens, sum(widths)), dtype=dtype, device=device).split(widths, dim=-1)
    else:
        q, k, v = (torch.empty((tokens, w), dtype=dtype, device=device) for w in widths)
    return q, k.view(-1, layer.tp_k_head_num, layer.qk_head_dim), v.view(-1, layer.tp_v_head_num, layer.v_head_dim)


def extend(backend, layer, batch: int, dtype, fused: bool) -> None:
    """The backend's forward_extend of one layer for a prefill of `batch` prompts with no cached prefix, KV not saved;
    the backend's forward_metadata is restored afterwards."""
    from sglang.srt.layers.attention.triton_backend import ForwardMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    device = backend.qo_indptr.device
    unused = ("attn_logits", "attn_lse", "num_kv_splits", "custom_mask", "mask_indptr")  # a prefill's: no mask
    unused += ("window_kv_indptr", "window_kv_indices", "window_num_kv_splits", "window_kv_offsets")  # no window
    metadata = ForwardMetadata(
        **dict.fromkeys(unused),
        max_extend_len=TOKENS,
        kv_indptr=backend.kv_indptr[: batch + 1],
        kv_indices=torch.empty(0, dtype=torch.int64, device=device),
        qo_indptr=backend.qo_indptr[: batch + 1],
    )
    forward_batch = types.SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        extend_seq_lens_cpu=[TOKENS] * batch,
        mha_one_shot=False,
        attn_attend_prefix_cache=None,
    )
    q, k, v = prefill_inputs(layer, batch * TOKENS, dtype, device, fused)
    saved, backend.forward_metadata = backend.forward_metadata, metadata
    try:
        backend.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=False)
    finally:
        backend.forward_metadata = saved


def warm(model_runner) -> CompileReport | None:
    """Compile the target prefill's `_fwd_kernel` at every batch class (module docstring) on the runner's Triton
    backends and full-attention layers, where the target prefills with it on CUDA: the pass's report (one log line,
    fast_path/precompile.py), or None where nothing ran (one debug line saying why). Never raises."""
    try:
        from sglang.srt.layers.radix_attention import RadixAttention

        backends = prefill_backends(model_runner)
        names = ", ".join(sorted({type(b).__name__ for b in target_attention_backends(model_runner)})) or "none"
        if not backends:
            logger.debug(
                "target prefill warm-up skipped: the target prefills on %s, not SGLang's Triton backend", names
            )
            return None
        others = {why for why in map(other_kernel, backends) if why is not None}
        if others:
            logger.debug("target prefill warm-up skipped: the Triton backend runs %s", ", ".join(sorted(others)))
            return None
        layers = [m for m in model_runner.model.modules() if isinstance(m, RadixAttention)]
        plain = [layer for layer in layers if plain_layer(layer)]
        if not plain:
            logger.debug("target prefill warm-up skipped: no causal full-attention layer among %d", len(layers))
            return None
        dtype = model_runner.dtype
    except Exception as error:  # noqa: BLE001 - the kernels still compile at their first prefill
        logger.debug("target prefill warm-up skipped: %s: %s", type(error).__name__, error)
        return None

    def run():
        for backend in backends:
            for layer in plain:
                for batch in BATCHES:
                    for fused in (True, False):
                        extend(backend, layer, batch, dtype, fused)

    left = len(layers) - len(plain)
    label = (
        f"{ALGORITHM_NAME} target prefill attention (SGLang's _fwd_kernel) at batches of {'/'.join(map(str, BATCHES))} "
        f"prompts, {len(plain)} layers"
        + (f" ({left} sliding-window or non-causal left to their first prefill)" if left else "")
    )
    return precompile(run, device=torch.device(model_runner.device), label=label)
