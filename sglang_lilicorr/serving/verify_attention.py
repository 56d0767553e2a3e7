"""The target's verify attention: SGLang's split-KV verify kernel on its Triton backend (it declines per call what it
cannot serve, falling back to the prefill kernel). LILICORR_VERIFY_ATTENTION: `auto`, `split-kv` or `extend`; set, it
also picks DFLASH servers' verify. `zero_scratch`: the kernel reads an empty split's scratch (0 x NaN is NaN)."""

from __future__ import annotations

import functools
import logging
import os

from . import ALGORITHM_NAME
from .draft_check import ServingConfigError, env_choice

ENV = "LILICORR_VERIFY_ATTENTION"
AUTO, SPLIT_KV, EXTEND = "auto", "split-kv", "extend"
CHOICES = (AUTO, SPLIT_KV, EXTEND)
SPLITKV_MAX_QUERY_HEADS = 16  # auto: split-KV up to this many query heads per GPU
DFLASH_INIT = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2.init_attention_backends"
CHOSEN = "lilicorr_verify_attention"  # a backend's attribute once configure has chosen for it: the setting

logger = logging.getLogger(__name__)


def choice() -> str:
    """LILICORR_VERIFY_ATTENTION, checked."""
    return env_choice(ENV, CHOICES, AUTO, "a verify attention")


def check_target_backend(backend: str) -> None:
    """Refuse an explicit LILICORR_VERIFY_ATTENTION on a target whose attention backend is not triton."""
    if backend == "triton" or ENV not in os.environ:
        return
    raise ServingConfigError(
        f"{ENV}={os.environ[ENV]!r} picks the target verify's kernel on SGLang's Triton attention backend, but the "
        f"target runs {backend}, which verifies with its own kernel: unset {ENV}, or serve with --attention-backend "
        "triton."
    )


def wanted(setting: str, query_heads: int) -> bool:
    """Whether `setting` asks for the split-KV kernel on a target with `query_heads` query heads per GPU."""
    return setting == SPLIT_KV or (setting == AUTO and query_heads <= SPLITKV_MAX_QUERY_HEADS)


def probe_lengths() -> list[int]:
    """One prefix length per split count the kernel picks for an eager verify (from the batch's mean prefix)."""
    from sglang.kernels.ops.attention.verify_splitkv import choose_n_splits

    first = {}
    for n in [1] + [2**k for k in range(1, 16)]:
        first.setdefault(choose_n_splits(n), n)
    return sorted(first.values())


def warm(backend, block_size: int, dtype, lengths: list[int]) -> bool:
    """Run the split-KV verify once per prefix length on a one-request block of zeros -> False where it declines."""
    import torch

    pool = backend.token_to_kv_pool
    k_buffer, v_buffer = pool.get_key_buffer(pool.start_layer), pool.get_value_buffer(pool.start_layer)
    device, head_dim = k_buffer.device, int(k_buffer.shape[-1])
    q = torch.zeros(block_size, backend.num_head, head_dim, dtype=dtype, device=device)
    k = torch.zeros(block_size, backend.num_kv_head, head_dim, dtype=dtype, device=device)
    v = torch.zeros(block_size, backend.num_kv_head, int(v_buffer.shape[-1]), dtype=dtype, device=device)
    qo_indptr = torch.tensor([0, block_size], dtype=torch.int32, device=device)
    for length in lengths:
        o = torch.zeros(block_size, backend.num_head, int(v_buffer.shape[-1]), dtype=dtype, device=device)
        kv_indptr = torch.tensor([0, length], dtype=torch.int32, device=device)
        kv_indices = torch.zeros(length, dtype=torch.int64, device=device)
        kv_args = (k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices)
        args = (q, k, v, o, *kv_args, None, True, None, block_size, 1.0, 1.0, head_dim**-0.5)
        if not backend.verify_splitkv_fwd(*args, max_bs=backend.req_to_token_pool.size):
            return False
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return True


def zero_scratch() -> None:
    """Make SGLang's split-KV verify scratch buffers start at zero (module docstring). Idempotent."""
    from sglang.kernels.ops.attention.verify_splitkv import VerifySplitKV

    alloc = VerifySplitKV._alloc
    if getattr(alloc, "lilicorr_zeroed", False):
        return

    @functools.wraps(alloc)
    def zeroed(self, max_bs):
        alloc(self, max_bs)
        self.att_out.zero_()

    zeroed.lilicorr_zeroed = True
    VerifySplitKV._alloc = zeroed


def target_attention_backends(model_runner) -> list:
    """The target's attention backends: the runner's, its decode one, and the two a hybrid backend wraps."""
    found = []
    for backend in (getattr(model_runner, "attn_backend", None), getattr(model_runner, "decode_attn_backend", None)):
        for b in (backend, getattr(backend, "prefill_backend", None), getattr(backend, "decode_backend", None)):
            if b is not None and all(b is not f for f in found):
                found.append(b)
    return found


def configure(backends: list, block_size: int, dtype, setting: str | None = None, eager: bool = True) -> bool:
    """Switch the Triton `backends` to the split-KV verify where `setting` (default: the environment's) asks, warmed,
    with one log line -> whether it runs split-KV. Call before the verify graphs; a backend keeps its first choice."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    setting = choice() if setting is None else setting
    prefix = f"{ALGORITHM_NAME}: target verify attention"
    triton = [b for b in backends if isinstance(b, TritonAttnBackend) and getattr(b, "topk", 1) == 1]
    if triton and all(getattr(b, CHOSEN, None) for b in triton):
        return bool(triton[0].use_verify_splitkv)
    for backend in triton:
        setattr(backend, CHOSEN, setting)
    if not triton:
        names = ", ".join(sorted({type(b).__name__ for b in backends})) or "none found"
        explicit = os.environ.get(ENV)  # set, a LILICORR target off triton does not start (check_target_backend)
        logger.log(
            logging.WARNING if explicit is not None else logging.INFO,
            "%s: the target backend's own kernel (%s); %s picks between SGLang's Triton backend's kernels only%s.",
            prefix,
            names,
            ENV,
            "" if explicit is None else f", so {ENV}={explicit} is ignored here",
        )
        return False
    heads = int(triton[0].num_head)
    if not wanted(setting, heads):
        logger.info("%s: SGLang's prefill kernel (%s=%s, %d query heads per GPU).", prefix, ENV, setting, heads)
        return False
    zero_scratch()
    lengths = probe_lengths() if eager else probe_lengths()[:1]
    try:
        ready = all(warm(backend, block_size, dtype, lengths) for backend in triton)
    except Exception as e:  # a kernel that cannot build or run here: the verify keeps SGLang's prefill kernel
        logger.warning(
            "%s: SGLang's prefill kernel; its split-KV verify kernel failed its warm-up (%s: %s).",
            prefix,
            type(e).__name__,
            e,
        )
        return False
    if not ready:
        logger.info("%s: SGLang's prefill kernel; its split-KV verify kernel declines this target's attention.", prefix)
        return False
    for backend in triton:
        backend.use_verify_splitkv = True
    logger.info(
        "%s: SGLang's split-KV verify kernel, warmed at %d of its %d split counts (%s; %s=%s, %d query heads "
        "per GPU; %s=%s runs SGLang's prefill kernel).",
        prefix,
        len(lengths),
        len(probe_lengths()),
        "eager verifies can occur" if eager else "every verify batch within the graphs",
        ENV,
        setting,
        heads,
        ENV,
        EXTEND,
    )
    return True


def after_dflash_init(result, worker, *args, **kwargs) -> None:
    """SGLang AFTER hook on DFLASH_INIT: a DFLASH worker's verify attention by the environment's setting."""
    from .graphs import eager_batches_possible

    runner, eager = worker.model_runner, eager_batches_possible(worker.server_args.max_running_requests)
    configure(target_attention_backends(runner), int(worker.block_size), runner.dtype, eager=eager)
