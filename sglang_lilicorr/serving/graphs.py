"""The batch sizes SGLang captures CUDA graphs for, and whether a batch can run outside them (eagerly)."""

from __future__ import annotations


def graph_batch_sizes() -> list[int]:
    """The batch sizes SGLang captures draft (and decode and target-verify) CUDA graphs for."""
    from sglang.srt.runtime_context import get_exec

    return [int(b) for b in (get_exec().graph.cuda_graph_config.decode.bs or []) if int(b) > 0]


def eager_batches_possible(max_running_requests: int | None) -> bool:
    """Whether a forward pass can run outside the captured graphs: graphs off, or a batch above the largest."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec

    sizes = graph_batch_sizes()
    if get_exec().graph.cuda_graph_config.decode.backend == Backend.DISABLED or not sizes:
        return True
    return max_running_requests is None or int(max_running_requests) > max(sizes)
