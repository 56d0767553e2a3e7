"""The target's Triton prefill kernel (`_fwd_kernel`, specialised by prompt-count class: 1, a multiple of 16, other)
compiled at start-up for each class, through the backend's own `forward_extend` on plain full-attention layers inside a
compile-only pass (fast_path/precompile.py); the KV cache is not written."""

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
    """Why a prefill on this Triton backend runs another kernel than `_fwd_kernel`'s plain launch (or None)."""
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
    """q, k, v as RadixAttention hands them over (views of one fused qkv, or not); uninitialized."""
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
    """The backend's forward_extend of one layer for `batch` prompts without a cached prefix, KV not saved."""
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
    """Compile the target prefill's `_fwd_kernel` at every batch class -> the pass's report, or None where nothing ran
    (one debug line why). Never raises."""
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
